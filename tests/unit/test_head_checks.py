"""Nothing on the head reads the model's files or the hub (issue 41): the app's builder checks the config's
shape only, and each replica (or bulk actor) sets its backend's environment, finds its weights and builds
its tower on its own node, refusing in one line that names the node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siglip_serve.core.backends import backend_record
from siglip_serve.core.constants import LNC_ENV
from siglip_serve.models.backends.implementation import apply_replica_env
from siglip_serve.models.loading import ModelLoadError
from siglip_serve.models.neuron.env import CC_FLAGS_ENV, NEFF_CACHE_ENV
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.app import build_app_with_routes
from siglip_serve.serve.plan.policy import policy_of
from tests.helpers import REPO


@pytest.mark.parametrize("backend", ["neuron", "neuron-native"])
def test_a_backend_that_reads_an_artifact_never_asks_for_weights(backend: str) -> None:
    assert backend_record(backend).reads_artifact
    settings = ModelSettings(model="ViT-B-16-SigLIP", pretrained="webli", backend=backend, artifact_dir="/nowhere")
    assert not settings.needs_weights
    assert ModelSettings(model="ViT-B-16-SigLIP", pretrained="webli").needs_weights  # cpu reads them


@pytest.mark.parametrize("args", [
    # Pretrained weights, the hub unreachable, no cache, no artifact here: the artifact holds the model.
    {"backend": "neuron"},
    # The text tower's artifact and the replicas' environment are the workers' to read.
    {"backend": "neuron-native", "text_replicas": 1},
])
def test_the_builder_reads_no_artifact_no_weights_and_no_hub(args: dict[str, object], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    app = build_app_with_routes({"model": "ViT-B-16-SigLIP", "pretrained": "webli", "replicas": 1,
                                 "artifact_dir": str(tmp_path / "only-on-the-workers"), **args})
    assert app is not None
    assert not (tmp_path / "empty-cache").exists()


def test_the_builder_leaves_text_off_by_default_where_only_a_worker_could_find_the_tokenizer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from siglip_serve.serve.app import text_by_shape
    from siglip_serve.serve.plan.config import ServiceConfig

    config = ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "random_weights": True})
    text_off = text_by_shape(config)
    assert "text_replicas: 1" in (text_off or "") and policy_of(config, text_off).text_replicas == 0
    assert text_by_shape(ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "random_weights": True,
                                                  "text_replicas": 1})) is None
    assert text_by_shape(ServiceConfig.from_args({"model": "tiny-siglip"})) is None  # bundled


def test_the_replica_modules_import_no_torch() -> None:
    """A replica's module is imported before its constructor runs, and the constructor sets the backend's
    environment (TorchNeuron reads it when torch is imported): no torch before then."""
    code = ("import sys\nimport siglip_serve.serve.towers.image_deployment, siglip_serve.serve.towers.text_deployment, "
            "siglip_serve.bulk.stages, siglip_serve.serve.towers.replica_start\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True)
    assert out.stdout.strip() == "False", out.stderr


def _native_manifest(directory: Path) -> Path:
    directory.mkdir()
    (directory / "manifest.json").write_text(json.dumps({"line": "neuron-native", "recipe_env": {
        LNC_ENV: "2", CC_FLAGS_ENV: "--target trn2 --lnc 2", "NEURON_COMPILER_OPT_LEVEL": "-O1"}}))
    return directory


def test_a_neuron_native_replica_sets_the_artifacts_environment_itself_keeping_the_configs_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = _native_manifest(tmp_path / "artifact")
    for key in (LNC_ENV, CC_FLAGS_ENV, NEFF_CACHE_ENV, "NEURON_COMPILER_OPT_LEVEL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(LNC_ENV, "1")  # the config's env_vars said so (Ray set it): kept, refused later, naming both
    settings = ModelSettings(model="tiny-siglip", backend="neuron-native", artifact_dir=artifact)
    applied = apply_replica_env(settings, keep=[LNC_ENV])
    assert applied == {CC_FLAGS_ENV: "--target trn2 --lnc 2", "NEURON_COMPILER_OPT_LEVEL": "-O1",
                       NEFF_CACHE_ENV: str(artifact.resolve() / "neff")}
    assert os.environ[LNC_ENV] == "1" and os.environ[CC_FLAGS_ENV] == "--target trn2 --lnc 2"


def test_a_replica_that_cannot_start_refuses_in_one_line_naming_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.serve.towers import replica_start

    monkeypatch.setattr(replica_start.socket, "gethostname", lambda: "worker-7")
    seen: list[str] = []

    def build() -> None:
        raise ModelLoadError("cannot load the tokenizer from /models/tok (OSError); set tokenizer: DIR\nto a copy")

    with pytest.raises(replica_start.ReplicaRefused) as err:
        replica_start.start_tower("text encoder replica", ModelSettings(model="tiny-siglip"), build,
                                  on_refusal=seen.append)
    message = str(err.value)
    assert message.startswith("text encoder replica on node worker-7")
    assert "refused to start: cannot load the tokenizer" in message and "set tokenizer: DIR" in message
    assert "\n" not in message and seen == [message]
