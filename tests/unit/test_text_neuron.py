"""The text tower's Neuron path through the trace double: compile per text bucket, manifest, load, accuracy.

What the double does not prove (no neuronx-cc, no NEFF, no bf16 numerics, no NeuronCore) is said in
tests/doubles/torch_neuronx; a trn2 run of `siglip-serve compile --text` and `accuracy --texts` does that.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from siglip_serve.measure.accuracy import run_accuracy
from siglip_serve.models.backends.implementation import create_text_encoder
from siglip_serve.models.neuron.manifest import ArtifactError, read_manifest
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact, main
from tests.helpers import neuronx_double, tiny_settings

TEXTS = ["a photo of a cat", "rocket", "coffee and a cup", "the astronaut in a large white house"]


@pytest.fixture(scope="module")
def text_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("artifacts")
    with neuronx_double() as double:
        result = compile_artifact(tiny_settings(text_buckets=(1, 4)), CompileOptions(lnc=2), root, text=True)
        calls = list(double.CALLS)
    return result.artifact_dir, calls


def test_compile_traces_one_text_graph_per_bucket_into_the_same_artifact(text_artifact: tuple[Path, list[dict]],
                                                                          tmp_path: Path) -> None:
    directory, calls = text_artifact
    manifest = read_manifest(directory)
    assert manifest.buckets == [1, 2] and manifest.text["buckets"] == [1, 4]
    assert manifest.text["context_length"] == 16 and manifest.text["logit_bias"] == -10.0
    assert manifest.text["files"] == {"1": "text-bucket-1.pt", "4": "text-bucket-4.pt"}
    assert all((directory / name).is_file() for name in manifest.text["files"].values())
    text_calls = [c for c in calls if c["input_dtype"] == "torch.int64"]
    assert [c["input_shape"] for c in text_calls] == [[1, 16], [4, 16]]
    assert all(c["compiler_args"] == CompileOptions(lnc=2).compiler_args() for c in text_calls)
    assert [c["input_shape"] for c in calls if c["input_dtype"] == "torch.uint8"] == [[1, 3, 64, 64], [2, 3, 64, 64]]
    assert json.loads((directory / "manifest.json").read_text())["text"]["input"] == {"dtype": "int64"}
    # Text graphs change the cache key: an image-only compile of the same model is another artifact.
    with neuronx_double():
        image_only = compile_artifact(tiny_settings(text_buckets=(1, 4)), CompileOptions(lnc=2), directory.parent)
        again = compile_artifact(tiny_settings(text_buckets=(1, 4)), CompileOptions(lnc=2), directory.parent, text=True)
    assert image_only.artifact_dir != directory and read_manifest(image_only.artifact_dir).text == {}
    assert again.reused and again.artifact_dir == directory


def test_neuron_text_encoder_matches_the_cpu_text_tower(text_artifact: tuple[Path, list[dict]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = text_artifact
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with neuronx_double():
        neuron = create_text_encoder(tiny_settings(backend="neuron", artifact_dir=directory, text_buckets=(1, 4)))
        got = neuron.encode(TEXTS + TEXTS[:1])
    assert neuron.backend == "neuron" and neuron.forward_counts == {1: 1, 4: 1}
    want = create_text_encoder(tiny_settings(text_buckets=(1, 4))).encode(TEXTS + TEXTS[:1])
    assert np.min(np.sum(got * want, axis=1)) >= 0.9999
    assert neuron.info.logit_scale == pytest.approx(1 / 0.07, rel=1e-6) and neuron.info.logit_bias == -10.0
    with neuronx_double(), pytest.raises(ArtifactError, match="text buckets \\[8\\] are not in artifact"):
        create_text_encoder(tiny_settings(backend="neuron", artifact_dir=directory, text_buckets=(1, 8)))


def test_image_only_artifact_refuses_text_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with neuronx_double():
        result = compile_artifact(tiny_settings(), CompileOptions(lnc=2), tmp_path)
        with pytest.raises(ArtifactError, match="compile it with `siglip-serve compile --text`"):
            create_text_encoder(tiny_settings(backend="neuron", artifact_dir=result.artifact_dir))


def test_compile_cli_text_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with neuronx_double():
        code = main(["--model", "tiny-siglip", "--buckets", "1", "--lnc", "1", "--text", "--text-buckets", "2",
                     "--cache-root", str(tmp_path), "--log-level", "ERROR"])
    assert code == 0
    manifest = read_manifest(Path(capsys.readouterr().out.strip()))
    assert manifest.text["buckets"] == [2] and manifest.summary()["text_buckets"] == [2]


def test_accuracy_tool_compares_text_towers(text_artifact: tuple[Path, list[dict]], photo_jpegs: list[bytes],
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = text_artifact
    for i, data in enumerate(photo_jpegs[:2]):
        (tmp_path / f"p{i}.jpg").write_bytes(data)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with neuronx_double():
        result = run_accuracy(tiny_settings(text_buckets=(1, 4)),
                              tiny_settings(backend="neuron", artifact_dir=directory, text_buckets=(1, 4)),
                              tmp_path, texts=TEXTS)
    assert result["passed"] and result["text"]["texts"] == 4 and result["text"]["cosine_min"] >= 0.9999
    different = run_accuracy(tiny_settings(text_buckets=(1, 4)), tiny_settings(text_buckets=(1, 4), seed=3),
                             tmp_path, texts=TEXTS)
    assert not different["passed"] and different["text"]["cosine_min"] < 0.9
