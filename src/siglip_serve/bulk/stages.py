"""The two Ray Data stages of a bulk job: read and decode on CPU tasks, embed on one actor per device.

Both take and give Ray Data's numpy batches (a dict of equal-length columns). Every row keeps its
`shard` and `pos` so the driver can put a shard back together in input order whatever order rows
come back in. A row that cannot be read or decoded carries its `error_type` and `message` (the HTTP
contract's types and words, serve/http/errors.py) and zero pixels; the embed stage skips it, so one bad
file costs only its own row.

An http(s) item is fetched (serve/ingress/url_fetch.py, under the config's url_fetch_allowlist, the service's
rules and error types; a block's URLs at once, up to url_fetch_concurrency); any other item is a path or
a pyarrow.fs URI. Each row carries the `digest` of its bytes: a file this run already embedded is
passed on with its vector (`cached`, `embedding`) instead of pixels, and repeats inside a block or an
encoder call are decoded and embedded once (bulk/repeats.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from siglip_serve.bulk.inputs import read_bytes
from siglip_serve.bulk.repeats import Record, digest
from siglip_serve.core.errors import Rejected, UserError
from siglip_serve.core.texts import TextRejected, check_text
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.naflex import NaflexLayout
from siglip_serve.models.preprocess import ImageLimits, preprocess_image
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.http.url_errors import UrlRejected
from siglip_serve.serve.ingress.url_fetch import UrlFetcher
from siglip_serve.serve.plan.config import FetchSettings
from siglip_serve.serve.shared.metrics import BulkMetrics, TowerMetrics
from siglip_serve.serve.towers.replica_start import start_tower

if TYPE_CHECKING:  # torch: in the actors only
    from siglip_serve.models.tower import Tower

log = logging.getLogger("siglip_serve.bulk")

Batch = dict[str, np.ndarray]

# Not an image problem: the file is gone or unreadable (permissions, a network filesystem's error).
UNREADABLE = "unreadable"


def _error_type(exc: Rejected) -> str:
    from siglip_serve.serve.http.errors import rejection_type  # the contract's reason for this rejection

    return rejection_type(exc).value


_metrics: dict[str, BulkMetrics] = {}


def bulk_metrics(model: str) -> BulkMetrics:
    """This worker process's collectors (serve/shared/metrics.py) for `model` (the `model` label: the served
    model's name), built once: tasks reuse their worker."""
    if model not in _metrics:
        _metrics[model] = BulkMetrics(model)
    return _metrics[model]


# The service's default: url_fetch_allowlist empty, every URL refused naming it.
NO_URLS = FetchSettings()


def is_url(location: str) -> bool:
    return location[:8].lower().startswith(("http://", "https://"))


def _fetch(settings: FetchSettings, urls: list[str]) -> list[bytes | UrlRejected]:
    async def run() -> list[bytes | UrlRejected]:
        fetcher = UrlFetcher(settings)
        try:
            return await fetcher.fetch_many(urls)  # each within url_fetch_timeout_s
        finally:
            await fetcher.aclose()

    return asyncio.run(run())


def _read_all(locations: list[str], limits: ImageLimits,
              urls: FetchSettings) -> tuple[list[bytes | None], list[str], list[str]]:
    """Each row's bytes (fetched or read), or its error type and message."""
    n = len(locations)
    data: list[bytes | None] = [None] * n
    error_types, messages = [""] * n, [""] * n
    fetched = [i for i, location in enumerate(locations) if is_url(location)]
    for i, got in zip(fetched, _fetch(urls, [locations[i] for i in fetched]) if fetched else [], strict=True):
        if isinstance(got, UrlRejected):
            error_types[i], messages[i] = _error_type(got), got.message
        else:
            data[i] = got
    for i, location in enumerate(locations):
        if data[i] is not None or error_types[i]:
            continue
        try:
            data[i] = read_bytes(location, limits)
        except ImageRejected as exc:
            error_types[i], messages[i] = _error_type(exc), exc.message
        except OSError as exc:  # missing, unreadable: never the whole job's end
            error_types[i], messages[i] = UNREADABLE, f"cannot read the file: {exc.strerror or type(exc).__name__}"
    return data, error_types, messages


