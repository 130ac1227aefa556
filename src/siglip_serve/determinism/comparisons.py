"""Each comparison of `siglip-serve determinism` (the package's docstring lists them): a photo's vector alone, the
reference, against the same photo's vector by another route, as rows of (comparison, bit-equal, max |difference|).

Alone is what a request of one image gets from an idle replica: a forward pass of one. Every other route is run
as the service runs it: the tower's own `encode` (its bucketing, models/tower.py), the ingress's decoding and cache,
bulk's decode and embed stages.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import tempfile
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from siglip_serve.bulk import stages
from siglip_serve.core.sample_photos import PHOTOS, photo_jpeg
from siglip_serve.determinism.input_forms import FORMS, read_forms
from siglip_serve.models.preprocess import ImageLimits, preprocess_image
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.http.embedding_output import encode_rows
from siglip_serve.serve.ingress.embedding_cache import EmbeddingCache, cache_key

if TYPE_CHECKING:
    from siglip_serve.models.encoder import Encoder

log = logging.getLogger("siglip_serve.determinism")

# The service's default (serve/plan/model_entry.py fast_jpeg_decode): the ingress and bulk decode so.
FAST_JPEG = True
QUANTISED = ("int8", "uint8", "binary", "ubinary")
# The text tower's inputs: short captions, and one past a small context length.
TEXTS = ("a photo of an astronaut", "a cat on a chair", "a cup of coffee", "a rocket at night",
         "galaxies in deep space", "a stained tissue under a microscope", "a man with a camera",
         "the moon " * 40)


@dataclass(frozen=True)
class Row:
    comparison: str
    bit_equal: bool
    max_abs_diff: float
    detail: str = ""


def difference(reference: np.ndarray, other: np.ndarray) -> tuple[bool, float]:
    """(bit for bit the same, the largest absolute difference) of two arrays of one shape."""
    if reference.shape != other.shape:
        raise ValueError(f"shapes differ: {reference.shape} vs {other.shape}")
    diff = np.abs(reference.astype(np.float64) - other.astype(np.float64))
    return bool(np.array_equal(reference, other)), float(diff.max()) if diff.size else 0.0


def row(comparison: str, reference: np.ndarray, other: np.ndarray, detail: str = "") -> Row:
    equal, worst = difference(reference, other)
    return Row(comparison, equal, worst, detail)


def sample_files() -> dict[str, bytes]:
    """name -> the shipped JPEG, every sample photo."""
    return {name: photo_jpeg(name) for name in PHOTOS}


def use(tower: Any) -> Any:
    """The tower, with this process's torch threads set to its own: torch's count is per process, and two towers
    built here (as configured and deterministic) each set it when built."""
    import torch

    threads = tower.describe().get("torch_threads")
    if threads:
        torch.set_num_threads(int(threads))
    return tower


def pixels(encoder: Encoder, files: list[bytes]) -> np.ndarray:
    """uint8 [N, 3, H, W] as the ingress prepares them (serve/ingress/image_prep.py)."""
    return np.stack([preprocess_image(data, encoder.image_size, ImageLimits(), FAST_JPEG, encoder.info.resample)
                     for data in files])


def alone(encoder: Any, images: np.ndarray) -> np.ndarray:
    """Each input (an image, or a text of an object array) in a forward pass of its own: what a request of one gets
    from an idle replica."""
    use(encoder)
    return np.stack([encoder.encode(images[i:i + 1])[0] for i in range(len(images))])


def in_batches(encoder: Any, images: np.ndarray, size: int) -> list[tuple[int, int, np.ndarray]]:
    """(input, position, its vector) for every input at every position of a batch of `size` beside the others:
    batch r holds inputs r, r+1, ... (cycling), so over len(images) batches each input visits each position."""
    use(encoder)
    n = len(images)
    out = []
    for start in range(n):
        order = [(start + k) % n for k in range(size)]
        vectors = encoder.encode(images[order])
        out += [(image, position, vectors[position]) for position, image in enumerate(order)]
    return out


def bucket_rows(encoder: Any, images: np.ndarray, reference: np.ndarray, names: tuple[str, ...] = PHOTOS,
                what: str = "") -> list[Row]:
    rows = []
    for size in encoder.buckets:
        placed = in_batches(encoder, images, size)
        got = np.stack([vector for _, _, vector in placed])
        want = reference[[image for image, _, _ in placed]]
        image, position, worst = max(placed, key=lambda p: float(np.abs(p[2] - reference[p[0]]).max()))
        where = "" if np.array_equal(worst, reference[image]) else f"; worst: {names[image][:24]!r} at {position}"
        rows.append(row(f"{what}alone vs batch of {size}", want, got,
                        f"every {'text' if what else 'photo'} at each of {size} position(s){where}"))
    return rows


def text_rows(settings: ModelSettings) -> list[Row]:
    """The text tower's buckets, as the image tower's: each caption alone against every position of each bucket.
    None where this model's text tower cannot be built here (no tokenizer at hand): a warning says so."""
    from siglip_serve.core.errors import UserError
    from siglip_serve.models.backends.implementation import create_text_encoder

    try:
        text = create_text_encoder(settings)
    except (UserError, OSError, ImportError) as exc:
        log.warning("text tower not compared: %s", exc)
        return []
    texts = np.array(TEXTS, dtype=object)
    return bucket_rows(text, texts, alone(text, texts), TEXTS, "text: ")


