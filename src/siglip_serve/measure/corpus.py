"""The images a load test or the served benchmark sends, and the request bodies built from them once.

Bodies are built up front so that the client spends its CPU on sending, not on encoding: a
load generator that JPEG-encodes, multipart-encodes or base64-encodes per request measures itself.
Multipart bodies are httpx's encoding (the one HTTP client of the project), rendered to bytes once.

This module does not import Locust, so the CLI, the benchmark and tests can use it; the
locustfile imports Locust first (gevent must patch ssl before anything else loads it).
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from siglip_serve.core.errors import UserError
from siglip_serve.core.sample_photos import PHOTOS, photo_jpeg

log = logging.getLogger("siglip_serve.corpus")

CONTENT_TYPES = {
    ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
    ".gif": "image/gif", ".bmp": "image/bmp", ".tif": "image/tiff", ".tiff": "image/tiff",
}

ENDPOINTS = ("raw", "multipart", "json")
PATHS = {"raw": "/v1/embeddings/image", "multipart": "/v1/embeddings/image", "json": "/v1/embeddings"}


class CorpusError(UserError, ValueError):
    """The corpus or the body settings cannot make requests; the message says why."""


@dataclass(frozen=True)
class Image:
    name: str
    data: bytes
    content_type: str


@dataclass(frozen=True)
class RequestBody:
    path: str
    data: bytes
    content_type: str
    images: int


def sample_corpus(names: Sequence[str] = PHOTOS, size: tuple[int, int] | None = None,
                  quality: int = 90) -> list[Image]:
    """The sample photographs (core/sample_photos.py) as JPEGs: the shipped files themselves, or, when `size`
    or `quality` asks for other bytes, each decoded, resized to `size` (if given) and re-encoded once."""
    images = []
    for name in names:
        data = photo_jpeg(name)
        if size is not None or quality != 90:  # the shipped files are the full-size pictures at quality 90
            data = _reencode(data, size, quality)
        images.append(Image(f"{name}.jpg", data, "image/jpeg"))
    return images


def distinct_copies(photos: Sequence[Image], count: int, seed: int) -> list[Image]:
    """`count` JPEGs, never the same bytes twice (so no embedding cache answers one): the photos in turn, each
    copy with an 8x8 corner of its own random pixels, re-encoded at quality 90."""
    import numpy as np
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    pictures = []
    for photo in photos:
        with PILImage.open(io.BytesIO(photo.data)) as picture:
            pictures.append(np.array(picture.convert("RGB")))
    copies = []
    for i in range(count):
        array = pictures[i % len(pictures)].copy()
        array[:8, :8] = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        buf = io.BytesIO()
        PILImage.fromarray(array).save(buf, format="JPEG", quality=90)
        copies.append(Image(f"copy-{i}.jpg", buf.getvalue(), "image/jpeg"))
    return copies


def _reencode(jpeg: bytes, size: tuple[int, int] | None, quality: int) -> bytes:
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(jpeg)) as picture:
        resized = picture.resize(size, PILImage.Resampling.BICUBIC) if size is not None else picture
        buf = io.BytesIO()
        resized.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def image_files(folder: str | Path) -> list[Path]:
    """The image files in `folder` (by extension, not recursive), sorted; an error if there are none."""
    root = Path(folder)
    if not root.is_dir():
        raise CorpusError(f"--images {folder}: not a directory")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in CONTENT_TYPES)
    if not files:
        raise CorpusError(f"--images {folder}: no image files ({', '.join(sorted(CONTENT_TYPES))})")
    return files


def folder_corpus(folder: str | Path) -> list[Image]:
    """Every image file in `folder`, sent as-is: a corrupt file stays corrupt."""
    return [Image(p.name, p.read_bytes(), CONTENT_TYPES[p.suffix.lower()]) for p in image_files(folder)]


def load_corpus(folder: str | Path | None = None) -> list[Image]:
    images = folder_corpus(folder) if folder else sample_corpus()
    log.info("corpus: %d images, %.1f KiB on average (%s)", len(images),
             sum(len(i.data) for i in images) / len(images) / 1024, folder or "the sample photos")
    return images


def _multipart(images: list[Image]) -> tuple[bytes, str]:
    """(body, Content-Type with its boundary): one `file` part per image, encoded by httpx."""
    import httpx

    files = [("file", (f"{i}-{image.name}", image.data, image.content_type)) for i, image in enumerate(images)]
    request = httpx.Request("POST", "http://127.0.0.1/", files=files)
    return request.read(), request.headers["Content-Type"]


def _json(images: list[Image], encoding_format: str) -> bytes:
    inputs = [f"data:{i.content_type};base64,{base64.b64encode(i.data).decode('ascii')}" for i in images]
    return json.dumps({"input": inputs, "encoding_format": encoding_format}).encode()


def build_bodies(corpus: list[Image], endpoint: str, images_per_request: int,
                 encoding_format: str = "float") -> list[RequestBody]:
    """One body per corpus image: body k holds images k, k+1, ... (wrapping), so every image is sent."""
    if endpoint not in ENDPOINTS:
        raise CorpusError(f"endpoint {endpoint!r}: choose one of {', '.join(ENDPOINTS)}")
    if images_per_request < 1:
        raise CorpusError("images per request must be at least 1")
    if endpoint == "raw" and images_per_request != 1:
        raise CorpusError("the raw endpoint carries exactly one image per request; use multipart or json for more")
    if not corpus:
        raise CorpusError("the corpus is empty")
    bodies = []
    for start in range(len(corpus)):
        chosen = [corpus[(start + k) % len(corpus)] for k in range(images_per_request)]
        if endpoint == "raw":
            data, content_type = chosen[0].data, chosen[0].content_type
        elif endpoint == "multipart":
            data, content_type = _multipart(chosen)
        else:
            data, content_type = _json(chosen, encoding_format), "application/json"
        bodies.append(RequestBody(PATHS[endpoint], data, content_type, images_per_request))
    return bodies


def request_name(endpoint: str, images_per_request: int) -> str:
    """Locust's stats name for the embedding request; it carries the images per request."""
    return f"{endpoint} {PATHS[endpoint]} [{images_per_request} img/req]"
