"""The image tower (`Encoder`, a models/tower.py `Tower`): uint8 images [B, 3, H, W] in, L2-normalised
float32 embeddings [B, D] out, on any backend's Runner. The backends and their registry are in
models/backends/ (`registry.create_encoder` builds one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from siglip_serve.models.loading import ModelInfo
from siglip_serve.models.tower import ForwardHook, RunnerFactory, Tower


class EncoderInputError(ValueError):
    """A batch that does not have the shape or dtype the compiled model takes."""


class Encoder(Tower):
    """The image tower on one device: uint8 images [B, 3, H, W] -> float32 [B, D], L2-normalised."""

    tower = "image"

    def __init__(self, info: ModelInfo, buckets: Sequence[int], runner: RunnerFactory) -> None:
        self.info = info  # before the runner: it takes example() batches of this image size
        super().__init__(buckets, info.embed_dim, runner)

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
        return {**super().describe(), "buckets": list(self.buckets), **self.info.as_dict()}
