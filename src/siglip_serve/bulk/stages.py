"""The two Ray Data stages of a bulk job: read and decode on CPU tasks, embed on one actor per device.

Both take and give Ray Data's numpy batches (a dict of equal-length columns). Every row keeps its
`shard` and `pos` so the driver can put a shard back together in input order whatever order rows
come back in. A row that cannot be read or decoded carries its `error_type` and `message` (the HTTP
contract's types and words, serve/errors.py) and zero pixels; the embed stage skips it, so one bad
file costs only its own row.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from siglip_serve.bulk.inputs import read_bytes
from siglip_serve.core.texts import TextRejected, check_text
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.preprocess import ImageLimits, preprocess_image
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.metrics import BulkMetrics, EncoderMetrics

if TYPE_CHECKING:  # torch: in the actors only
    from siglip_serve.models.tower import Tower

log = logging.getLogger("siglip_serve.bulk")

Batch = dict[str, np.ndarray]

# Not an image problem: the file is gone or unreadable (permissions, a network filesystem's error).
UNREADABLE = "unreadable"


def _image_error_type(exc: ImageRejected) -> str:
    from siglip_serve.serve.errors import IMAGE_ERRORS  # the contract's reason for this rejection

    return IMAGE_ERRORS[type(exc)][1].value


def _text_error_type(exc: TextRejected) -> str:
    from siglip_serve.serve.errors import TEXT_ERRORS

    return TEXT_ERRORS[type(exc)][1].value


_metrics: BulkMetrics | None = None


def bulk_metrics() -> BulkMetrics:
    """This worker process's collectors (serve/metrics.py), built once: tasks reuse their worker."""
    global _metrics
    if _metrics is None:
        _metrics = BulkMetrics()
    return _metrics


def decode_batch(batch: Batch, *, size: tuple[int, int], limits: ImageLimits, fast_jpeg: bool) -> Batch:
    """Rows of (shard, pos, item) -> the same rows with uint8 `pixels` [3, H, W] or an error."""
    metrics = bulk_metrics()
    n = len(batch["item"])
    pixels = np.zeros((n, 3, *size), dtype=np.uint8)
    error_types, messages = [""] * n, [""] * n
    for i, location in enumerate(batch["item"]):
        began = time.perf_counter()
        try:
            pixels[i] = preprocess_image(read_bytes(str(location), limits), size, limits, fast_jpeg)
            metrics.preprocess_seconds.observe(time.perf_counter() - began)
        except ImageRejected as exc:
            error_types[i], messages[i] = _image_error_type(exc), exc.message
        except OSError as exc:  # missing, unreadable: never the whole job's end
            error_types[i], messages[i] = UNREADABLE, f"cannot read the file: {exc.strerror or type(exc).__name__}"
        if error_types[i]:
            metrics.rejected.inc(1, tags={"reason": error_types[i]})
    return {**batch, "pixels": pixels, "error_type": np.array(error_types, dtype=object),
            "message": np.array(messages, dtype=object)}


def check_texts(batch: Batch, *, max_chars: int) -> Batch:
    """Rows of (shard, pos, item) where item is a text -> the same rows, a text the API refuses (empty,
    blank, too long: core/texts.py's one check) an error with the contract's type and words."""
    n = len(batch["item"])
    error_types, messages = [""] * n, [""] * n
    for i, text in enumerate(batch["item"]):
        try:
            check_text(str(text), max_chars)
        except TextRejected as exc:
            error_types[i], messages[i] = _text_error_type(exc), exc.message
            bulk_metrics().rejected.inc(1, tags={"reason": error_types[i]})
    return {**batch, "error_type": np.array(error_types, dtype=object), "message": np.array(messages, dtype=object)}


class _Embedder:
    """What both towers' actors share: rows in, rows with `embedding` out, the failed rows zeros; the
    service's metric names for what they embed and each forward pass."""

    def __init__(self, modality: str, tower: Tower) -> None:
        self.modality = modality
        self.encoder = tower
        tower.warmup(iterations=1)
        self.on_forward = EncoderMetrics(tower=modality).forward
        self.embed_dim = tower.embed_dim
        log.info("bulk %s encoder ready: %s", modality, tower.describe())

    def _embed(self, inputs: Any) -> np.ndarray:
        return self.encoder.encode(inputs, self.on_forward)

    def _inputs(self, batch: Batch, ok: np.ndarray) -> Any:
        raise NotImplementedError

    def __call__(self, batch: Batch) -> Batch:
        ok = batch["error_type"] == ""
        embeddings = np.zeros((len(ok), self.embed_dim), dtype=np.float32)
        if ok.any():
            embeddings[ok] = self._embed(self._inputs(batch, ok))
            bulk_metrics().embedded(self.modality, int(ok.sum()))
        out = {key: value for key, value in batch.items() if key != "pixels"}
        return {**out, "embedding": embeddings}


class ImageEmbedActor(_Embedder):
    """One image tower on one device (a logical NeuronCore, a GPU, a CPU share): the service's encoder."""

    def __init__(self, settings: ModelSettings) -> None:
        from siglip_serve.models.backends.registry import create_encoder

        super().__init__("image", create_encoder(settings))

    def _inputs(self, batch: Batch, ok: np.ndarray) -> Any:
        return np.ascontiguousarray(batch["pixels"][ok])


class TextEmbedActor(_Embedder):
    """One text tower: the service's text encoder (tokenizer and buckets included)."""

    def __init__(self, settings: ModelSettings) -> None:
        from siglip_serve.models.backends.registry import create_text_encoder

        super().__init__("text", create_text_encoder(settings))

    def _inputs(self, batch: Batch, ok: np.ndarray) -> Any:
        return [str(text) for text in batch["item"][ok]]

