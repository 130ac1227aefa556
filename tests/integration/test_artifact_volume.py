"""Under KubeRay a served replica whose artifact volume is missing or empty says so (in /readyz, naming the
volume, not `compile`) and waits; once the volume is filled as deploy/kuberay/artifacts-efs.yaml fills it (the
artifact's directory, then the relative link `compile --link` wrote), the service is ready by itself, with
no change to its config and no failed start counted."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from siglip_serve.models.neuron.sdk import LNC_ENV
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.helpers import ServeCluster, delete_apps, deploy, neuronx_double, tiny_settings, worker_pythonpath

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-siglip compiled through the trace double (tests/doubles/torch_neuronx) for LNC 2."""
    with neuronx_double():
        root = tmp_path_factory.mktemp("compiled")
        return compile_artifact(tiny_settings(), CompileOptions(lnc=2), root).artifact_dir


def _readyz(client: httpx.Client, status: int, deadline_s: float) -> httpx.Response:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            ready = client.get("/readyz")
            if ready.status_code == status:
                return ready
        except httpx.HTTPError:
            ready = None
        assert time.monotonic() < deadline, ready.text if ready is not None else "no answer"
        time.sleep(0.5)


def test_a_replica_waits_for_its_artifact_volume_and_serves_once_it_is_filled(
        serve_cluster: ServeCluster, artifact: Path, photo_jpegs: list[bytes], tmp_path: Path) -> None:
    from ray import serve

    volume = tmp_path / "artifacts"  # the claim, mounted but empty
    volume.mkdir()
    link = volume / "so400m-lnc2"
    deploy("volume", "/volume", wait=False, backend="neuron", artifact_dir=str(link), buckets=[1, 2], replicas=1,
           neuron_cores_per_replica=0, encoder_num_cpus=0.25, ingress_num_cpus=0.25,
           env_vars={"PYTHONPATH": worker_pythonpath(), LNC_ENV: "2", "KUBERAY_GEN_RAY_START_CMD": "ray start --block"})
    try:
        with httpx.Client(base_url=f"{serve_cluster.base_url}/volume", timeout=TIMEOUT) as client:
            deadline = time.monotonic() + 180
            while "artifact volume" not in (message := _readyz(client, 503, 180).text):
                assert time.monotonic() < deadline, message
                time.sleep(0.5)
            assert f"artifact directory {link} does not exist on this pod: mount or populate the artifact volume" \
                in message and "siglip-serve compile" not in message, message
            time.sleep(2 * 5.0)  # two more looks at the volume (VOLUME_POLL_S): still waiting, nothing failed
            encoder = serve.status().applications["volume"].deployments["Encoder"]
            assert str(getattr(encoder.status, "value", encoder.status)) != "DEPLOY_FAILED", encoder.message
            assert "failed to start" not in encoder.message, encoder.message

            # The populate step's order: the directory whole, then the link to it.
            shutil.copytree(artifact, volume / artifact.name, symlinks=True)
            os.symlink(artifact.name, link)
            _readyz(client, 200, 120)
            answer = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
        assert answer.status_code == 200, answer.text
        encoder = serve.status().applications["volume"].deployments["Encoder"]
        assert str(getattr(encoder.status, "value", encoder.status)) == "HEALTHY", encoder.message
    finally:
        delete_apps(["volume"])
