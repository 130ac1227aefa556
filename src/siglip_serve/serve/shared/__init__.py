"""What the ingress and the towers' replicas share across a Serve handle, neither importing the other: the
registry, the metrics, the traces, the batcher, and what every replica process sets up (logging, gRPC bind)."""
