"""SigLIP 2 NaFlex's geometry and the one array an image becomes on its way to the encoder.

A NaFlex model keeps each image's aspect ratio: transformers' `Siglip2ImageProcessor` resizes it so that its
grid of patches fits a patch budget (`max_num_patches`), cuts it into patches and pads them to exactly the
budget, with a mask of the real patches and the grid (`spatial_shapes`). A (batch, budget) bucket is then one
static shape whatever the images' shapes.

Here the ingress makes of each image one uint8 array [budget + 1, 3 * patch * patch]: its patches, in the
processor's order, zero past the grid, and a last row holding the grid (rows and columns, two bytes each), so an
image still travels, stacks and pads as one array as every other model's does. The encoder reads the grid back
(models/naflex_vision.py) for the mask and the position embeddings. Torch-free: the ingress imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from siglip_serve.core.errors import ModelLoadError

# Bytes of the grid row: rows, then columns, each a little-endian uint16 (a grid side is at most a budget).
_GRID_BYTES = 4
MAX_BUDGET = 65535


@dataclass(frozen=True)
class NaflexLayout:
    """A NaFlex model's patch geometry, decided once from its repository (models/hub_repo.py): its patch side,
    its learned position grid (`position_grid` x `position_grid`), the processor's default budget and the
    budgets served (the default first, then any configured)."""

    patch_size: int
    position_grid: int
    default_budget: int
    budgets: tuple[int, ...]
    channels: int = 3

    @property
    def patch_values(self) -> int:
        """Values per patch: patch x patch x channels, as the processor flattens a patch."""
        return self.patch_size * self.patch_size * self.channels

    def array_shape(self, budget: int) -> tuple[int, int]:
        """The per-image array of `budget`: its patch rows and the grid row."""
        return (budget + 1, self.patch_values)

    def budget_of(self, shape: tuple[int, ...]) -> int | None:
        """The budget whose per-image array has `shape` (an image's or, after the batch axis, a batch's); None
        where no served budget has it."""
        if len(shape) != 2 or shape[1] != self.patch_values:
            return None
        return shape[0] - 1 if shape[0] - 1 in self.budgets else None

    def with_budgets(self, extra: tuple[int, ...]) -> NaflexLayout:
        """The layout with the configured budgets served beside the default."""
        budgets = (self.default_budget, *sorted(set(extra) - {self.default_budget}))
        return NaflexLayout(self.patch_size, self.position_grid, self.default_budget, budgets, self.channels)


def size_for_budget(height: int, width: int, patch_size: int, budget: int, eps: float = 1e-5) -> tuple[int, int]:
    """The (height, width) transformers' processor resizes an image to: the largest scale, found by its binary
    search, at which both sides rounded up to whole patches (at least one) make at most `budget` patches.
    transformers' `get_image_size_for_max_num_patches`, step for step, so the grids agree."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while (high - low) >= eps:
        scale = (low + high) / 2
        patches = (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size)
        if patches <= budget:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def pack_patches(image: np.ndarray, layout: NaflexLayout, budget: int) -> np.ndarray:
    """uint8 [3, H, W] (H, W whole patches, at most `budget` of them) -> uint8 [budget + 1, patch values]: the
    processor's patch order (row by row; within a patch, pixel by pixel, channels last), zero past the grid, the
    grid in the last row."""
    channels, height, width = image.shape
    side = layout.patch_size
    rows, columns = height // side, width // side
    if rows * side != height or columns * side != width or rows * columns > budget:
        raise ValueError(f"an image of {height}x{width} is not a grid of at most {budget} patches of {side}")
    patches = image.reshape(channels, rows, side, columns, side).transpose(1, 3, 2, 4, 0)
    out = np.zeros(layout.array_shape(budget), dtype=np.uint8)
    out[: rows * columns] = patches.reshape(rows * columns, -1)
    out[budget, :_GRID_BYTES] = np.frombuffer(np.array([rows, columns], dtype="<u2").tobytes(), dtype=np.uint8)
    return out


def grids(batch: np.ndarray) -> np.ndarray:
    """int64 [B, 2] (rows, columns) of a batch of packed arrays [B, budget + 1, patch values]."""
    raw = np.ascontiguousarray(batch[:, -1, :_GRID_BYTES])
    return raw.view("<u2").astype(np.int64).reshape(-1, 2)


def served_layout(layout: NaflexLayout | None, budgets: tuple[int, ...], model: str) -> NaflexLayout | None:
    """The layout a model is served with: its own budget and the configured `patch_budgets`; ModelLoadError (one
    line) where budgets are configured for a model that is not NaFlex (a repository's kind is known once read)."""
    if layout is None:
        if budgets:
            raise ModelLoadError(f"patch_budgets {list(budgets)} are for SigLIP 2 NaFlex models; {model} takes one "
                                 "fixed image size")
        return None
    return layout.with_budgets(budgets)