def _replica_vectors(settings: dict[str, Any], images: np.ndarray) -> np.ndarray:
    """In a second process: a tower built from the same settings (random weights are seeded), each image alone."""
    from siglip_serve.models.backends.implementation import create_encoder

    return alone(create_encoder(ModelSettings.model_validate(settings)), images)


def replica_row(settings: ModelSettings, images: np.ndarray, reference: np.ndarray) -> Row:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        other = pool.submit(_replica_vectors, settings.model_dump(mode="json"), images).result()
    return row("replica A vs replica B", reference, other, "B: the same settings built in a second process")


def cache_row(encoder: Encoder, files: list[bytes], images: np.ndarray, reference: np.ndarray) -> Row:
    """A request of every photo fills the ingress's cache (serve/ingress/embedding_cache.py) from one batch; a
    later request of one photo is answered from it."""
    use(encoder)

    async def compute(indices: list[int]) -> np.ndarray:
        return encoder.encode(images[indices])

    async def run() -> np.ndarray:
        cache = EmbeddingCache(64 * 1024 * 1024)
        keys = [cache_key(b"determinism", "image", data) for data in files]
        await cache.get_many(keys, compute)
        return np.stack([(await cache.get_many([key], _refuse))[0] for key in keys])  # a hit computes nothing

    return row("fresh (alone) vs cache hit", reference, asyncio.run(run()),
               f"stored from a request of {len(files)} (one batch), read by requests of one")


async def _refuse(indices: list[int]) -> np.ndarray:
    raise AssertionError(f"a cache hit computed {indices}")


def bulk_row(encoder: Encoder, files: Mapping[str, bytes], reference: np.ndarray, model: str) -> Row:
    """The photos as one block of a bulk job: bulk/stages.py's decode and image embed stages on this tower."""
    use(encoder)
    with tempfile.TemporaryDirectory(prefix="determinism-") as folder:
        paths = []
        for name, data in files.items():
            path = Path(folder) / f"{name}.jpg"
            path.write_bytes(data)
            paths.append(str(path))
        block = {"shard": np.zeros(len(paths), dtype=np.int64), "pos": np.arange(len(paths)),
                 "item": np.array(paths, dtype=object)}
        decoded = stages.decode_batch(block, size=encoder.image_size, limits=ImageLimits(), fast_jpeg=FAST_JPEG,
                                      model=model, resample=encoder.info.resample)
    # The actor's own embedding code around this process's tower (its constructor would build another).
    stage = stages.ImageEmbedActor.__new__(stages.ImageEmbedActor)
    stages._Embedder.__init__(stage, "image", encoder, model)
    embedded = stage(decoded)["embedding"]
    return row("served (alone) vs bulk", reference, embedded, f"one block of {len(paths)}, as the job's embed stage")


def form_rows(encoder: Encoder, files: Mapping[str, bytes], reference: np.ndarray) -> list[Row]:
    """Raw bytes one image a request (the reference) against each other form, all the photos in one request."""
    forms = read_forms(files)
    raw = forms["raw"]
    rows = []
    for form in FORMS[1:]:
        same = all(a == b for a, b in zip(raw, forms[form], strict=True))
        vectors = use(encoder).encode(pixels(encoder, forms[form]))
        rows.append(row(f"raw vs {form}", reference, vectors,
                        f"{len(raw)} photos in one request; bytes read {'identical' if same else 'DIFFERENT'}"))
    return rows


def quantised_rows(encoder: Encoder, images: np.ndarray, reference: np.ndarray) -> list[Row]:
    """Each encoding's answer (serve/http/embedding_output.py) of the vector alone against that of the same photo
    in a batch of the largest bucket: whether a float difference survives quantisation."""
    placed = in_batches(encoder, images, encoder.max_batch_size)
    batched = np.stack([vector for _, _, vector in placed])
    want = reference[[image for image, _, _ in placed]]
    rows = []
    for encoding in QUANTISED:
        a, scales = encode_rows(want, encoding)
        b, _ = encode_rows(batched, encoding)
        qa, qb = np.stack(a).astype(np.int16), np.stack(b).astype(np.int16)
        if scales is not None:
            dequantised = (qa - (128 if encoding == "uint8" else 0)) / np.array(scales)[:, None]
            detail = f"dequantised vs float: max {float(np.abs(dequantised - want).max()):.3g}"
        else:
            flipped = int(np.unpackbits(np.bitwise_xor(qa.astype(np.uint8), qb.astype(np.uint8)), axis=1).sum())
            detail = f"{flipped} bit(s) flipped over {len(placed)} vectors"
        rows.append(row(f"{encoding}: alone vs batch of {encoder.max_batch_size}", qa, qb, detail))
    return rows


def compare_all(settings: ModelSettings, encoder: Encoder, model: str, texts: bool = True,
                replica: bool = True) -> list[dict[str, Any]]:
    """Every comparison for one configuration, as JSON-ready rows; `replica` False leaves out the second process
    (a device one process holds alone, a NeuronCore, cannot be loaded by another beside it)."""
    files = sample_files()
    images = pixels(encoder, list(files.values()))
    reference = alone(encoder, images)
    rows = [*bucket_rows(encoder, images, reference), *([replica_row(settings, images, reference)] if replica else []),
            cache_row(encoder, list(files.values()), images, reference), bulk_row(encoder, files, reference, model),
            *form_rows(encoder, files, reference), *quantised_rows(encoder, images, reference),
            *(text_rows(settings) if texts else [])]
    return [asdict(r) for r in rows]
