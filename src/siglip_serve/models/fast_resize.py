"""The service's resize (`fast_jpeg_decode`, on by default): Pillow's antialiased bicubic, run by ATen's uint8 kernel.

Pillow resamples in fixed point one pixel at a time; ATen's `interpolate(mode="bicubic", antialias=True)` on a uint8
tensor runs the same separable filter (Pillow's support and coefficients: the kernel was ported from Pillow-SIMD,
aten/src/ATen/native/cpu/UpSampleKernelAVXAntialias.h) with AVX2, and rounds its sums its own way, so a pixel may
differ from Pillow's by a level or two. Embeddings stay within the tolerance docs/preprocessing.md states for the
fast path (tests/unit/test_loading.py compares both paths with open_clip's on real photos). Where there is no AVX2
ATen falls back to its generic kernel: slower, the same tolerance.

torch is imported on the first call, not with this module, and only where the fast path is on (`fast_jpeg_decode:
false` keeps Pillow's exact pixels and no torch). An ingress warms it as it starts (`warm`), in its constructor: its
first image does not wait for the import, and the import's CPU is the replica's start, which the ingress's
autoscaling signal leaves out (serve/plan/ingress_scaling.py BusyCores), not load.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def resize_uint8(img: Image.Image, height: int, width: int) -> np.ndarray:
    """RGB (or opaque "L") image -> uint8 [3, height, width], Pillow's bicubic squash resize within a level or two."""
    import torch
    import torch.nn.functional as functional

    # Writable, so torch does not warn; HWC viewed as NCHW is the channels-last layout the AVX2 kernel reads.
    pixels = torch.from_numpy(np.array(img, dtype=np.uint8))
    batch = pixels[None, None] if pixels.ndim == 2 else pixels.permute(2, 0, 1)[None]
    with torch.inference_mode():
        out = functional.interpolate(batch, size=(height, width), mode="bicubic", antialias=True, align_corners=False)
    planes = out[0].numpy()
    if planes.shape[0] == 1:  # per-band resampling: the grey plane is each of R, G and B
        return np.ascontiguousarray(np.broadcast_to(planes, (3, height, width)))
    return np.ascontiguousarray(planes)


def warm() -> None:
    """Import torch and run the kernel once."""
    resize_uint8(Image.new("RGB", (8, 8)), 4, 4)
