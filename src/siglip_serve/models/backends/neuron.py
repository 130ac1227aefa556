"""The Neuron backend: a compiled artifact (siglip_serve.models.neuron.trace) on the logical NeuronCore(s) in
NEURON_RT_VISIBLE_CORES, one TorchScript per batch bucket.

Order of checks, each failing with one clear line: the SDK is really there; the artifact is complete
and holds this model and these buckets; the runtime's LNC equals the artifact's (seed 000's
"Cannot run Neff ... Logical Core Size" otherwise). Only then is anything loaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.compiled import ArtifactEncoder, checked_artifact, manifest_model_info
from siglip_serve.models.encoder import Backend, register_backend
from siglip_serve.models.loading import ModelInfo
from siglip_serve.models.neuron.base import NeuronRefusal
from siglip_serve.models.neuron.manifest import ArtifactError, Manifest, read_manifest
from siglip_serve.models.neuron.sdk import VISIBLE_CORES_ENV, check_lnc, require_torch_neuronx
from siglip_serve.models.neuron.text import checked_text_entry, text_info_from_entry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEncoder, TextInfo, Tokenizer

log = logging.getLogger(__name__)


def artifact_for(settings: ModelSettings) -> tuple[Path, Manifest]:
    """The artifact directory and its manifest, checked against the model and buckets asked for."""
    return checked_artifact(settings, "neuron", "siglip-serve compile", read_manifest, ArtifactError)


class NeuronEncoder(ArtifactEncoder):
    backend = "neuron"
    manifest: Manifest

    def __init__(self, models: dict[int, torch.nn.Module], info: ModelInfo, directory: Path,
                 manifest: Manifest, lnc: int) -> None:
        super().__init__(info, sorted(models), directory, manifest, lnc)
        self.models = models

    def _forward(self, batch: torch.Tensor) -> torch.Tensor:
        # no_grad as at trace time; inference_mode is what the Neuron (XLA) graphs do not accept.
        with torch.no_grad():
            return self.models[int(batch.shape[0])](batch)


def load_neuron_encoder(settings: ModelSettings, env: Mapping[str, str] | None = None) -> NeuronEncoder:
    require_torch_neuronx()  # also registers the Neuron ops TorchScript needs before torch.jit.load
    directory, manifest = artifact_for(settings)
    lnc = check_lnc(manifest.lnc, str(directory), env, manifest.target)
    cores = os.environ.get(VISIBLE_CORES_ENV)
    if cores is None:
        log.warning("%s is unset: the Neuron runtime reserves every NeuronCore for this process", VISIBLE_CORES_ENV)
    models: dict[int, torch.nn.Module] = {}
    for bucket in settings.buckets:
        path = manifest.bucket_path(directory, bucket)
        began = time.monotonic()
        models[bucket] = torch.jit.load(str(path))
        log.info("loaded bucket %d from %s on NeuronCore(s) %s in %.1f s", bucket, path, cores or "all",
                 time.monotonic() - began)
    info = manifest_model_info(manifest)
    if info.weights != settings.weights_source:
        log.warning("the artifact was compiled from %s; the config's weights (%s) are not used by the neuron "
                    "backend", info.weights, settings.weights_source)
    return NeuronEncoder(models, info, directory, manifest, lnc)


def check_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """The serving CLI's check before Ray starts: SDK, artifact, and (with `env`) the LNC."""
    require_torch_neuronx()
    try:
        directory, manifest = artifact_for(settings)
        if env is not None:
            check_lnc(manifest.lnc, str(directory), env, manifest.target)
    except NeuronRefusal as exc:
        raise BackendUnavailable(str(exc)) from None


def create_neuron_encoder(settings: ModelSettings) -> NeuronEncoder:
    return load_neuron_encoder(settings)


class NeuronTextEncoder(TextEncoder):
    backend = "neuron"

    def __init__(self, models: dict[int, torch.nn.Module], tokenizer: Tokenizer, info: TextInfo) -> None:
        super().__init__(tokenizer, info, sorted(models))
        self.models = models

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.models[int(ids.shape[0])](ids)


def load_neuron_text_encoder(settings: ModelSettings) -> NeuronTextEncoder:
    require_torch_neuronx()
    directory, manifest = artifact_for(settings)
    check_lnc(manifest.lnc, str(directory), None, manifest.target)
    checked_text_entry(settings, directory, manifest.text, "siglip-serve compile")
    tokenizer, info = text_info_from_entry(settings, manifest.model, manifest.text)
    models = {b: torch.jit.load(str(directory / manifest.text["files"][str(b)])) for b in settings.text_buckets}
    log.info("loaded text buckets %s from %s", sorted(models), directory)
    return NeuronTextEncoder(models, tokenizer, info)


def check_text_artifact(settings: ModelSettings) -> None:
    directory, manifest = artifact_for(settings)
    checked_text_entry(settings, directory, manifest.text, "siglip-serve compile")


register_backend("neuron", Backend(image=create_neuron_encoder, text=load_neuron_text_encoder,
                                   check_available=check_available, check_text_artifact=check_text_artifact))