def _prepare(data: bytes, size: tuple[int, int], limits: ImageLimits, fast_jpeg: bool, resample: str,
             naflex: NaflexLayout | None) -> np.ndarray:
    """One image's pixels as the ingress prepares them (serve/ingress/image_prep.py)."""
    if naflex is None:
        return preprocess_image(data, size, limits, fast_jpeg, resample)
    from siglip_serve.models.naflex_prep import naflex_image

    return naflex_image(data, naflex, naflex.default_budget, limits, resample)


def decode_batch(batch: Batch, *, size: tuple[int, int], limits: ImageLimits, fast_jpeg: bool, model: str,
                 urls: FetchSettings = NO_URLS, record: Record | None = None, embed_dim: int = 0,
                 resample: str = "bicubic", naflex: NaflexLayout | None = None) -> Batch:
    """Rows of (shard, pos, item) -> the same rows with uint8 `pixels` [3, H, W] (a NaFlex model's: its packed
    patches at its own budget, as the ingress packs them) or an error, the `digest` of their bytes, and with
    `record` (the run's, of `embed_dim`-wide vectors) `cached` rows that carry their `embedding` instead of pixels;
    counted under `model`."""
    metrics = bulk_metrics(model)
    n = len(batch["item"])
    shape = naflex.array_shape(naflex.default_budget) if naflex is not None else (3, *size)
    pixels = np.zeros((n, *shape), dtype=np.uint8)
    data, error_types, messages = _read_all([str(item) for item in batch["item"]], limits, urls)
    digests = [digest(d) if d is not None else "" for d in data]
    cached = np.zeros(n, dtype=bool)
    embeddings = np.zeros((n, embed_dim), dtype=np.float32)
    readable = [i for i in range(n) if data[i] is not None]
    if record is not None and readable:
        for i, vector in zip(readable, record.lookup([digests[i] for i in readable]), strict=True):
            if vector is not None:
                cached[i], embeddings[i] = True, vector
    repeats = int(cached.sum())
    decoded: dict[str, int] = {}
    for i in readable:
        if cached[i]:
            continue
        if (first := decoded.get(digests[i])) is not None:  # the same bytes earlier in this block
            pixels[i], error_types[i], messages[i] = pixels[first], error_types[first], messages[first]
            repeats += 1
            continue
        decoded[digests[i]] = i
        began = time.perf_counter()
        try:
            pixels[i] = _prepare(data[i], size, limits, fast_jpeg, resample, naflex)  # type: ignore[arg-type]
            metrics.decoded(time.perf_counter() - began)
        except ImageRejected as exc:
            error_types[i], messages[i] = _error_type(exc), exc.message
    for reason in error_types:
        if reason:
            metrics.rejected.inc(1, tags={"reason": reason})
    if repeats:
        metrics.repeats_skipped(repeats)
    if cached.any():
        metrics.embedded("image", int(cached.sum()))
    out = {**batch, "pixels": pixels, "error_type": np.array(error_types, dtype=object),
           "message": np.array(messages, dtype=object), "digest": np.array(digests, dtype=object), "cached": cached}
    return {**out, "embedding": embeddings} if record is not None else out


def check_texts(batch: Batch, *, max_chars: int, model: str) -> Batch:
    """Rows of (shard, pos, item) where item is a text -> the same rows, a text the API refuses (empty,
    blank, too long: core/texts.py's one check) an error with the contract's type and words."""
    n = len(batch["item"])
    error_types, messages = [""] * n, [""] * n
    for i, text in enumerate(batch["item"]):
        try:
            check_text(str(text), max_chars)
        except TextRejected as exc:
            error_types[i], messages[i] = _error_type(exc), exc.message
            bulk_metrics(model).rejected.inc(1, tags={"reason": error_types[i]})
    return {**batch, "error_type": np.array(error_types, dtype=object), "message": np.array(messages, dtype=object)}


# A checkpoint's weights as the job names them (bulk/job.py weights_id): its file's sha256.
CHECKPOINT_DIGEST = "checkpoint-sha256:"


class ArtifactWeightsMismatch(UserError, RuntimeError):
    """The compiled artifact holds other weights than the ones the job's shards are named for."""


