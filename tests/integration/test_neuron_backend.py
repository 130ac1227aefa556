"""The neuron backend: SDK detection, the LNC rule, artifact checks, and the whole path
compile -> save -> load -> encode through the serving app over HTTP, against the trace double.

The double (tests/doubles/torch_neuronx) proves our plumbing, not Neuron: no neuronx-cc, no NEFF,
no bf16 numerics, no NeuronCore placement. tests/device/test_neuron_trn2.py runs the real thing on a trn2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from siglip_serve.models.backends.implementation import check_backend_available, create_encoder
from siglip_serve.models.loading import load_embedder
from siglip_serve.models.neuron.manifest import ArtifactError
from siglip_serve.models.neuron.sdk import (
    LNC_ENV,
    LncMismatch,
    NeuronSdkMissing,
    check_lnc,
    require_torch_neuronx,
    runtime_lnc,
)
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.bounds import SETTLE_S, START_S, scaled
from tests.helpers import (
    PLACEHOLDER,
    REPO,
    ServeCluster,
    TinyReference,
    cosine,
    delete_apps,
    deploy,
    neuronx_double,
    tiny_settings,
    torch_neuronx_from,
    worker_pythonpath,
)

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """tiny-siglip (seed 0, buckets 1 and 2) compiled through the double for LNC 2 and LNC 1."""
    root = tmp_path_factory.mktemp("artifacts")
    with neuronx_double():
        return {lnc: compile_artifact(tiny_settings(), CompileOptions(lnc=lnc), root).artifact_dir for lnc in (1, 2)}


# -- the LNC rule ------------------------------------------------------------------------------

def test_lnc_mismatch_names_both_values_and_the_fix() -> None:
    with pytest.raises(LncMismatch) as err:
        check_lnc(2, "artifacts/so400m-lnc2", {LNC_ENV: "1"})
    message = str(err.value)
    for part in ("compiled for LNC=2", "runs LNC=1", f"{LNC_ENV}=1", f"export {LNC_ENV}=2",
                 "siglip-serve compile --lnc 1", "Cannot run Neff", "artifacts/so400m-lnc2"):
        assert part in message, part
    assert check_lnc(1, "a", {LNC_ENV: "1"}) == 1


def test_unset_lnc_means_trn2s_default_of_2() -> None:
    assert runtime_lnc({}, "trn2") == (2, False)
    assert runtime_lnc({LNC_ENV: "1"}, "trn2") == (1, True)
    assert runtime_lnc({}, "inf2") == (1, False)
    assert check_lnc(2, "a", {}) == 2
    with pytest.raises(LncMismatch, match="unset, so the trn2 default LNC=2"):
        check_lnc(1, "a", {})
    with pytest.raises(LncMismatch, match="1 or 2"):
        runtime_lnc({LNC_ENV: "4"})


# -- SDK detection -------------------------------------------------------------------------------

def test_missing_sdk_and_pypi_placeholder_are_told_apart() -> None:
    with torch_neuronx_from(None), pytest.raises(NeuronSdkMissing) as missing:
        require_torch_neuronx()
    with torch_neuronx_from(PLACEHOLDER), pytest.raises(NeuronSdkMissing) as placeholder:
        require_torch_neuronx()
    for err in (missing, placeholder):
        text = str(err.value)
        assert "\n" not in text
        assert "constraints-neuron-2.31.txt" in text and "https://pip.repos.neuron.amazonaws.com" in text
    assert "placeholder" in str(placeholder.value) and "pip uninstall torch-neuronx" in str(placeholder.value)


def test_run_without_the_sdk_exits_with_one_line_before_ray(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "siglip_serve", "run", "--backend", "neuron", "--model", "tiny-siglip",
         "--artifact-dir", str(tmp_path), "--port", str(free_port())],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(120),
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "constraints-neuron-2.31.txt" in lines[0]
    assert "https://pip.repos.neuron.amazonaws.com" in lines[0]


# -- the backend in-process ----------------------------------------------------------------------

def test_neuron_encoder_loads_each_bucket_and_encodes_like_the_cpu_model(
        artifacts: dict[int, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LNC_ENV, "2")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "3")
    with neuronx_double():
        encoder = create_encoder(tiny_settings(backend="neuron", artifact_dir=artifacts[2]))
    images = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8).numpy()
    got = encoder.encode(images)  # 3 images: bucket 2, then bucket 1 padded
    embedder, _ = load_embedder(tiny_settings())
    with torch.inference_mode():
        expected = embedder(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert encoder.forward_counts == {1: 1, 2: 1}
    described = encoder.describe()
    assert described["backend"] == "neuron" and described["lnc"] == 2
    assert described["neuron_rt_visible_cores"] == "3"
    assert described["artifact_dir"] == str(artifacts[2].resolve())
    assert described["manifest"]["compiler_args"][:4] == ["--target", "trn2", "--lnc", "2"]
    assert described["manifest"]["auto_cast"] == "matmult"


def test_lnc_is_checked_before_anything_loads(artifacts: dict[int, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LNC_ENV, "2")

    def no_load(*_args, **_kwargs):
        raise AssertionError("torch.jit.load ran before the LNC check")

    monkeypatch.setattr(torch.jit, "load", no_load)
    with neuronx_double(), pytest.raises(LncMismatch, match="compiled for LNC=1"):
        create_encoder(tiny_settings(backend="neuron", artifact_dir=artifacts[1]))


def test_artifact_must_hold_the_model_and_buckets_asked_for(artifacts: dict[int, Path], tmp_path: Path) -> None:
    with neuronx_double():
        with pytest.raises(ArtifactError, match=r"buckets \[4\] are not in artifact"):
            create_encoder(tiny_settings(backend="neuron", artifact_dir=artifacts[2], buckets=(1, 4)))
        with pytest.raises(ArtifactError, match="holds tiny-siglip but the config asks for ViT-B-16-SigLIP"):
            create_encoder(tiny_settings(backend="neuron", artifact_dir=artifacts[2], model="ViT-B-16-SigLIP"))
        with pytest.raises(ArtifactError, match="no manifest.json"):
            create_encoder(tiny_settings(backend="neuron", artifact_dir=tmp_path))
        with pytest.raises(ArtifactError, match="needs artifact_dir"):
            create_encoder(tiny_settings(backend="neuron"))
        # The serving CLI's pre-Ray check says the same, as BackendUnavailable (one line).
        with pytest.raises(BackendUnavailable, match="compiled for LNC=1"):
            check_backend_available(tiny_settings(backend="neuron", artifact_dir=artifacts[1]), {LNC_ENV: "2"})
        check_backend_available(tiny_settings(backend="neuron", artifact_dir=artifacts[1]), None)


# -- the whole path, served over HTTP --------------------------------------------------------------

@pytest.fixture(scope="module")
def neuron_app(serve_cluster: ServeCluster, artifacts: dict[int, Path]) -> str:
    """A second app in the session cluster on the neuron backend; its replica imports the double
    through the env_vars passthrough. It asks for no neuron_cores: the main app holds them all."""
    deploy("neuron", "/neuron", backend="neuron", artifact_dir=str(artifacts[2]), buckets=[1, 2],
           replicas=1, neuron_cores_per_replica=0, encoder_num_cpus=0.5, ingress_num_cpus=0.25,
           batch_wait_timeout_s=0.01, env_vars={"PYTHONPATH": worker_pythonpath(), LNC_ENV: "2"})
    yield f"{serve_cluster.base_url}/neuron"


def test_neuron_backend_serves_the_cpu_models_embeddings_over_http(
        neuron_app: str, photo_jpegs: list[bytes], tiny_reference: TinyReference, artifacts: dict[int, Path]) -> None:
    with httpx.Client(base_url=neuron_app, timeout=TIMEOUT) as client:
        one = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
        assert one.status_code == 200, one.text
        got = np.array(one.json()["data"][0]["embedding"], dtype=np.float32)
        assert cosine(got, tiny_reference.embed(photo_jpegs[0])) >= 0.9999
        # Three images: split over buckets 2 and 1 (padded), answered in order.
        files = [("file", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(photo_jpegs[:3])]
        many = client.post("/v1/embeddings/image", files=files)
        assert many.status_code == 200, many.text
        for item, data in zip(many.json()["data"], photo_jpegs[:3], strict=True):
            assert cosine(np.array(item["embedding"], dtype=np.float32), tiny_reference.embed(data)) >= 0.9999
        models = client.get("/v1/models").json()["data"][0]
    assert models["backend"] == "neuron" and models["lnc"] == 2 and models["buckets"] == [1, 2]
    (replica,) = models["replicas"]
    assert replica["backend"] == "neuron" and replica["lnc"] == 2
    assert replica["neuron_logical_nc_config"] == "2"  # the env_vars passthrough reached the replica
    assert replica["artifact_dir"] == str(artifacts[2].resolve())
    assert replica["manifest"]["versions"]["torch_neuronx"] == "0.0.0+test-double"
    assert replica["node_id"]


def test_a_replica_that_cannot_start_on_its_node_says_so_in_serves_status_and_readyz_and_retries_stop(
        serve_cluster: ServeCluster, tmp_path: Path) -> None:
    """The builder reads no artifact (it runs on the head); the replica does, refuses in one line naming its
    node, and Serve shows that line and stops after min(3 x replicas, 20) failed starts
    (ray/serve/_private/deployment_state.py: _failed_to_start_threshold, _replica_startup_failing)."""
    import socket
    import time

    from ray import serve

    missing = tmp_path / "not-compiled"
    deploy("refused", "/refused", wait=False, backend="neuron", artifact_dir=str(missing), buckets=[1, 2],
           replicas=1, neuron_cores_per_replica=0, encoder_num_cpus=0.25, ingress_num_cpus=0.25,
           env_vars={"PYTHONPATH": worker_pythonpath(), LNC_ENV: "2"})
    try:
        def failed(app: Any) -> bool:
            encoder = app.deployments.get("Encoder")
            return encoder is not None and str(getattr(encoder.status, "value", encoder.status)) == "DEPLOY_FAILED"

        app, done, _ = poll(lambda: serve.status().applications["refused"], failed, SETTLE_S + START_S)
        assert done, str(app)
        encoder = app.deployments["Encoder"]
        line = f"image encoder replica on node {socket.gethostname()}"
        assert "failed to start 3 times in a row" in encoder.message and line in encoder.message, encoder.message
        assert "refused to start: artifact directory" in encoder.message and "siglip-serve compile" in encoder.message
        assert str(getattr(app.status, "value", app.status)) == "DEPLOY_FAILED"
        with httpx.Client(base_url=f"{serve_cluster.base_url}/refused", timeout=TIMEOUT) as client:
            ready = client.get("/readyz")
        assert ready.status_code == 503 and line in ready.json()["error"]["message"], ready.text
        time.sleep(5)  # no further start: the deployment stays failed with the same count
        assert "failed to start 3 times" in serve.status().applications["refused"].deployments["Encoder"].message
    finally:
        delete_apps(["refused"])
