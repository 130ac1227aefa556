"""What the two Neuron backends share: a compiled artifact found from the settings and checked
against them, the ModelInfo its manifest describes, and a Runner that reports the artifact.

The trace line (backends/neuron.py) and TorchNeuron (backends/neuron_native.py) differ in what
their manifests add to neuron.manifest.ArtifactManifest, in their refusals (both a
neuron.base.NeuronRefusal) and in how they load; they agree on this shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from siglip_serve.core.backends import IMAGE
from siglip_serve.models.backends.artifact_volume import volume_refusal
from siglip_serve.models.loading import ModelInfo
from siglip_serve.models.neuron.manifest import ArtifactManifest
from siglip_serve.models.neuron.sdk import VISIBLE_CORES_ENV
from siglip_serve.models.neuron.text import checked_text_entry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import Runner

M = TypeVar("M", bound=ArtifactManifest)


def checked_artifact(settings: ModelSettings, backend: str, compile_command: str, read: Callable[[Path], M],
                     refuse: Callable[[str], Exception]) -> tuple[Path, M]:
    """The artifact directory (absolute) and its manifest, which must hold the model and every bucket
    asked for; otherwise `refuse(message)` is raised, the message saying what to do."""
    if settings.artifact_dir is None:
        raise refuse(f"the {backend} backend needs artifact_dir (--artifact-dir): a directory written by "
                     f"`{compile_command}`")
    directory = Path(settings.artifact_dir).expanduser().resolve()
    if (message := volume_refusal(directory)) is not None:
        raise refuse(message)
    manifest = read(directory)
    if manifest.model != settings.model:
        raise refuse(f"artifact {directory} holds {manifest.model} but the config asks for {settings.model}; "
                     f"set model: {manifest.model} or compile {settings.model}")
    missing = [b for b in settings.buckets if b not in manifest.buckets]
    if missing:
        raise refuse(f"buckets {missing} are not in artifact {directory} (compiled: {manifest.buckets}); "
                     f"serve a subset of them or compile with --buckets {','.join(map(str, settings.buckets))}")
    return directory, manifest


class ArtifactChecks:
    """The checks both lines make of their artifact before a replica starts, without an SDK."""

    def __init__(self, artifact: Callable[[ModelSettings], tuple[Path, ArtifactManifest]],
                 compile_command: str) -> None:
        self.artifact = artifact
        self.compile_command = compile_command

    def check_tower(self, settings: ModelSettings, tower: str) -> None:
        """The artifact holds this model and buckets; for the text tower, its text graphs too."""
        directory, manifest = self.artifact(settings)
        if tower != IMAGE:
            checked_text_entry(settings, directory, manifest.text, self.compile_command)

    def compiled_for(self, settings: ModelSettings) -> dict[str, Any]:
        """Its LNC, and the trace line's auto-cast (what the seed's rows differ by)."""
        manifest = self.artifact(settings)[1]
        return {"lnc": manifest.lnc, "auto_cast": getattr(manifest, "auto_cast", None)}


def manifest_model_info(manifest: ArtifactManifest) -> ModelInfo:
    """The model an artifact was compiled from, as /v1/models shows it."""
    return ModelInfo(manifest.model, manifest.embed_dim, (manifest.image_size[0], manifest.image_size[1]),
                     str(manifest.weights.get("source")))


class ArtifactRunner(Runner):
    """A compiled artifact's buckets of one tower on the NeuronCore(s) of NEURON_RT_VISIBLE_CORES."""

    static_shapes = True

    def __init__(self, directory: Path, manifest: ArtifactManifest, lnc: int, visible_cores: str | None = None) -> None:
        self.directory = directory
        self.manifest = manifest
        self.lnc = lnc
        self.visible_cores = os.environ.get(VISIBLE_CORES_ENV) if visible_cores is None else visible_cores

    def artifact_details(self) -> dict[str, Any]:
        """What a backend adds to describe() before the manifest's summary."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"lnc": self.lnc, "artifact_dir": str(self.directory), "neuron_rt_visible_cores": self.visible_cores,
                **self.artifact_details(), "manifest": self.manifest.summary()}
