"""Where a replica's inter-deployment gRPC server listens: the node's Ray address, not every interface.

Ray Serve 2.60 starts one gRPC server in every replica for calls between deployments (the ingress's
calls to the encoders in Serve's throughput mode) and binds it to `[::]:0`, every interface
(ray/serve/_private/replica.py, `_on_initialized`: `add_port_to_grpc_server(self._server, "[::]:0")`),
with no setting to change it. It takes no API key, so on a host with other interfaces anyone who
reaches the host could drive the encoders. Callers connect to the replica's node IP and that port
(ray/serve/_private/deployment_state.py: the replica's RunningReplicaInfo carries `node_ip` and
`port`), so listening on the node's Ray address alone changes nothing for them: on `siglip-serve run`'s
local Ray that is 127.0.0.1, on a cluster the node's own address. The least bad place to set it is
the replica's own process, before Serve starts the server: Serve constructs the user's class (our
replica's `__init__`, which calls `bind_to_node_address`) and only then calls `_on_initialized`,
which looks `add_port_to_grpc_server` up in its module; we wrap that name there. Should a Ray
release change this, tests/integration/test_shutdown.py's socket listing fails.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("siglip_serve.replica")

ANY_INTERFACE = "[::]:0"


def node_address(host: str) -> str:
    """`host`, port 0, as gRPC writes an address (an IPv6 address in brackets)."""
    return f"[{host}]:0" if ":" in host else f"{host}:0"


def bind_to_node_address() -> None:
    """In a replica's process: Serve's inter-deployment gRPC server listens on the node's Ray address."""
    import ray

    if not ray.is_initialized():  # a unit test's stand-in, not a replica
        return
    from ray.serve._private import replica as serve_replica

    original = serve_replica.add_port_to_grpc_server
    if getattr(original, "siglip_node_address", None):
        return
    host = ray.util.get_node_ip_address()

    def add_port(server: Any, address: str) -> int:
        return int(original(server, node_address(host) if address == ANY_INTERFACE else address))

    add_port.siglip_node_address = host  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = add_port
    log.debug("inter-deployment gRPC server will listen on %s", node_address(host))
