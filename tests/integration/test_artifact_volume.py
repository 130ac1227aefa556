"""Under KubeRay a served replica whose artifact is not yet whole on its volume says so (in /readyz, naming
the volume, not `compile`) and waits; once the rest of the artifact arrives the service is ready by itself,
with no change to its config and no failed start counted. It runs under the Serve environment both KubeRay
manifests set (RAY_SERVE_THROUGHPUT_OPTIMIZED=1: user code on the replica actor's own event loop), where a
waiting replica must still answer the controller's calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import ray

from siglip_serve.core.poll import poll
from siglip_serve.models.neuron.manifest import MANIFEST_NAME, bucket_file
from siglip_serve.models.neuron.sdk import LNC_ENV
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.bounds import START_S
from tests.helpers import ServeCluster, delete_apps, deploy, neuronx_double, tiny_settings, worker_pythonpath

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-siglip compiled through the trace double (tests/doubles/torch_neuronx) for LNC 2."""
    with neuronx_double():
        root = tmp_path_factory.mktemp("compiled")
        return compile_artifact(tiny_settings(), CompileOptions(lnc=2), root).artifact_dir


def _readyz(client: httpx.Client) -> httpx.Response | None:
    try:
        return client.get("/readyz")
    except httpx.HTTPError:
        return None


def _encoder_actor() -> ray.actor.ActorHandle:
    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
               if a["name"].startswith("SERVE_REPLICA::volume#Encoder#")]
    return ray.get_actor(name, namespace="serve")


def test_a_replica_waits_for_half_an_artifact_and_serves_once_the_rest_arrives(
        serve_cluster: ServeCluster, artifact: Path, photo_jpegs: list[bytes], tmp_path: Path) -> None:
    from ray import serve

    # `cp -r` straight into the linked name, stopped halfway: the manifest and bucket 1, not bucket 2.
    link = tmp_path / "artifacts" / "so400m-lnc2"
    link.mkdir(parents=True)
    for name in (MANIFEST_NAME, bucket_file(1)):
        shutil.copy2(artifact / name, link / name)
    deploy("volume", "/volume", wait=False, backend="neuron", artifact_dir=str(link), buckets=[1, 2], replicas=1,
           neuron_cores_per_replica=0, encoder_num_cpus=0.25, ingress_num_cpus=0.25,
           env_vars={"PYTHONPATH": worker_pythonpath(), LNC_ENV: "2", "KUBERAY_GEN_RAY_START_CMD": "ray start --block",
                     "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
    try:
        with httpx.Client(base_url=f"{serve_cluster.base_url}/volume", timeout=TIMEOUT) as client:
            ready, said, _ = poll(lambda: _readyz(client), lambda r: r is not None and "artifact volume" in r.text,
                                  START_S, 0.5)
            assert said and ready is not None and ready.status_code == 503, ready.text if ready else "no answer"
            assert f"artifact directory {link} is incomplete on this pod (1 of the 2 files its manifest lists " \
                f"missing (first {bucket_file(2)})): finish populating the artifact volume" in ready.text \
                and "siglip-serve compile" not in ready.text, ready.text
            # The waiting replica's event loop is free: it answers a call as the controller's would be answered.
            assert ray.get(_encoder_actor().get_num_ongoing_requests.remote(), timeout=TIMEOUT) == 0
            encoder = serve.status().applications["volume"].deployments["Encoder"]
            assert str(getattr(encoder.status, "value", encoder.status)) != "DEPLOY_FAILED", encoder.message
            assert "failed to start" not in encoder.message, encoder.message

            shutil.copy2(artifact / bucket_file(2), link / bucket_file(2))  # the rest arrives
            ready, done, _ = poll(lambda: _readyz(client), lambda r: r is not None and r.status_code == 200, START_S,
                                  0.5)
            assert done, ready.text if ready else "no answer"
            answer = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
        assert answer.status_code == 200, answer.text
        encoder = serve.status().applications["volume"].deployments["Encoder"]
        assert str(getattr(encoder.status, "value", encoder.status)) == "HEALTHY", encoder.message
    finally:
        delete_apps(["volume"])
