"""The towers' deployments (image and text) and their replicas: load, warm up, batch, publish."""
