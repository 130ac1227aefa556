"""`zeros-no-model`: NOT A MODEL. Every image is answered with a zero vector of the model's size.

It exists to measure the host ceiling: how many images per second the serving path (HTTP, body
parsing, decoding, Ray, batching, rendering) can carry on this host with the model taken out
(`siglip-serve bench` part `host-ceiling`, docs/capacity.md). Served against the model's own rate,
it says whether a deployment is host-bound or device-bound. It is never a default: `run` and the
Serve YAML serve it only when `backend: zeros-no-model` is written out, and say so at start and in
`GET /v1/models` (`weights: none (...)`). No weights are read; open_clip's config gives the shapes.
"""

from __future__ import annotations

import logging

import torch

from siglip_serve.core.backends import NO_MODEL_BACKEND
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.encoder import Encoder
from siglip_serve.models.loading import ModelInfo, image_geometry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import Runner, Tower

log = logging.getLogger(__name__)


class ZerosRunner(Runner):
    backend = NO_MODEL_BACKEND

    def __init__(self, embed_dim: int) -> None:
        self.embed_dim = embed_dim

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.zeros((int(batch.shape[0]), self.embed_dim), dtype=torch.float32)


def build(settings: ModelSettings, tower: str) -> Tower:
    geometry = image_geometry(settings.source)
    image_size, embed_dim = geometry.size, geometry.embed_dim
    log.warning("backend %s: NO MODEL RUNS; every image is answered with a zero vector (host ceiling only)",
                NO_MODEL_BACKEND)
    info = ModelInfo(settings.model, embed_dim, image_size, settings.weights_source, geometry.resample)
    return Encoder(info, settings.buckets, lambda buckets, example: ZerosRunner(embed_dim))


IMPLEMENTATION = Implementation(build=build)
