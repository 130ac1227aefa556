"""A KubeRay-shaped Ray cluster on this machine, deployed to before its workers join; prints the report as JSON.

As a RayService starts: a head with no CPUs and no NeuronCores (deploy/kuberay/rayservice.yaml:
num-cpus "0"), KubeRay's RAY_CLUSTER_NAME in every Ray process's environment (KubeRay v1.7.0,
ray-operator/controllers/ray/common/pod.go setContainerEnvVars), and the Serve config submitted once the
head is up, as the dashboard does for KubeRay's PUT /api/serve/applications/ (ray/dashboard/modules/
serve/serve_head.py: ServeControllerClient.deploy_apps), so Serve runs the real builder
(siglip_serve.serve.app:build_app) as its own task on the head. Then two workers join, each declaring
2 logical NeuronCores; the app (tiny-siglip, cpu backend, 4 encoder replicas of one neuron_core each)
must become ready on them and answer every request.

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
from typing import Any

from tests.bounds import RUN_S, SETTLE_S, START_S, scaled

DEADLINE_S = int(RUN_S)
REPORT_MARKER = "MULTINODE-REPORT"
APP = "multinode"

# Two of each: enough to show both nodes used and no core shared (every replica is a process of its own
# that imports torch: on a 2-core CI machine each costs seconds).
CORES_PER_NODE = 2
WORKERS = 2
REPLICAS = WORKERS * CORES_PER_NODE
REQUESTS = 8
ARGS = {"model": "tiny-siglip", "backend": "cpu", "replicas": REPLICAS, "neuron_cores_per_replica": 1,
        "encoder_num_cpus": 0.25, "ingress_num_cpus": 0.25, "torch_threads": 1, "text_replicas": 0}


def _state(status: Any) -> str:
    """'RUNNING' from Serve's ApplicationStatus (an Enum, whose str() is 'ApplicationStatus.RUNNING')."""
    return str(getattr(status, "value", status))


def _built_status(serve: Any, timeout_s: float) -> dict[str, Any]:
    """The app's status once Serve's build task has finished: deployments listed, or DEPLOY_FAILED."""
    from siglip_serve.core.poll import poll

    app, built, _ = poll(lambda: serve.status().applications.get(APP),
                         lambda app: app is not None and (app.deployments or _state(app.status) == "DEPLOY_FAILED"),
                         timeout_s, interval_s=0.5)
    if not built:
        raise TimeoutError(f"the builder did not finish in {timeout_s} s: {app}")
    return {"status": _state(app.status), "message": app.message, "deployments": sorted(app.deployments)}


def _workers_alive(ray: Any) -> int:
    return sum(1 for node in ray.nodes() if node["Alive"] and node["Resources"].get("neuron_cores"))


def _add_worker(cluster: Any, worker: dict[str, Any], poll: Any, attempts: int = 3) -> None:
    """One more worker node, as the kubelet restarts a worker pod that did not come up: Ray gives a new node 30 s
    to register with the GCS (ray/_private/node.py `raylet_start_wait_time_s`, a literal), which a loaded machine
    can overrun. A raylet that overran may still register: it is waited for before another is started, so the
    cluster never gets a third worker."""
    import ray

    before = _workers_alive(ray)
    for attempt in range(attempts):
        try:
            cluster.add_node(**worker)
            return
        except Exception as exc:  # Ray raises a bare Exception for it
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise
        _, late, _ = poll(lambda: _workers_alive(ray), lambda alive: alive > before, SETTLE_S, interval_s=1)
        if late:
            return


def main() -> int:
    # Before ray is imported, and only in this process (test_multinode imports this module for its
    # constants, and pytest's other clusters must not inherit it): without it, Ray turns "127.0.0.1" in a
    # cluster address into the machine's outward IP before connecting (services.resolve_ip_for_localhost),
    # and the driver looks for the GCS where none listens. Turned off, it resolves localhost to loopback.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import httpx
    import numpy as np
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    from siglip_serve.core.poll import poll
    from siglip_serve.launcher.preflight import free_port
    from tests.helpers import jpeg_bytes, wait_until_ready

    logging.basicConfig(level=logging.WARNING)

    def too_slow(*_: object) -> None:
        raise TimeoutError(f"multi-node check took over {DEADLINE_S} s")

    signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(DEADLINE_S)
    if not os.environ.get("RAY_TMPDIR"):
        print("set RAY_TMPDIR to a private directory first", file=sys.stderr)
        return 2
    # Before the head starts: its raylet, and so the worker that runs Serve's build task, inherit it.
    os.environ["RAY_CLUSTER_NAME"] = APP
    worker = {"num_cpus": 3, "resources": {"neuron_cores": CORES_PER_NODE}, "node_ip_address": "127.0.0.1"}
    began = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 namespace="siglip-serve-multinode")
        head_resources = dict(ray.cluster_resources())
        port = free_port()
        # One proxy: all "nodes" share 127.0.0.1, so a proxy per node would fight over the port.
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        _get_global_client().deploy_apps(ServeDeploySchema.model_validate(
            {"applications": [{"name": APP, "route_prefix": "/", "import_path": "siglip_serve.serve.app:build_app",
                               "args": ARGS}]}))
        built = _built_status(serve, scaled(60))
        if built["status"] == "DEPLOY_FAILED":
            print(f"refused before the workers joined: {built['message']}", file=sys.stderr)
            return 1
        for _ in range(WORKERS):
            _add_worker(cluster, worker, poll)
        joined = time.monotonic()
        image = jpeg_bytes(np.full((64, 64, 3), 128, dtype=np.uint8))
        # Until the ingress runs, Serve's proxy holds a request rather than answering it: short tries.
        wait_until_ready(f"http://127.0.0.1:{port}/readyz", START_S,
                         detail=lambda: str(serve.status().applications.get(APP)))
        ready_after_join_s = time.monotonic() - joined
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            # At once, while Serve may still be placing the other replicas.
            answers = [client.post("/v1/embeddings/image", content=image, headers={"Content-Type": "image/jpeg"})
                       for _ in range(REQUESTS)]
            # Every replica placed (not only /readyz's min_ready_replicas) before /v1/models is read.
            _, running, _ = poll(lambda: _state(serve.status().applications[APP].status),
                                 lambda state: state == "RUNNING", SETTLE_S, interval_s=0.5)
            if not running:
                raise TimeoutError(f"not every replica runs: {serve.status().applications.get(APP)}")
            models = client.get("/v1/models").json()
        statuses = [answer.status_code for answer in answers]
        dims = sorted({len(answer.json()["data"][0]["embedding"]) for answer in answers if answer.status_code == 200})
        workers = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("neuron_cores"))
        # Ray may print its own lines to stdout too; the report is the line after the marker.
        print(REPORT_MARKER, json.dumps({
            "head_resources": head_resources, "built": built, "models": models, "nodes": workers,
            "statuses": statuses, "dims": dims, "ready_after_join_s": round(ready_after_join_s, 1),
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
