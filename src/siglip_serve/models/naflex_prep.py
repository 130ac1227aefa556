"""A NaFlex model's image preprocessing: image file bytes to the packed array of models/naflex.py, as transformers'
Siglip2ImageProcessor resizes and patchifies (its rescale and normalisation are in the graph). Torch-free: the
ingress and bulk's decode tasks run it."""

from __future__ import annotations

import numpy as np

from siglip_serve.models.naflex import NaflexLayout, pack_patches, size_for_budget
from siglip_serve.models.preprocess import ImageLimits, decode_image, resize_to_array


def naflex_image(data: bytes, layout: NaflexLayout, budget: int, limits: ImageLimits = ImageLimits(),
                 resample: str = "bilinear") -> np.ndarray:
    """Image file bytes -> its packed array of `budget` (`pack_patches`): decoded and checked as every image is
    (models/preprocess.py: the header's limits before any pixel), resized with the processor's filter to the grid
    its processor would choose."""
    if budget not in layout.budgets:
        raise ValueError(f"budget {budget} is not served (served: {list(layout.budgets)})")
    image = decode_image(data, limits)
    height, width = size_for_budget(image.height, image.width, layout.patch_size, budget)
    return pack_patches(resize_to_array(image, (height, width), resample=resample), layout, budget)
