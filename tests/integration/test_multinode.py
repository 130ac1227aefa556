"""Multi-node placement, deployed before the workers join: 4 encoder replicas over two Ray worker nodes of
2 logical NeuronCores each, every replica on its own (node, core), on a KubeRay-shaped cluster whose head
has no CPUs and got the Serve config before any worker registered. Runs
tests/integration/multinode_check.py in a subprocess with its own Ray."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from tests.bounds import RUN_S, cluster_start
from tests.helpers import REPO
from tests.integration.multinode_check import CORES_PER_NODE, REPLICAS, REPORT_MARKER, REQUESTS

pytestmark = pytest.mark.own_cluster


def test_deployed_before_the_workers_join_then_replicas_spread_over_them_each_on_its_own_core() -> None:
    # A short private temp dir: Ray's socket paths must stay short, and its address file must not
    # send anyone else's ray.init() to this cluster.
    ray_tmp = tempfile.mkdtemp(prefix="rmn", dir="/tmp")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    # Its own session, so that whatever it leaves running (raylets, agents) can be ended as a group.
    check = REPO / "tests" / "integration" / "multinode_check.py"
    # Three nodes start one after another inside it: the whole run holds the cluster-start lock.
    with cluster_start("the multi-node check"):
        proc = subprocess.Popen([sys.executable, str(check)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=RUN_S + 30)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, stderr[-4000:]
    (line,) = [line for line in stdout.splitlines() if line.startswith(REPORT_MARKER)]
    report = json.loads(line[len(REPORT_MARKER):])
    # The head held nothing a replica needs, and the builder let the app deploy on it anyway.
    assert report["head_resources"].get("CPU", 0) == 0 and "neuron_cores" not in report["head_resources"]
    assert report["built"]["status"] == "DEPLOYING", report["built"]
    assert report["built"]["deployments"] == ["Encoder", "Ingress"], report["built"]
    (model,) = report["models"]["data"]
    replicas = model["replicas"]
    assert model["replicas_expected"] == REPLICAS and len(replicas) == REPLICAS
    assert len(report["nodes"]) == 2
    assert {r["node_id"] for r in replicas} == set(report["nodes"])
    placements = [(r["node_id"], r["neuron_rt_visible_cores"]) for r in replicas]
    assert all(core in {str(c) for c in range(CORES_PER_NODE)} for _, core in placements), placements
    assert len(set(placements)) == REPLICAS, placements
    # Every request answered, each with one embedding of the model's width.
    assert report["statuses"] == [200] * REQUESTS
    assert len(report["dims"]) == 1
