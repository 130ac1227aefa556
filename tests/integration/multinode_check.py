"""Two Ray nodes on this machine, each declaring 2 logical NeuronCores; the real app with 4 encoder
replicas (tiny-siglip, cpu backend, one neuron_core each); prints /v1/models and the nodes as JSON.

Run by tests/integration/test_multinode.py in its own process: the test session's in-process Ray (conftest)
cannot host a second cluster. Everything binds to 127.0.0.1. Set RAY_TMPDIR to a private
directory, so this cluster's address file never redirects anyone else's `ray.init()` to it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

# Without this, Ray turns "127.0.0.1" in a cluster address into the machine's outward IP before
# connecting (services.resolve_ip_for_localhost), and the driver looks for the GCS where none
# listens. Turned off, it resolves localhost to loopback: the whole cluster stays on 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
DEADLINE_S = 180
REPORT_MARKER = "MULTINODE-REPORT"

# Two of each: enough to show both nodes used and no core shared (every replica is a process of its own
# that imports torch: on a 2-core CI machine each costs seconds).
CORES_PER_NODE = 2
REPLICAS = 2 * CORES_PER_NODE


def main() -> int:
    import httpx
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from siglip_serve.launcher.preflight import free_port
    from siglip_serve.serve.app import build_app

    logging.basicConfig(level=logging.WARNING)

    def too_slow(*_: object) -> None:
        raise TimeoutError(f"multi-node check took over {DEADLINE_S} s")

    signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(DEADLINE_S)
    if not os.environ.get("RAY_TMPDIR"):
        print("set RAY_TMPDIR to a private directory first", file=sys.stderr)
        return 2
    node = {"num_cpus": 3, "resources": {"neuron_cores": CORES_PER_NODE}, "node_ip_address": "127.0.0.1"}
    began = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 namespace="siglip-serve-multinode")
        port = free_port()
        # One proxy: both "nodes" share 127.0.0.1, so a proxy per node would fight over the port.
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        app = build_app({"model": "tiny-siglip", "backend": "cpu", "replicas": REPLICAS,
                         "neuron_cores_per_replica": 1, "encoder_num_cpus": 0.25, "ingress_num_cpus": 0.25,
                         "torch_threads": 1, "text_replicas": 0})
        serve.run(app, name="multinode", route_prefix="/")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while client.get("/readyz").status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("the app never became ready")
                time.sleep(0.5)
            models = client.get("/v1/models").json()
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        # Ray may print its own lines to stdout too; the report is the line after the marker.
        print(REPORT_MARKER, json.dumps({"models": models, "nodes": nodes,
                                          "seconds": round(time.monotonic() - began, 1)}), flush=True)
        return 0
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
