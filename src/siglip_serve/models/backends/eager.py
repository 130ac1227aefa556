"""What the two eager backends (cpu, cuda) share: each tower's model comes from open_clip (the
checkpoint, pretrained weights, an open_clip hub repository or seeded random ones) or from a transformers
repository (models/model_towers.py) and is handed to the backend's one Runner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn

from siglip_serve.core.backends import IMAGE
from siglip_serve.models.encoder import Encoder
from siglip_serve.models.model_towers import image_model, text_model
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEncoder
from siglip_serve.models.tower import Runner, Tower

# (the tower's model, its buckets, a zero batch of one bucket) -> the backend's runner.
EagerRunner = Callable[[nn.Module, Sequence[int], Callable[[int], torch.Tensor]], Runner]


def eager_tower(settings: ModelSettings, tower: str, runner: EagerRunner) -> Tower:
    """The tower's model (float32, eval mode, on the CPU) on the runner the backend makes of it."""
    if tower == IMAGE:
        embedder, info = image_model(settings)
        if info.naflex is not None:
            from siglip_serve.models.naflex_vision import NaflexEncoder, NaflexVision, PositionCache

            assert isinstance(embedder, NaflexVision)
            return NaflexEncoder(info, settings.buckets, partial(runner, embedder),
                                 PositionCache(embedder.position_table()))
        return Encoder(info, settings.buckets, partial(runner, embedder))
    text, tokenizer, model_info = text_model(settings)
    return TextEncoder(tokenizer, model_info, settings.text_buckets, partial(runner, text))
