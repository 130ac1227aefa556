"""The ingress's deployment and what its replicas run, from the HTTP app to the links to the towers; it
reaches the towers only through Serve handles and the registry (shared/), never their modules."""