def check_artifact_weights(description: Mapping[str, Any], weights: str) -> None:
    """The job names its shards and rows for `weights` (bulk/job.py weights_id, read from the config on the
    driver, which may not see the artifact); an encoder built from a compiled artifact must hold exactly
    those, or a recompile from other weights into the same output would file two models' embeddings under
    one name. Raises ArtifactWeightsMismatch; a tower with no artifact was built from `weights` itself."""
    manifest = description.get("manifest")
    if not isinstance(manifest, Mapping):
        return
    source, digest = str(manifest.get("weights")), str(manifest.get("weights_sha256") or "")
    if weights.startswith(CHECKPOINT_DIGEST):
        if digest and weights.removeprefix(CHECKPOINT_DIGEST).startswith(digest):
            return
    elif source == weights:
        return
    raise ArtifactWeightsMismatch(
        f"artifact {description.get('artifact_dir')} was compiled from {source} (sha256 {digest or 'unknown'}...) "
        f"but this job's shards are named for {weights}: compile the artifact from the job's weights, or give the "
        f"job the weights the artifact was compiled from (--pretrained / --checkpoint), so that no output mixes "
        f"two models under one name")


class _Embedder:
    """What both towers' actors share: rows in, rows with `embedding` out, the failed rows zeros; the
    service's metric names for what they embed and each forward pass."""

    def __init__(self, modality: str, tower: Tower, model: str, record: Record | None = None,
                 weights: str | None = None) -> None:
        if weights is not None:
            check_artifact_weights(tower.describe(), weights)
        self.modality = modality
        self.metrics = bulk_metrics(model)
        self.record = record
        self.encoder = tower
        tower.warmup(iterations=1)
        self.on_forward = TowerMetrics(model, tower=modality).forward
        self.embed_dim = tower.embed_dim
        log.info("bulk %s encoder ready: %s", modality, tower.describe())

    def _embed(self, inputs: Any) -> np.ndarray:
        return self.encoder.encode(inputs, self.on_forward)

    def _inputs(self, batch: Batch, rows: np.ndarray) -> Any:
        raise NotImplementedError

    def __call__(self, batch: Batch) -> Batch:
        cached = batch["cached"] if "cached" in batch else np.zeros(len(batch["error_type"]), dtype=bool)
        rows = np.flatnonzero((batch["error_type"] == "") & ~cached)
        embeddings = (np.array(batch["embedding"], dtype=np.float32) if "embedding" in batch
                      else np.zeros((len(cached), self.embed_dim), dtype=np.float32))
        if len(rows):
            if "digest" in batch:  # the same bytes twice in this call: one forward pass
                _, first, inverse = np.unique(batch["digest"][rows].astype(str), return_index=True,
                                              return_inverse=True)
                computed = self._embed(self._inputs(batch, rows[first]))
                embeddings[rows] = computed[inverse.reshape(-1)]
                if self.record is not None:
                    self.record.add([str(d) for d in batch["digest"][rows[first]]], computed)
            else:
                embeddings[rows] = self._embed(self._inputs(batch, rows))
            self.metrics.embedded(self.modality, len(rows))
        out = {key: value for key, value in batch.items() if key != "pixels"}
        return {**out, "embedding": embeddings}


class ImageEmbedActor(_Embedder):
    """One image tower on one device (a logical NeuronCore, a GPU, a CPU share): the service's encoder."""

    def __init__(self, settings: ModelSettings, model: str, record: Record | None = None,
                 keep_env: Sequence[str] = (), weights: str | None = None) -> None:
        def build() -> Tower:
            from siglip_serve.models.backends.implementation import create_encoder
            from siglip_serve.models.image_only import leave_out_transformers

            leave_out_transformers(settings.model)
            return create_encoder(settings)

        super().__init__("image", start_tower("bulk image encoder", settings, build, keep_env), model, record,
                         weights)

    def _inputs(self, batch: Batch, rows: np.ndarray) -> Any:
        return np.ascontiguousarray(batch["pixels"][rows])


class TextEmbedActor(_Embedder):
    """One text tower: the service's text encoder (tokenizer and buckets included)."""

    def __init__(self, settings: ModelSettings, model: str, keep_env: Sequence[str] = (),
                 weights: str | None = None) -> None:
        def build() -> Tower:
            from siglip_serve.models.backends.implementation import create_text_encoder

            return create_text_encoder(settings)

        super().__init__("text", start_tower("bulk text encoder", settings, build, keep_env), model, None, weights)

    def _inputs(self, batch: Batch, rows: np.ndarray) -> Any:
        return [str(text) for text in batch["item"][rows]]

