"""A bulk job's encoder built from a compiled artifact holds exactly the weights the job names its shards
for, or refuses to start: a recompile from other weights into the same output cannot file two models'
embeddings under one name (bulk/stages.py check_artifact_weights). The actor is built in-process, as Ray
Data builds it in its worker, over tiny-siglip compiled through the trace double (tests/doubles/): what
that proves of the Neuron runtime is what tests/integration/test_neuron_backend.py says."""

from __future__ import annotations

from pathlib import Path

import pytest

from siglip_serve.bulk.stages import ArtifactWeightsMismatch, ImageEmbedActor, check_artifact_weights
from siglip_serve.models.neuron.sdk import LNC_ENV
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.helpers import neuronx_double, tiny_settings


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with neuronx_double():
        return compile_artifact(tiny_settings(), CompileOptions(lnc=2), tmp_path_factory.mktemp("c")).artifact_dir


@pytest.fixture()
def neuron_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LNC_ENV, "2")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0")


def build(artifact: Path, weights: str) -> ImageEmbedActor:
    with neuronx_double():
        return ImageEmbedActor(tiny_settings(backend="neuron", artifact_dir=str(artifact)), "tiny-siglip",
                               weights=weights)


def test_the_encoder_starts_when_the_artifact_holds_the_jobs_weights(artifact: Path, neuron_core: None) -> None:
    actor = build(artifact, tiny_settings().weights_source)  # the weights it was compiled from: random(seed=0)
    assert actor.embed_dim == 64


@pytest.mark.parametrize("weights", ["pretrained:webli", "random(seed=1)", "checkpoint-sha256:" + "0" * 64])
def test_an_artifact_of_other_weights_is_refused_naming_both(artifact: Path, neuron_core: None, weights: str) -> None:
    with pytest.raises(ArtifactWeightsMismatch) as refused:
        build(artifact, weights)
    message = str(refused.value)
    assert f"artifact {artifact} was compiled from random(seed=0)" in message
    assert f"this job's shards are named for {weights}" in message and "mixes two models" in message


def test_a_checkpoint_is_matched_by_its_files_digest_not_its_path() -> None:
    """A checkpoint's path differs between the compile host and the job's driver; its content does not. (tiny-siglip
    takes no checkpoint, so the description is the shape an artifact tower's describe() has, checked above.)"""
    digest = "ab" * 32
    described = {"artifact_dir": "/artifacts/x", "manifest": {"weights": "checkpoint:/build/so400m.pt",
                                                              "weights_sha256": digest[:16]}}
    check_artifact_weights(described, "checkpoint-sha256:" + digest)
    with pytest.raises(ArtifactWeightsMismatch):
        check_artifact_weights(described, "checkpoint-sha256:" + "cd" * 32)
    check_artifact_weights({"backend": "cpu"}, "pretrained:webli")  # no artifact: built from the job's weights
