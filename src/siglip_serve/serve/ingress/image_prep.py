"""A request's images, from what the client sent to the uint8 stack the encoder takes.

Every item (file bytes, or a JSON string: data URI or bare base64, parsed by serve/http/http_body.py)
has its header read and its limits checked first, then the request's pixels together, and only
then is anything decoded: by models/preprocess.py, on the fair decode queue (serve/ingress/decode_queue.py)
within its memory budget. A rejected image is answered through serve/http/errors.py's table, its
message naming the item; the other decodes of that request are dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.naflex import NaflexLayout
from siglip_serve.models.preprocess import ImageHeader, preprocess_image, probe_image
from siglip_serve.serve.http.errors import ApiError, ErrorType, rejection_error
from siglip_serve.serve.http.http_body import decode_base64_image
from siglip_serve.serve.ingress.decode_queue import FairDecodeQueue
from siglip_serve.serve.plan.replica_slices import ModelFront

# Up to this much input a request's headers are read on the event loop: a ~70 KB photo's base64 and
# header cost ~40 us there, a hop to a thread ~80 us of CPU. Larger inputs (a PNG's metadata chunks
# are read up to its pixels) go to a thread, so the loop never stalls for long.
INLINE_PROBE_BYTES = 1024 * 1024


# What the device decoder reads as the host does: CMYK, MPO and other JPEGs decode on the host.
DEVICE_JPEG_MODES = ("RGB", "L")


class ImagePrep:
    def __init__(self, front: ModelFront, image_size: tuple[int, int],
                 observe_seconds: Callable[[float], None], resample: str = "bicubic",
                 naflex: NaflexLayout | None = None) -> None:
        self.front = front
        self.image_size = image_size
        self.resample = resample  # the model's processor's filter (models/model_info.py)
        # A NaFlex model's images keep their aspect ratio: each becomes its packed patches of a budget
        # (models/naflex_prep.py), after the same header checks and within the same decode budget.
        self.naflex = naflex
        self.limits = front.image_limits
        self.decoder = FairDecodeQueue(front.decode_threads, front.decode_memory_budget_bytes)
        self._observe_seconds = observe_seconds  # siglip_preprocess_seconds
        if front.fast_jpeg_decode:
            from siglip_serve.models import fast_resize

            fast_resize.warm()

    def file_bytes(self, items: Sequence[bytes | str], labels: Sequence[str]) -> list[bytes]:
        """Every item's image file bytes (a data URI or base64 undone; the byte limit checked); nothing decoded."""
        out = []
        for item, label in zip(items, labels, strict=True):
            try:
                out.append(decode_base64_image(item, self.limits) if isinstance(item, str) else item)
            except ApiError as exc:
                raise rejection_error(exc, label) from None
        return out

    def probe(self, items: Sequence[bytes | str], labels: Sequence[str]) -> list[tuple[bytes, ImageHeader]]:
        """Every item's bytes and header, every header-level limit checked; no pixel decoded."""
        out = []
        for item, label in zip(items, labels, strict=True):
            try:
                raw = decode_base64_image(item, self.limits) if isinstance(item, str) else item
                out.append((raw, probe_image(raw, self.limits)))
            except (ImageRejected, ApiError) as exc:
                raise rejection_error(exc, label) from None
        total = sum(header.pixels for _, header in out)
        if total > self.front.max_request_pixels:
            raise ApiError(413, ErrorType.IMAGE_TOO_LARGE,
                           f"the request's {len(out)} images hold {total / 1e6:.1f} megapixels together, over the "
                           f"{self.front.max_request_pixels / 1e6:g} megapixel per-request limit; "
                           "send fewer per request")
        return out

    def _prepare(self, raw: bytes, budget: int | None = None) -> np.ndarray:
        began = time.perf_counter()
        if self.naflex is not None:
            from siglip_serve.models.naflex_prep import naflex_image

            array = naflex_image(raw, self.naflex, budget or self.naflex.default_budget, self.limits, self.resample)
        else:
            array = preprocess_image(raw, self.image_size, self.limits, self.front.fast_jpeg_decode, self.resample)
        self._observe_seconds(time.perf_counter() - began)
        return array

    async def prepare_all(self, items: Sequence[bytes | str], labels: Sequence[str],
                          budget: int | None = None) -> np.ndarray | JpegFiles:
        """uint8 [N, 3, H, W] of the request's images in order (a NaFlex model's: [N, budget + 1, patch values] of
        `budget`, default its own), or the first rejected image's ApiError. With `device_jpeg_decode`, a request of
        only 8-bit RGB or grey JPEGs goes on undecoded (JpegFiles)."""
        if sum(len(item) for item in items) <= INLINE_PROBE_BYTES:
            probed = self.probe(items, labels)
        else:
            probed = await asyncio.to_thread(self.probe, items, labels)
        # The device decoder resizes bicubic only: a model whose processor says another filter decodes here.
        device = self.front.device_jpeg_decode and self.resample == "bicubic" and self.naflex is None
        if device and all(header.format == "JPEG" and header.mode in DEVICE_JPEG_MODES for _, header in probed):
            return JpegFiles(tuple(raw for raw, _ in probed))
        turn = object()  # this request's queue in the fair decode queue
        tasks = [asyncio.ensure_future(self.decoder.run(turn, partial(self._prepare, raw, budget), header.decode_bytes))
                 for raw, header in probed]
        arrays = []
        try:
            for task, label in zip(tasks, labels, strict=True):
                try:
                    arrays.append(await task)
                except ImageRejected as exc:
                    raise rejection_error(exc, label) from None
        finally:
            # A rejected image, an error, the deadline or a client gone: the other decodes are not needed.
            for task in tasks:
                task.cancel()
        return np.stack(arrays)
