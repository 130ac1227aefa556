"""The text tower on TorchNeuron through the runtime seam: the REAL torch.compile on the CPU with the
recording double (tests/doubles/torchneuron_runtime.py says what that does not prove: lowering,
neuronx-cc, bf16 numerics, the device): compile --text, restart from the cache, and the refusals.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from siglip_serve.core.backends import TEXT
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.implementation import check_tower, create_text_encoder
from siglip_serve.models.backends.neuron_native import load_native_text_encoder
from siglip_serve.models.neuron.manifest import ArtifactError
from siglip_serve.models.neuron.runtime import read_native_manifest
from tests.doubles.torchneuron_runtime import RecordingRuntime
from tests.helpers import tiny_settings
from tests.integration.test_neuron_native import as_replica, compile_tiny, fresh_dynamo  # noqa: F401

TEXTS = ["a photo of a cat", "rocket", "coffee and a cup", "the astronaut in a large white house", "cat"]


def native(artifact: Path):
    return tiny_settings(backend="neuron-native", artifact_dir=artifact, text_buckets=(1, 4))


@pytest.fixture
def text_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, RecordingRuntime]:
    return compile_tiny(tmp_path / "cache", monkeypatch, text_buckets=(1, 4))


def test_compile_text_makes_one_int64_graph_per_text_bucket_in_the_same_artifact(
        text_artifact: tuple[Path, RecordingRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact, runtime = text_artifact
    assert [c["id_shapes"] for c in runtime.compiles if c["id_shapes"]] == [[[1, 16]], [[4, 16]]]
    text = read_native_manifest(artifact).text
    assert text["buckets"] == [1, 4] and text["context_length"] == 16 and text["input"] == {"dtype": "int64"}
    assert text["logit_bias"] == -10.0 and (artifact / text["weights_file"]).is_file()
    assert all((artifact / "neff" / f).is_file() for files in text["graphs"].values() for f in files)
    assert {b: len(files) for b, files in text["graphs"].items()} == {"1": 1, "4": 1}
    # The text graphs are part of the key: the image-only compile of the same model is another artifact.
    image_only, _ = compile_tiny(tmp_path / "cache", monkeypatch)
    assert image_only != artifact and read_native_manifest(image_only).text == {}


def test_a_text_replica_restarts_from_the_cache_and_matches_the_cpu_tower(
        text_artifact: tuple[Path, RecordingRuntime], monkeypatch: pytest.MonkeyPatch) -> None:
    artifact, _ = text_artifact
    as_replica(artifact, monkeypatch)
    runtime = RecordingRuntime()
    encoder = load_native_text_encoder(native(artifact), runtime)
    assert runtime.compiles == [] and [h["id_shapes"] for h in runtime.hits] == [[[1, 16]], [[4, 16]]]
    got = encoder.encode(TEXTS)  # bucket 4, then bucket 1
    want = create_text_encoder(tiny_settings(text_buckets=(1, 4))).encode(TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert encoder.backend == "neuron-native" and encoder.forward_counts == {1: 1, 4: 1}
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        encoder._forward(torch.zeros((2, 16), dtype=torch.int64))
    assert runtime.compiles == []


def test_an_image_only_artifact_is_refused_by_the_text_replica_naming_its_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused where the artifact is read: in the text replica, on its node (the builder, on the head, builds
    the deployment without reading it), in one line; `siglip-serve run` asks check_tower before Ray starts."""
    import socket

    from siglip_serve.models.backends.neuron_native import RUNTIME_ENV
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service
    from siglip_serve.serve.towers.replica_start import ReplicaRefused
    from siglip_serve.serve.towers.text_deployment import TextReplica

    artifact, _ = compile_tiny(tmp_path, monkeypatch)
    config = ServiceConfig.from_args({"model": "tiny-siglip", "backend": "neuron-native", "buckets": [1, 2],
                                      "artifact_dir": str(artifact), "text_replicas": 1})
    assert plan_service(config).model.text is not None  # what the builder plans on the head: nothing read
    with pytest.raises(ArtifactError, match="siglip-serve compile --backend neuron-native --text"):
        check_tower(config.model_settings(), TEXT)
    as_replica(artifact, monkeypatch)  # what the replica sets on itself, restored after this test
    monkeypatch.setenv(RUNTIME_ENV, "tests.doubles.torchneuron_runtime:RecordingRuntime")
    with pytest.raises(ReplicaRefused, match="siglip-serve compile --backend neuron-native --text") as err:
        TextReplica(plan_service(config).model.run, plan_service(config).model.text)  # type: ignore[arg-type]
    assert str(err.value).startswith(f"text encoder replica on node {socket.gethostname()}")
    assert "\n" not in str(err.value)


def test_text_buckets_the_artifact_lacks_are_refused(text_artifact: tuple[Path, RecordingRuntime]) -> None:
    artifact, _ = text_artifact
    with pytest.raises(ArtifactError, match=r"text buckets \[8\] are not in artifact .*--text-buckets 1,8"):
        check_tower(tiny_settings(backend="neuron-native", artifact_dir=artifact, text_buckets=(1, 8)), TEXT)


def test_a_backend_without_a_text_tower_is_refused_in_one_line() -> None:
    from siglip_serve.core.backends import NO_MODEL_BACKEND
    from siglip_serve.models.backends.implementation import require_tower

    with pytest.raises(BackendUnavailable, match=f"the '{NO_MODEL_BACKEND}' backend has no text tower"):
        require_tower(NO_MODEL_BACKEND, TEXT)
