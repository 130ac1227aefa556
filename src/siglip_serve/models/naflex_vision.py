"""A SigLIP 2 NaFlex image tower as a graph of one static shape per (batch, budget) bucket.

transformers' `Siglip2VisionModel` resizes its learned position grid to each image's patch grid inside its
forward pass (`Siglip2VisionEmbeddings.resize_positional_embeddings`): a shape that follows the images, which
neither a compiled bucket nor a CUDA graph can hold. Here that resize is done on the host, once per grid
(`PositionCache`, an LRU keyed by the grid: a budget allows only a few hundred grids and photos repeat a few
aspect ratios), and the graph (`NaflexVision`) takes the position embeddings as an input beside the patches and
their mask. Everything else is transformers' own modules, called as `Siglip2VisionModel.forward` calls them.

The three inputs travel as one float32 tensor [B, budget, values + 1 + D] (the patches' uint8 values, the mask,
the position embeddings), so every backend's runner, which takes one tensor per bucket, runs it unchanged.
`NaflexEncoder` builds it from the ingress's packed arrays (models/naflex.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from siglip_serve.models.encoder import Encoder, EncoderInputError
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.models.naflex import NaflexLayout, grids, pack_patches
from siglip_serve.models.tower import ForwardHook, RunnerFactory

# Grids kept resized: every grid a budget allows is a few hundred at most, and each is budget x D floats.
POSITION_CACHE_GRIDS = 256


class NaflexVision(nn.Module):
    """float32 [B, N, values + 1 + D] (patch values 0..255, mask, position embeddings) -> float32 [B, D],
    L2-normalised: `Siglip2VisionModel`'s forward pass with the position embeddings given, the processor's
    rescale and normalisation folded in (per patch value: channels last, as the processor flattens a patch)."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, vision: nn.Module, layout: NaflexLayout, mean: Sequence[float], std: Sequence[float],
                 rescale: float) -> None:
        super().__init__()
        self.vision = vision
        self.values = layout.patch_values
        pixels = layout.patch_size * layout.patch_size
        scale = torch.tensor([rescale / s for s in std] * pixels)
        shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)] * pixels)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("shift", shift, persistent=False)

    def position_table(self) -> torch.Tensor:
        """The learned position grid [grid, grid, D], as the model reshapes it."""
        embeddings: Any = self.vision.embeddings
        weight: torch.Tensor = embeddings.position_embedding.weight
        side = embeddings.position_embedding_size
        return weight.detach().reshape(side, side, -1)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        vision: Any = self.vision
        pixels = packed[..., : self.values] * self.scale + self.shift
        mask = packed[..., self.values]
        positions = packed[..., self.values + 1:]
        patches = vision.embeddings.patch_embedding(pixels.to(vision.embeddings.patch_embedding.weight.dtype))
        hidden = patches + positions.to(patches.dtype)
        # Always materialised: a traced or captured graph must not keep the no-padding shortcut of its example.
        attention = create_bidirectional_mask(config=vision.config, inputs_embeds=hidden, attention_mask=mask,
                                              allow_is_bidirectional_skip=False)
        hidden = vision.encoder(inputs_embeds=hidden, attention_mask=attention).last_hidden_state
        hidden = vision.post_layernorm(hidden)
        pooled = vision.head(hidden, mask)
        return F.normalize(pooled.float(), dim=-1)


class PositionCache:
    """A grid's position embeddings [rows * columns, D]: the learned grid resized as transformers resizes it,
    computed once per grid and kept (least recently used dropped past `capacity`)."""

    def __init__(self, table: torch.Tensor, capacity: int = POSITION_CACHE_GRIDS) -> None:
        self.table = table.float()
        self.capacity = capacity
        self.kept: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    def __call__(self, rows: int, columns: int) -> torch.Tensor:
        key = (rows, columns)
        found = self.kept.get(key)
        if found is not None:
            self.kept.move_to_end(key)
            return found
        from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

        with torch.inference_mode():
            resized = Siglip2VisionEmbeddings.resize_positional_embeddings(
                self.table, cast(torch.LongTensor, torch.tensor([[rows, columns]])), max_length=rows * columns)[0]
        self.kept[key] = resized
        if len(self.kept) > self.capacity:
            self.kept.popitem(last=False)
        return resized


