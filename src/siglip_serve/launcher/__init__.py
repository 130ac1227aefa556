"""Starting the service on a host: `siglip-serve run` (checks before Ray starts, the local Ray, the
HAProxy front end, the session that takes signals, start-up progress) and `siglip-serve trn2-check`.
The Ray Serve application it starts is `siglip_serve.serve`, which knows nothing of this package."""
