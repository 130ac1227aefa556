"""The image tower's interface (`Encoder`, a models/tower.py `Tower`) and the one backend registry:
each backend registers both towers and its checks together (`Backend`).

An encoder takes uint8 images [B, 3, H, W] and returns L2-normalised float32 embeddings [B, D].
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.loading import ModelInfo
from siglip_serve.models.settings import BACKENDS, ModelSettings
from siglip_serve.models.tower import ForwardHook, Tower

if TYPE_CHECKING:  # models/text.py imports this module
    from siglip_serve.models.text import TextEncoder

log = logging.getLogger(__name__)


class EncoderInputError(ValueError):
    """A batch that does not have the shape or dtype the compiled model takes."""


class Encoder(Tower):
    """The image tower on one device: uint8 images [B, 3, H, W] -> float32 [B, D], L2-normalised."""

    tower = "image"

    def __init__(self, info: ModelInfo, buckets: Sequence[int]) -> None:
        super().__init__(buckets, info.embed_dim)
        self.info = info

    @property
    def image_size(self) -> tuple[int, int]:
        return self.info.image_size

    def example(self, bucket: int) -> torch.Tensor:
        height, width = self.image_size
        return torch.zeros((bucket, 3, height, width), dtype=torch.uint8)

    def check_input(self, images: np.ndarray | torch.Tensor) -> None:
        height, width = self.image_size
        if images.dtype not in (np.uint8, torch.uint8):
            raise EncoderInputError(f"images must be uint8, got {images.dtype}")
        if tuple(images.shape[1:]) != (3, height, width):
            raise EncoderInputError(
                f"images must be [B, 3, {height}, {width}], got {list(images.shape)}"
            )

    def encode(self, images: np.ndarray | torch.Tensor, on_forward: ForwardHook | None = None) -> np.ndarray:
        """uint8 [B, 3, H, W] -> float32 [B, D], L2-normalised, in input order."""
        self.check_input(images)
        return self.run_batch(torch.as_tensor(images), on_forward)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "buckets": list(self.buckets), "static_shapes": self.static_shapes,
                **self.info.as_dict()}


EncoderFactory = Callable[[ModelSettings], Encoder]


@dataclass(frozen=True)
class Backend:
    """One backend: its two towers and its checks, registered together by its module on import
    (models/backends/<name>.py). `text` None: this backend serves images only."""

    image: EncoderFactory
    text: Callable[[ModelSettings], TextEncoder] | None = None
    # Before any Ray process starts: can this machine run it? `env`: what the replicas will see (None:
    # joining a cluster started elsewhere, skip what depends on it).
    check_available: Callable[[ModelSettings, Mapping[str, str] | None], None] | None = None
    # Environment its replica needs before it imports torch (Ray runtime_env).
    replica_env: Callable[[ModelSettings], Mapping[str, str]] | None = None
    # Before any replica starts: does the artifact hold the text graphs asked for (no SDK needed)?
    check_text_artifact: Callable[[ModelSettings], None] | None = None


# Backends load lazily: importing the registry must not import CUDA or Neuron code. Backend
# `name` lives in models/backends/<name with _ for ->.py; the names are siglip_serve.models.settings.BACKENDS.
_BACKEND_MODULES = {name: f"siglip_serve.models.backends.{name.replace('-', '_')}" for name in BACKENDS}
_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, backend: Backend) -> None:
    _BACKENDS[name] = backend


def backend_names() -> list[str]:
    return sorted(set(_BACKEND_MODULES) | set(_BACKENDS))


def backend(name: str) -> Backend:
    if name not in _BACKENDS:
        module = _BACKEND_MODULES.get(name)
        if module is None:
            raise ValueError(f"unknown backend {name!r}; choose from {backend_names()}")
        importlib.import_module(module)
    return _BACKENDS[name]


def create_encoder(settings: ModelSettings) -> Encoder:
    return backend(settings.backend).image(settings)


def text_backend(name: str) -> Callable[[ModelSettings], TextEncoder]:
    factory = backend(name).text
    if factory is None:
        raise BackendUnavailable(f"the {name!r} backend has no text tower; set text_replicas: 0, or serve text "
                                 "from cpu, cuda, neuron or neuron-native")
    return factory


def create_text_encoder(settings: ModelSettings) -> TextEncoder:
    return text_backend(settings.backend)(settings)


def check_text_artifact(settings: ModelSettings) -> None:
    """Before any replica starts: a compiled artifact must hold the text graphs of every text bucket.
    Reads only the manifest (no SDK), so the service refuses in one line instead of text replicas
    that die at start while Serve retries them."""
    text_backend(settings.backend)
    check = backend(settings.backend).check_text_artifact
    if check is not None:
        check(settings)


def check_backend_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """Raise BackendUnavailable (one line) if this machine cannot run `settings.backend`.

    Called before any Ray process starts, so a missing SDK or GPU fails in a second, not after the
    replicas have tried."""
    check = backend(settings.backend).check_available
    if check is not None:
        check(settings, env)


def backend_replica_env(settings: ModelSettings) -> dict[str, str]:
    """Environment a backend needs set before its replica process imports torch (Ray runtime_env)."""
    hook = backend(settings.backend).replica_env
    return dict(hook(settings)) if hook is not None else {}