def packed_input(array: np.ndarray, layout: NaflexLayout, positions: PositionCache) -> torch.Tensor:
    """float32 [B, budget, values + 1 + D] of packed arrays uint8 [B, budget + 1, values]: the patches' values, 1
    where a patch is the image's, and its grid's position embeddings; zero past each image's grid."""
    budget = array.shape[1] - 1
    width = positions.table.shape[-1]
    out = torch.zeros((array.shape[0], budget, layout.patch_values + 1 + width), dtype=torch.float32)
    out[..., : layout.patch_values] = torch.from_numpy(array[:, :budget])
    for row, (rows, columns) in enumerate(grids(array).tolist()):
        if rows < 1 or columns < 1 or rows * columns > budget:
            raise EncoderInputError(f"image {row} of the batch has a grid of {rows}x{columns} patches, not one of 1 "
                                    f"to {budget}")
        count = rows * columns
        out[row, :count, layout.patch_values] = 1.0
        out[row, :count, layout.patch_values + 1:] = positions(rows, columns)
    return out


def blank_batch(layout: NaflexLayout, positions: PositionCache, bucket: int, budget: int) -> torch.Tensor:
    """The graph's input for `bucket` blank images of `budget`, each on the largest square grid the budget holds:
    a bucket's example (warm-up, graph capture, a compile's trace)."""
    side = max(1, math.isqrt(budget))
    image = np.zeros((layout.channels, side * layout.patch_size, side * layout.patch_size), dtype=np.uint8)
    one = pack_patches(image, layout, budget)
    return packed_input(np.repeat(one[None], bucket, axis=0), layout, positions)


class NaflexEncoder(Encoder):
    """The image tower of a NaFlex model: packed uint8 arrays [B, budget + 1, values] of one served budget in
    (models/naflex.py), float32 [B, D], L2-normalised, out. Buckets are (batch, budget): a batch holds one
    budget, and its shape is the bucket's whatever the images' grids."""

    def __init__(self, info: ModelInfo, buckets: Sequence[int], runner: RunnerFactory,
                 positions: PositionCache) -> None:
        if info.naflex is None:
            raise ValueError(f"{info.name} is not a NaFlex model")
        self.layout: NaflexLayout = info.naflex
        self.positions = positions
        super().__init__(info, buckets, runner)

    def packed(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The graph's one input for a batch of packed arrays: patch values, mask and position embeddings."""
        return packed_input(np.asarray(images), self.layout, self.positions)

    def example(self, bucket: int, budget: int | None = None) -> torch.Tensor:
        """A batch of `bucket` blank images of `budget` (default: the model's) as the graph's input."""
        return blank_batch(self.layout, self.positions, bucket, budget or self.layout.default_budget)

    def examples(self, bucket: int) -> list[torch.Tensor]:
        """A blank batch of `bucket` per served budget: every shape the bucket takes (warm-up, graph capture)."""
        return [self.example(bucket, budget) for budget in self.layout.budgets]

    def check_input(self, images: np.ndarray | torch.Tensor) -> None:
        if images.dtype not in (np.uint8, torch.uint8):
            raise EncoderInputError(f"images must be uint8, got {images.dtype}")
        if len(images.shape) != 3 or self.layout.budget_of(tuple(images.shape[1:])) is None:
            shapes = ", ".join(f"[B, {b + 1}, {self.layout.patch_values}]" for b in self.layout.budgets)
            raise EncoderInputError(f"NaFlex images must be packed patches of a served budget ({shapes}), got "
                                    f"{list(images.shape)}")

    def encode(self, images: np.ndarray | torch.Tensor, on_forward: ForwardHook | None = None) -> np.ndarray:
        """uint8 [B, budget + 1, values] -> float32 [B, D], L2-normalised, in input order."""
        self.check_input(images)
        if isinstance(images, torch.Tensor):
            images = images.cpu().numpy()
        return self.run_batch(self.packed(images), on_forward)
