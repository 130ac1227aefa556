"""EKS's shape on this machine: a Ray head that is a world apart from its worker. The head runs in a mount
namespace of its own (`unshare -m`, private propagation) with an empty tmpfs over the artifacts directory and
over the model cache, and HF_HUB_OFFLINE=1; it declares no CPUs and no NeuronCores, as KubeRay's head
(deploy/kuberay/rayservice.yaml). The worker sees the real artifacts and declares 2 NeuronCores.

On that cluster: the service is deployed as KubeRay deploys it (PUT /api/serve/applications/ to the head's
dashboard, ray/dashboard/modules/serve/serve_head.py), so its builder runs on the head; its config names
pretrained weights (the default `pretrained: webli`), the `neuron` backend, whose artifact holds the model, and
an API keys file, both where the worker alone sees them.
And the bulk job is submitted with `ray job submit`, so its driver runs on the head (ray/dashboard/modules/
job/job_manager.py _get_label_selector: the head, unless the entrypoint asks for resources). Both must serve
and embed on the worker, on the Neuron trace double (tests/doubles/torch_neuronx: plumbing, not Neuron).

Real `ray start` processes, each its own session, all on loopback with a private temp dir; ended by
their process groups (never `ray stop`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from siglip_serve.core.constants import LNC_ENV
from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from siglip_serve.models.neuron.manifest import MANIFEST_NAME
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.bounds import RUN_S, SETTLE_S, START_S, cluster_start, scaled
from tests.helpers import REPO, jpeg_bytes, neuronx_double, tiny_settings, worker_pythonpath

pytestmark = pytest.mark.own_cluster

MODEL = "tiny-siglip-checkpoint"  # takes weights (unlike tiny-siglip): the config's `pretrained` is real to it
IMAGES = 6
RAY = str(Path(sys.executable).with_name("ray"))


def _ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]


# Each node an address of its own on loopback, as each pod has its own IP. Not 127.0.0.1: Ray replaces
# "127.0.0.1" and "localhost" in a cluster address by the machine's outward IP before connecting
# (ray/_private/services.py resolve_ip_for_localhost), which would take the cluster off loopback.
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


def _node_args(temp: Path, ip: str) -> list[str]:
    node, objects, agent, agent_grpc, metrics, runtime_env = _ports(6)
    return ["--block", "--node-ip-address", ip, "--temp-dir", str(temp), "--node-manager-port", str(node),
            "--object-manager-port", str(objects), "--dashboard-agent-listen-port", str(agent),
            "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
            "--runtime-env-agent-port", str(runtime_env), "--disable-usage-stats"]


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.artifacts = root / "artifacts"
        self.cache = root / "hf"
        self.temp = Path(tempfile.mkdtemp(prefix="rha", dir="/tmp"))  # short: Ray's socket paths
        self.gcs, self.dashboard, self.serve = _ports(3)
        self.procs: list[subprocess.Popen[bytes]] = []
        # Every node gets one environment but for what the head lacks: the double stands in for the SDK
        # everywhere (one image for every pod, as on EKS), the model cache is in one place.
        self.env = {**os.environ, "PYTHONPATH": worker_pythonpath(), "HF_HOME": str(self.cache), LNC_ENV: "2",
                    "RAY_USAGE_STATS_ENABLED": "0",
                    # Ray turns token auth on for a new cluster by default, writing ~/.ray/auth_token, which
                    # every Ray on this machine would then share (ray/_private/authentication/
                    # authentication_token_setup.py): off, as this cluster listens on loopback only.
                    "RAY_AUTH_MODE": "disabled",
                    # Serve records its builder task's events (and so the node it ran on) only with this set;
                    # its controller, on the head, reads it (ray/serve/_private/constants.py).
                    "RAY_SERVE_ENABLE_TASK_EVENTS": "1"}
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (what `run` sets for its one-node Ray) would make the worker's
        # `ray start --address` refuse to join (ray/scripts/scripts.py).
        for key in ("RAY_ADDRESS", "HF_HUB_OFFLINE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
            self.env.pop(key, None)

    def start(self) -> None:
        for folder in (self.artifacts, self.cache):
            folder.mkdir(parents=True, exist_ok=True)
        (self.cache / "hub").mkdir(exist_ok=True)
        # The head: an empty tmpfs over the artifacts and the model cache, visible to it alone (a new mount
        # namespace with private propagation: nothing it mounts reaches this one).
        head = [RAY, "start", "--head", "--port", str(self.gcs), "--num-cpus", "0", "--include-dashboard", "true",
                "--dashboard-host", HEAD_IP, "--dashboard-port", str(self.dashboard), *_node_args(self.temp, HEAD_IP)]
        masked = (f"mount -t tmpfs none {self.artifacts} && mount -t tmpfs none {self.cache} && "
                  f"exec env HF_HUB_OFFLINE=1 \"$@\"")
        self._spawn(["unshare", "-m", "--propagation", "private", "sh", "-c", masked, "head", *head])
        try:
            self._wait(lambda: httpx.get(f"http://{HEAD_IP}:{self.dashboard}/api/version", timeout=2).is_success,
                       START_S, "the head's dashboard")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.logs()}") from None
        self._start_worker()

    def _start_worker(self, attempts: int = 3) -> None:
        """The worker node, started again where `ray start` exits before its node is up, as the kubelet restarts a
        worker pod's container that exited: a loaded machine can take longer than the 30 s Ray gives a new node
        to register with the GCS (ray/_private/node.py, `raylet_start_wait_time_s`), and `ray start` then exits."""
        for _ in range(attempts):
            worker = [RAY, "start", "--address", f"{HEAD_IP}:{self.gcs}", "--num-cpus", "3",
                      "--resources", json.dumps({"neuron_cores": 2}), *_node_args(self.temp, WORKER_IP)]
            proc, log = self._spawn(["unshare", "-m", "--propagation", "private", *worker])
            found, _, waited = poll(functools.partial(self._node_state, proc, log), bool, START_S)
            if found == "up":
                return
            if not found:
                raise TimeoutError(f"the worker node not up in {waited:.0f} s: {self.logs()}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what the failed start left behind
        raise RuntimeError(f"the worker node failed to start {attempts} times: {self.logs()}")

    @staticmethod
    def _node_state(proc: subprocess.Popen[bytes], log: Path) -> str:
        """Where `ray start` is: "up" once it printed so (ray/scripts/scripts.py start), "exited" if it exited
        first, else "" (still starting)."""
        if "Ray runtime started." in log.read_text(errors="replace"):
            return "up"
        return "exited" if proc.poll() is not None else ""

    def _spawn(self, command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        path = self.root / f"node-{len(self.procs)}.log"  # read when a node fails to start
        with open(path, "wb") as log:
            proc = subprocess.Popen(command, env=self.env, cwd=REPO, start_new_session=True, stdout=log,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc, path

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        def attempt() -> bool:
            try:
                return ready()
            except httpx.HTTPError:
                return False

        _, up, waited = poll(attempt, bool, timeout_s)
        if not up:
            raise TimeoutError(f"{what} not up in {waited:.0f} s")

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-2000:] for path in sorted(self.root.glob("node-*.log")))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("head-apart")
    cluster = Cluster(root)
    try:
        with cluster_start("the head-apart cluster"):
            cluster.start()
        with neuronx_double():
            artifact = compile_artifact(tiny_settings(model=MODEL, random_weights=True), CompileOptions(lnc=2),
                                        cluster.artifacts).artifact_dir
        # Labelled as compiled from the config's pretrained weights, as a real deploy's artifact is: the double
        # compiled seeded ones (nothing here may fetch weights), and the bulk job's encoders refuse an artifact
        # of other weights than the job names its shards for (bulk/stages.py check_artifact_weights).
        manifest = artifact / MANIFEST_NAME
        recorded = json.loads(manifest.read_text())
        recorded["weights"]["source"] = "pretrained:webli"
        manifest.write_text(json.dumps(recorded))
        cluster.artifact = artifact  # type: ignore[attr-defined]
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(900)  # two nodes' start, the service's, then the bulk job's
def test_a_head_without_artifacts_weights_or_hub_deploys_the_service_and_runs_the_bulk_job(
        cluster: Cluster, tmp_path: Path) -> None:
    artifact = cluster.artifact  # type: ignore[attr-defined]
    dashboard = f"http://{HEAD_IP}:{cluster.dashboard}"
    # The keys file beside the artifact: mounted on the worker, an empty tmpfs on the head.
    keys = cluster.artifacts / "keys.toml"
    keys.write_text('[[keys]]\nname = "apart"\nkey = "apart-key"\nlane = "interactive"\n')
    app = {"name": "apart", "route_prefix": "/", "import_path": "siglip_serve.serve.app:build_app",
           "args": {"model": MODEL, "backend": "neuron", "artifact_dir": str(artifact), "buckets": [1, 2],
                    "replicas": 1, "encoder_num_cpus": 0.5, "ingress_num_cpus": 0.25, "torch_threads": 1,
                    "text_replicas": 0, "batch_wait_timeout_s": 0.01, "cluster_grows": True,
                    "api_keys_file": str(keys)}}
    schema = {"proxy_location": "HeadOnly", "http_options": {"host": HEAD_IP, "port": cluster.serve},
              "applications": [app]}
    with httpx.Client(base_url=f"http://{HEAD_IP}:{cluster.serve}", timeout=30,
                      headers={"Authorization": "Bearer apart-key"}) as client:
        status: dict[str, object] = {}

        def readiness() -> int | str | None:
            """/readyz's status; "failed" once Serve says DEPLOY_FAILED; None while nothing answers."""
            status.update(httpx.get(f"{dashboard}/api/serve/applications/", timeout=30).json()["applications"])
            if status.get("apart", {}).get("status") == "DEPLOY_FAILED":  # type: ignore[attr-defined]
                return "failed"
            try:
                # Short tries: until the ingress runs, Serve's proxy holds a request rather than answering.
                return client.get("/readyz", timeout=3).status_code
            except httpx.HTTPError:
                return None

        with cluster_start("the head-apart service"):
            assert httpx.put(f"{dashboard}/api/serve/applications/", json=schema, timeout=60).status_code == 200
            ready, _, _ = poll(readiness, lambda ready: ready in (200, "failed"), START_S, interval_s=2)
        assert ready == 200, json.dumps(status)[-3000:] + cluster.logs()
        answer = client.post("/v1/embeddings/image", content=jpeg_bytes(np.full((64, 64, 3), 99, dtype=np.uint8)),
                             headers={"Content-Type": "image/jpeg"})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["data"][0]["embedding"]) > 0
        assert client.get("/v1/models", headers={"Authorization": "Bearer other"}).status_code == 401
        (replica,) = client.get("/v1/models").json()["data"][0]["replicas"]
    assert replica["backend"] == "neuron" and replica["manifest"]["versions"]["torch_neuronx"] == "0.0.0+test-double"
    # Serve's builder ran on the head, where the artifact, the weights and the keys file are absent: its task
    # is unpinned (num_cpus=0, ray/serve/_private/application_state.py build_serve_application), so where it
    # ran is read from Ray's task records, not assumed.
    from ray.util.state import list_nodes, list_tasks

    nodes = {n.node_id: n.node_ip for n in list_nodes(address=dashboard, detail=True)}
    builds, recorded, _ = poll(lambda: list_tasks(address=dashboard, filters=[("name", "=", "build_serve_application")],
                                                  detail=True), bool, SETTLE_S)
    assert recorded, "no record of Serve's build task"
    assert {nodes.get(task.node_id) for task in builds} == {HEAD_IP}, (builds, nodes)

    # The job, once the service holds its share of the worker (Ray Data would otherwise take every CPU the
    # ingress waits for): its driver runs on the head, where the artifact directory is an empty tmpfs
    # (checked first).
    images = tmp_path / "images"
    images.mkdir()
    for i in range(IMAGES):
        (images / f"{i}.jpg").write_bytes(jpeg_bytes(np.full((48, 48, 3), 40 * i, dtype=np.uint8)))
    out = tmp_path / "out"
    embed = [sys.executable, "-m", "siglip_serve", "embed", str(images), "-o", str(out), "--address", "auto",
             "--backend", "neuron", "--model", MODEL, "--artifact-dir", str(artifact), "--set", "buckets=1,2",
             "--encoders", "1", "--decode-workers", "1"]
    entrypoint = (f"test ! -e {artifact}/manifest.json && test \"$HF_HUB_OFFLINE\" = 1 && "
                  + " ".join(embed))
    submitted = subprocess.run([RAY, "job", "submit", "--address", dashboard, "--no-wait", "--submission-id",
                                "apart-embed", "--", "sh", "-c", entrypoint],
                               env=cluster.env, capture_output=True, text=True, timeout=scaled(120))
    assert submitted.returncode == 0, submitted.stderr[-2000:]

    from ray.job_submission import JobStatus, JobSubmissionClient

    jobs = JobSubmissionClient(dashboard)
    _, ended, _ = poll(lambda: jobs.get_job_status("apart-embed"),
                       lambda state: state in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}, RUN_S,
                       interval_s=2)
    assert ended, jobs.get_job_logs("apart-embed")[-3000:]
    logs = jobs.get_job_logs("apart-embed")
    assert jobs.get_job_status("apart-embed") == JobStatus.SUCCEEDED, logs[-3000:]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["embedded"] == IMAGES and summary["errors"] == 0 and summary["backend"] == "neuron", summary
