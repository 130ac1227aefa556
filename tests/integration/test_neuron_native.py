"""The neuron-native (TorchNeuron) backend through its runtime seam, with the REAL torch.compile on
the CPU and a recording backend (tests/doubles/torchneuron_runtime.py says what that does not prove):
compile -> manifest -> restart from the cache -> encode, and every start-up refusal.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.implementation import backend_replica_env as replica_env
from siglip_serve.models.backends.neuron_native import check_available, load_native_encoder
from siglip_serve.models.loading import load_embedder
from siglip_serve.models.neuron.env import (
    CC_FLAGS_ENV,
    LNC_ENV,
    NEFF_CACHE_ENV,
    OPT_LEVEL_ENV,
    VISIBLE_CORES_ENV,
    NativeOptions,
    TorchNeuronRefusal,
    environment,
    sdk_tag,
)
from siglip_serve.models.neuron.native import compile_native_artifact
from siglip_serve.models.neuron.runtime import (
    TorchNeuronRuntime,
    compile_buckets,
    image_input,
    read_native_manifest,
)
from tests.doubles.torchneuron_runtime import DOUBLE_VERSIONS, RecordingRuntime
from tests.helpers import delete_apps, neuron_env, tiny_settings

ENV_KEYS = (LNC_ENV, CC_FLAGS_ENV, OPT_LEVEL_ENV, NEFF_CACHE_ENV, VISIBLE_CORES_ENV)


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test is a new process as far as Dynamo is concerned, and leaves the stance as it was."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    torch._dynamo.reset()
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def compile_tiny(root: Path, monkeypatch: pytest.MonkeyPatch, options: NativeOptions | None = None,
                 buckets: tuple[int, ...] = (1, 2),
                 text_buckets: tuple[int, ...] = ()) -> tuple[Path, RecordingRuntime]:
    """What `siglip-serve compile --backend neuron-native [--text]` does, with the double as the runtime."""
    options = options or NativeOptions()
    staging = root / sdk_tag(DOUBLE_VERSIONS) / ".partial-test"
    for key, value in environment(options.recipe_env(), staging).items():
        monkeypatch.setenv(key, value)
    runtime = RecordingRuntime()
    settings = tiny_settings(buckets=buckets, **({"text_buckets": text_buckets} if text_buckets else {}))
    result = compile_native_artifact(settings, options, root, staging, runtime, text=bool(text_buckets))
    return result.artifact_dir, runtime


def as_replica(artifact: Path, monkeypatch: pytest.MonkeyPatch, cores: str | None = "0") -> None:
    """The environment a replica starts with: the artifact's (set by the replica itself, replica_env) and the
    one NeuronCore Ray gives it."""
    torch._dynamo.reset()  # a new process: Dynamo remembers nothing
    for key, value in replica_env(tiny_settings(backend="neuron-native", artifact_dir=artifact)).items():
        monkeypatch.setenv(key, value)
    if cores is None:
        monkeypatch.delenv(VISIBLE_CORES_ENV, raising=False)
    else:
        monkeypatch.setenv(VISIBLE_CORES_ENV, cores)


def load(artifact: Path, runtime: RecordingRuntime | None = None, **overrides):
    settings = tiny_settings(backend="neuron-native", artifact_dir=artifact, **overrides)
    return load_native_encoder(settings, runtime or RecordingRuntime())


@pytest.fixture
def artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return compile_tiny(tmp_path / "cache", monkeypatch)[0]


# -- compile -----------------------------------------------------------------------------------------

def test_compile_makes_one_graph_per_bucket_and_a_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact, runtime = compile_tiny(tmp_path / "cache", monkeypatch, buckets=(1, 2, 4))
    assert [c["image_shapes"] for c in runtime.compiles] == [[[1, 3, 64, 64]], [[2, 3, 64, 64]], [[4, 3, 64, 64]]]
    assert runtime.hits == []
    assert artifact.parent == tmp_path / "cache" / "torchneuron-2.14.3.0.0+recording-double-cc2.28.7631.0"
    assert artifact.name.startswith("tiny-siglip-lnc2-") and not list(artifact.parent.glob(".partial-*"))
    manifest = read_native_manifest(artifact)
    assert manifest.line == "neuron-native" and manifest.buckets == [1, 2, 4] and manifest.lnc == 2
    assert manifest.recipe_env == {
        LNC_ENV: "2", OPT_LEVEL_ENV: "-O3",
        CC_FLAGS_ENV: "--target trn2 --lnc 2 --auto-cast=matmult --auto-cast-type=bf16 --model-type transformer"}
    assert manifest.versions == DOUBLE_VERSIONS and manifest.weights["source"] == "random(seed=0)"
    # Each bucket's graph file is recorded and lies in the artifact's own NEFF cache.
    assert {b: len(files) for b, files in manifest.graphs.items()} == {"1": 1, "2": 1, "4": 1}
    assert [manifest.graphs[str(b)][0] for b in (1, 2, 4)] == [c["file"] for c in runtime.compiles]
    assert all((artifact / "neff" / f).is_file() for files in manifest.graphs.values() for f in files)
    # The weights replicas load are the compiled model's.
    state = torch.load(artifact / "weights.pt", weights_only=True)
    expected = load_embedder(tiny_settings())[0].state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)


def test_same_inputs_reuse_the_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = compile_tiny(tmp_path, monkeypatch)
    again, runtime = compile_tiny(tmp_path, monkeypatch)
    assert again == first and runtime.compiles == []
    other, _ = compile_tiny(tmp_path, monkeypatch, NativeOptions(lnc=1))
    assert other != first and read_native_manifest(other).recipe_env[LNC_ENV] == "1"


def test_a_graph_break_fails_instead_of_splitting_the_model(tmp_path: Path) -> None:
    class Breaks(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = images.float() / 255
            torch._dynamo.graph_break()
            return x.mean(dim=(2, 3))

    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_buckets(Breaks(), (1,), image_input((8, 8)), RecordingRuntime(), tmp_path / "neff")


def test_compile_refuses_an_environment_not_set_before_torch(tmp_path: Path) -> None:
    with pytest.raises(TorchNeuronRefusal, match="siglip-serve compile --backend neuron-native"):
        compile_native_artifact(tiny_settings(), NativeOptions(), tmp_path, tmp_path / "staging", RecordingRuntime())


# -- a replica -----------------------------------------------------------------------------------------

def test_restart_finds_every_graph_in_the_cache_and_encodes_like_the_cpu_model(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch, cores="3")
    runtime = RecordingRuntime()
    encoder = load(artifact, runtime)
    assert runtime.compiles == [], "a replica must find its graphs, not compile them"
    assert [h["image_shapes"] for h in runtime.hits] == [[[1, 3, 64, 64]], [[2, 3, 64, 64]]]
    images = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8).numpy()
    got = encoder.encode(images)  # bucket 2, then bucket 1 padded
    with torch.no_grad():
        expected = load_embedder(tiny_settings())[0](torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert got.dtype == np.float32 and encoder.forward_counts == {1: 1, 2: 1}
    assert len(runtime.hits) == 2 and runtime.compiles == []  # serving compiled nothing either
    described = encoder.describe()
    assert described["backend"] == "neuron-native" and described["neuron_rt_visible_cores"] == "3"
    assert described["manifest"]["recipe_env"][LNC_ENV] == "2"


def test_after_warm_up_a_stray_shape_fails_instead_of_recompiling(artifact: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch)
    runtime = RecordingRuntime()
    encoder = load(artifact, runtime)
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        encoder._forward(torch.zeros((3, 3, 64, 64), dtype=torch.uint8))
    assert runtime.compiles == []


def test_two_encoders_in_one_process_each_warm_up_and_stay_strict(artifact: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # An accuracy run with neuron-native on both sides: set_stance is process-wide, so the first
    # encoder's stance must not turn the second one's warm-up into a "recompile" error.
    as_replica(artifact, monkeypatch)
    runtime = RecordingRuntime()
    first, second = load(artifact, runtime), load(artifact, runtime)
    assert runtime.compiles == [] and len(runtime.hits) == 4
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8).numpy()
    np.testing.assert_array_equal(first.encode(images), second.encode(images))
    for encoder in (first, second):
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            encoder._forward(torch.zeros((3, 3, 64, 64), dtype=torch.uint8))
    assert runtime.compiles == []


# -- refusals, each one line naming the values and the fix -------------------------------------------

def refusal(artifact: Path, runtime: RecordingRuntime | None = None, **overrides) -> str:
    with pytest.raises(TorchNeuronRefusal) as err:
        load(artifact, runtime, **overrides)
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("torch_neuronx, expected", [
    (None, ["not installed", "pip install -c constraints-neuron-native.txt", "aws_neuronx_venv_torch_neuronx_2_14_0"]),
    ("1.0", ["placeholder", "pip uninstall torch-neuronx"]),
    ("2.9.0.2.15.32035", ["trace line", "--backend neuron", "cannot share a venv"]),
    ("2.13.3.0.1", ["pinned to Neuron 2.33.1 (torch-neuronx 2.14.3.0.*", "2.13.3.0.1 (Neuron 2.33)"]),
    # Neuron 2.34's TorchNeuron, which a DLAMI newer than the pin holds: named beside the pin.
    ("2.14.3.1.0", ["pinned to Neuron 2.33.1 (torch-neuronx 2.14.3.0.*", "2.14.3.1.0 (Neuron 2.34)"]),
])
def test_refuses_a_missing_sdk_or_the_other_line(artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                                 torch_neuronx: str | None, expected: list[str]) -> None:
    as_replica(artifact, monkeypatch)
    text = refusal(artifact, RecordingRuntime({**DOUBLE_VERSIONS, "torch_neuronx": torch_neuronx}))
    for part in expected:
        assert part in text, (part, text)


def test_refuses_versions_other_than_the_manifests(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch)
    text = refusal(artifact, RecordingRuntime({**DOUBLE_VERSIONS, "neuronx_cc": "2.27.5334.0"}))
    assert "neuronx_cc 2.28.7631.0" in text and "2.27.5334.0" in text and "compile again" in text


@pytest.mark.parametrize("key, value, shown", [
    (LNC_ENV, "1", "NEURON_LOGICAL_NC_CONFIG is '1' here but artifact"),
    (CC_FLAGS_ENV, "--target trn2 --lnc 2 --auto-cast=none",
     "NEURON_CC_FLAGS is '--target trn2 --lnc 2 --auto-cast=none'"),
    (OPT_LEVEL_ENV, "-O1", "NEURON_COMPILER_OPT_LEVEL is '-O1' here"),
    (NEFF_CACHE_ENV, "/tmp/neff_cache", "TORCH_NEURONX_NEFF_CACHE_DIR is '/tmp/neff_cache' here"),
])
def test_refuses_a_recipe_other_than_the_manifests(artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                                   key: str, value: str, shown: str) -> None:
    as_replica(artifact, monkeypatch)
    monkeypatch.setenv(key, value)
    text = refusal(artifact)
    assert shown in text and f"{key}=" in text and "export" in text


def test_a_standalone_process_takes_unset_recipe_variables_from_the_manifest(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch)
    monkeypatch.delenv(LNC_ENV)
    monkeypatch.delenv(CC_FLAGS_ENV)
    runtime = RecordingRuntime()
    load(artifact, runtime)  # e.g. `siglip-serve accuracy` with only NEURON_RT_VISIBLE_CORES exported
    assert os.environ[LNC_ENV] == "2" and os.environ[CC_FLAGS_ENV].startswith("--target trn2 --lnc 2")
    assert runtime.compiles == [] and len(runtime.hits) == 2
    # An explicit environment (not this process's) is only checked, never changed.
    torch._dynamo.reset()
    torch.compiler.set_stance("default")
    replica = {**os.environ}
    del replica[LNC_ENV]
    with pytest.raises(TorchNeuronRefusal, match="NEURON_LOGICAL_NC_CONFIG is None here"):
        load_native_encoder(tiny_settings(backend="neuron-native", artifact_dir=artifact), RecordingRuntime(), replica)


@pytest.mark.parametrize("cores, shown", [("0-1", "gives this replica 2 NeuronCores"), ("0,2", "2 NeuronCores"),
                                          (None, "is unset, so the Neuron runtime would reserve every NeuronCore")])
def test_refuses_more_than_one_core(artifact: Path, monkeypatch: pytest.MonkeyPatch, cores: str | None,
                                    shown: str) -> None:
    as_replica(artifact, monkeypatch, cores=cores)
    text = refusal(artifact)
    assert shown in text and "neuron_cores_per_replica: 1" in text


def test_refuses_when_a_buckets_graph_is_not_in_the_cache(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch)
    graph = read_native_manifest(artifact).graphs["2"][0]
    (artifact / "neff" / graph).unlink()
    runtime = RecordingRuntime()
    text = refusal(artifact, runtime)
    assert "buckets [2]" in text and graph in text and "siglip-serve compile --backend neuron-native" in text
    assert runtime.compiles == [] and runtime.hits == []  # refused before anything was compiled


def test_refuses_artifacts_it_cannot_serve(artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_replica(artifact, monkeypatch)
    assert "buckets [4] are not in artifact" in refusal(artifact, buckets=(1, 4))
    trace = tmp_path / "trace-artifact"
    trace.mkdir()
    (trace / "manifest.json").write_text(json.dumps({"model": "tiny-siglip", "buckets": [1], "lnc": 2}))
    assert "trace line (--backend neuron)" in refusal(trace)
    copy = tmp_path / "tampered"
    shutil.copytree(artifact, copy)
    torch.save({"visual.trunk.cls": torch.zeros(1)}, copy / "weights.pt")
    for key, value in replica_env(tiny_settings(backend="neuron-native", artifact_dir=copy)).items():
        monkeypatch.setenv(key, value)
    assert "is not the file the artifact was compiled with" in refusal(copy)


def test_the_real_runtime_and_the_serving_check_refuse_without_torchneuron(artifact: Path) -> None:
    # This machine has no torch-neuronx: the real seam and the pre-Ray check both say so in one line.
    with pytest.raises(TorchNeuronRefusal, match="not installed here"):
        TorchNeuronRuntime().check_sdk()
    with pytest.raises(BackendUnavailable, match="pip install -c constraints-neuron-native.txt") as err:
        check_available(tiny_settings(backend="neuron-native", artifact_dir=artifact))
    assert "\n" not in str(err.value)


def test_the_serving_check_refuses_a_shell_lnc_other_than_the_artifacts(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import siglip_serve.models.backends.neuron_native as native

    monkeypatch.setattr(native, "installed_versions", lambda: dict(DOUBLE_VERSIONS))  # as if TorchNeuron were here
    settings = tiny_settings(backend="neuron-native", artifact_dir=artifact)
    check_available(settings, {LNC_ENV: "2"})
    check_available(settings, None)  # joining a cluster started elsewhere: nothing to compare
    with pytest.raises(BackendUnavailable, match="NEURON_LOGICAL_NC_CONFIG=1 here but artifact .* compiled for LNC=2"):
        check_available(settings, {LNC_ENV: "1"})


# -- the serving wiring -----------------------------------------------------------------------------

def test_replicas_get_the_artifacts_environment_and_one_core(artifact: Path) -> None:
    from siglip_serve.core.constants import SERVE_THROUGHPUT_ENV
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service

    config = ServiceConfig(model="tiny-siglip", backend="neuron-native", artifact_dir=artifact, buckets=(1, 2),
                           env_vars={"NEURON_RT_LOG_LEVEL": "WARNING"}, replicas=2)
    options = plan_service(config).model.image.deployment.ray_actor_options
    # Nothing from the artifact in Ray's runtime_env: the builder that fills it runs on the head, which need
    # not see the artifact. The replica sets the recipe on itself, from the manifest on its node (issue 41).
    assert options["runtime_env"]["env_vars"] == {**SERVE_THROUGHPUT_ENV, "NEURON_RT_LOG_LEVEL": "WARNING"}
    manifest = read_native_manifest(artifact)
    assert replica_env(config.model_settings()) == {**manifest.recipe_env,
                                                    NEFF_CACHE_ENV: str(artifact.resolve() / "neff")}
    assert options["resources"] == {"neuron_cores": 1}  # Ray then sets NEURON_RT_VISIBLE_CORES to one core


def test_served_through_the_real_app_with_the_artifacts_environment(
        serve_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_jpegs: list[bytes],
        tiny_reference) -> None:
    """The real application on Ray; each replica starts from runtime_env alone and uses the double."""
    import httpx

    from siglip_serve.models.backends.neuron_native import RUNTIME_ENV
    from tests.helpers import REPO, deploy

    artifact, _ = compile_tiny(tmp_path / "cache", monkeypatch)
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)  # the replica must get them from the deployment, not from here
    # No neuron_cores: the session's main app holds them all, so this replica names its one core itself.
    deploy("native", "/native", backend="neuron-native", artifact_dir=str(artifact), buckets=[1, 2], replicas=1,
           neuron_cores_per_replica=0, encoder_num_cpus=0.5, ingress_num_cpus=0.25, batch_wait_timeout_s=0.01,
           env_vars={"PYTHONPATH": str(REPO), RUNTIME_ENV: "tests.doubles.torchneuron_runtime:RecordingRuntime",
                     VISIBLE_CORES_ENV: "0"})
    try:
        with httpx.Client(base_url=f"{serve_cluster.base_url}/native", timeout=60) as client:
            reply = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
            assert reply.status_code == 200, reply.text
            got = np.array(reply.json()["data"][0]["embedding"], dtype=np.float32)
            want = tiny_reference.embed(photo_jpegs[0])
            assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) >= 0.9999
            (replica,) = client.get("/v1/models").json()["data"][0]["replicas"]
    finally:
        delete_apps(["native"])
    assert replica["backend"] == "neuron-native" and replica["runtime"] == "recording-double"
    assert replica["neuron_logical_nc_config"] == "2" and replica["neuron_rt_visible_cores"] == "0"
    assert replica["manifest"]["recipe_env"][CC_FLAGS_ENV].startswith("--target trn2 --lnc 2")


def test_compile_cli_without_the_sdk_writes_nothing_and_says_what_to_install(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from siglip_serve.__main__ import main

    before = neuron_env()
    code = main(["compile", "--backend", "neuron-native", "--model", "tiny-siglip", "--cache-root", str(tmp_path),
                 "--log-level", "ERROR"])
    assert code == 2 and neuron_env() == before  # the compile environment does not leak
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "pip install -c constraints-neuron-native.txt" in errors[0]
    assert not any(tmp_path.rglob("*"))


def test_the_extra_and_the_constraints_pin_the_set_the_backend_checks() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")

    from siglip_serve.models.neuron.env import (
        NEURONX_CC_VERSION,
        TORCH_NEURONX_FAMILY,
        TORCH_VERSION,
        TORCHVISION_VERSION,
    )
    from tests.helpers import REPO

    # Exact torch and torchvision: with a range pip may swap the DLAMI's torch for a later patch.
    expected = {f"torch-neuronx=={TORCH_NEURONX_FAMILY}.*", f"neuronx-cc=={NEURONX_CC_VERSION}",
                f"torch=={TORCH_VERSION}", f"torchvision=={TORCHVISION_VERSION}"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]["neuron-native"]) == expected
    lines = (REPO / "constraints-neuron-native.txt").read_text().splitlines()
    assert {line.strip() for line in lines if line.strip() and not line.startswith("#")} == expected


def test_multicore_bench_workers_start_with_the_artifacts_environment(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.measure.multicore import run_multicore
    from siglip_serve.models.backends.neuron_native import RUNTIME_ENV

    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)  # the workers must get them from the bench, not inherit them
    monkeypatch.setenv(RUNTIME_ENV, "tests.doubles.torchneuron_runtime:RecordingRuntime")
    result = run_multicore(tiny_settings(backend="neuron-native", artifact_dir=artifact), cores=1, bucket=1,
                           warmup=1, iterations=3)
    (worker,) = result.workers
    assert result.backend == "neuron-native" and worker.lnc_env == "2"  # from the manifest, not inherited
    assert worker.core == "0" and worker.images == 3
