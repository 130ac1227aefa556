"""The Neuron backend: a compiled artifact (siglip_serve.models.neuron.trace) on the logical NeuronCore(s) in
NEURON_RT_VISIBLE_CORES, one TorchScript per batch bucket of each tower, run by one Runner.

Order of checks, each failing with one clear line: the SDK is really there; the artifact is complete
and holds this model and these buckets (and, for text, its text graphs); the runtime's LNC equals
the artifact's (seed 000's "Cannot run Neff ... Logical Core Size" otherwise). Only then is anything loaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from siglip_serve.core.backends import IMAGE
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.compiled import ArtifactChecks, ArtifactRunner, checked_artifact, manifest_model_info
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.encoder import Encoder
from siglip_serve.models.neuron.base import NeuronRefusal
from siglip_serve.models.neuron.manifest import ArtifactError, Manifest, read_manifest
from siglip_serve.models.neuron.sdk import VISIBLE_CORES_ENV, check_lnc, require_torch_neuronx
from siglip_serve.models.neuron.text import checked_text_entry, text_info_from_entry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEncoder
from siglip_serve.models.tower import Tower

log = logging.getLogger(__name__)


def artifact_for(settings: ModelSettings) -> tuple[Path, Manifest]:
    """The artifact directory and its manifest, checked against the model and buckets asked for."""
    return checked_artifact(settings, "neuron", "siglip-serve compile", read_manifest, ArtifactError)


class NeuronRunner(ArtifactRunner):
    """One tower's traced buckets, bucket -> TorchScript loaded onto this process's NeuronCore(s)."""

    backend = "neuron"
    manifest: Manifest

    def __init__(self, files: Mapping[int, Path], directory: Path, manifest: Manifest, lnc: int) -> None:
        super().__init__(directory, manifest, lnc)
        cores = os.environ.get(VISIBLE_CORES_ENV)
        if cores is None:
            log.warning("%s is unset: the Neuron runtime reserves every NeuronCore for this process", VISIBLE_CORES_ENV)
        self.models: dict[int, torch.nn.Module] = {}
        for bucket, path in sorted(files.items()):
            began = time.monotonic()
            self.models[bucket] = torch.jit.load(str(path))
            log.info("loaded bucket %d from %s on NeuronCore(s) %s in %.1f s", bucket, path, cores or "all",
                     time.monotonic() - began)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        # no_grad as at trace time; inference_mode is what the Neuron (XLA) graphs do not accept.
        with torch.no_grad():
            return self.models[int(batch.shape[0])](batch)


def build(settings: ModelSettings, tower: str, env: Mapping[str, str] | None = None) -> Tower:
    require_torch_neuronx()  # also registers the Neuron ops TorchScript needs before torch.jit.load
    directory, manifest = artifact_for(settings)
    lnc = check_lnc(manifest.lnc, str(directory), env, manifest.target)
    if tower == IMAGE:
        info = manifest_model_info(manifest)
        if info.weights != settings.weights_source:
            log.warning("the artifact was compiled from %s; the config's weights (%s) are not used by the neuron "
                        "backend", info.weights, settings.weights_source)
        files = {b: manifest.bucket_path(directory, b) for b in settings.buckets}
        return Encoder(info, settings.buckets, lambda buckets, example: NeuronRunner(files, directory, manifest, lnc))
    checked_text_entry(settings, directory, manifest.text, "siglip-serve compile")
    tokenizer, text_info = text_info_from_entry(settings, manifest.model, manifest.text)
    text_files = {b: directory / manifest.text["files"][str(b)] for b in settings.text_buckets}
    return TextEncoder(tokenizer, text_info, settings.text_buckets,
                       lambda buckets, example: NeuronRunner(text_files, directory, manifest, lnc))


def check_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """The serving CLI's check before Ray starts: SDK, artifact, and (with `env`) the LNC."""
    require_torch_neuronx()
    try:
        directory, manifest = artifact_for(settings)
        if env is not None:
            check_lnc(manifest.lnc, str(directory), env, manifest.target)
    except NeuronRefusal as exc:
        raise BackendUnavailable(str(exc)) from None


CHECKS = ArtifactChecks(artifact_for, "siglip-serve compile")


IMPLEMENTATION = Implementation(build=build, check_available=check_available, check_tower=CHECKS.check_tower,
                                compiled_for=CHECKS.compiled_for)
