"""One tower's items of a request to their rows, at the least cost: what the scheduling call (serve/ingress/schedule.py)
runs for each tower once the request is checked and admitted.

Images: every image URL is fetched first (serve/ingress/url_fetch.py's UrlFetcher, one per ingress replica: its
allowlist, its bound on fetches at once), all at once and within the request's deadline, so a fetched image
is then what the client could have sent inline. Each image's file bytes (base64 and data URIs undone) are then
looked up in the embedding cache (serve/ingress/embedding_cache.py), keyed by those bytes and the image tower's scope;
only the images it neither holds nor is computing already are decoded (serve/ingress/image_prep.py) and encoded, each
distinct one once. Texts: the same lookup by their text and the text tower's scope, classify's labels (their
prompts) and rerank's query and documents as any other text: one cache for every embedding.

With `embedding_cache_mib: 0` nothing is hashed: the items go straight to decoding and encoding, as before the
cache. A request's `"cache": false` is computed the same way, and counted as bypassed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.serve.http.embed_request import Item
from siglip_serve.serve.ingress.embedding_cache import CacheKey, EmbeddingCache, budget_scope, cache_key
from siglip_serve.serve.ingress.image_prep import INLINE_PROBE_BYTES, ImagePrep
from siglip_serve.serve.ingress.url_fetch import UrlFetcher, fetch_url_items
from siglip_serve.serve.shared import tracing

# (tower, its items: pixels, JPEG files or texts) -> float32 [n, D], within the request's deadline.
Encode = Callable[[str, np.ndarray | JpegFiles | Sequence[str]], Awaitable[np.ndarray]]


@dataclass
class ItemRows:
    """The ingress's parts that turn items into rows: the decoder, the URL fetcher, the embedding cache and
    each tower's cache scope (serve/ingress/embedding_cache.py `cache_scope`)."""

    images: ImagePrep
    fetcher: UrlFetcher
    cache: EmbeddingCache
    scopes: dict[str, bytes]

    async def image_rows(self, items: Sequence[Item], deadline: float, encode: Encode,
                         use_cache: bool = True, budget: int | None = None) -> np.ndarray:
        """The images' rows in order: URLs fetched, then each distinct image not cached decoded and encoded (a NaFlex
        model's at `budget`, default its own: serve/ingress/image_prep.py)."""
        if any(item.url for item in items):
            with tracing.span("fetch", urls=sum(item.url for item in items)):
                items = await fetch_url_items(items, self.fetcher, deadline)
        labels = [item.label for item in items]

        async def compute(values: Sequence[bytes | str], names: Sequence[str]) -> np.ndarray:
            with tracing.span("decode", images=len(values)):
                pixels = await self.images.prepare_all(values, names, budget)
            return await encode("image", pixels)

        values = [item.value for item in items]
        if not self.cache.enabled:
            return await compute(values, labels)
        if sum(len(value) for value in values) <= INLINE_PROBE_BYTES:
            files = self.images.file_bytes(values, labels)
        else:  # megabytes of base64 to undo and hash: off the event loop
            files = await asyncio.to_thread(self.images.file_bytes, values, labels)
        keys = [cache_key(budget_scope(self.scopes["image"], budget), "image", data) for data in files]

        async def misses(indices: list[int]) -> np.ndarray:
            return await compute([files[i] for i in indices], [labels[i] for i in indices])

        return await self._cached(keys, misses, use_cache)

    async def text_rows(self, texts: Sequence[str], encode: Encode, use_cache: bool = True) -> np.ndarray:
        """The texts' rows in order, each distinct text not cached encoded once."""
        if not self.cache.enabled:
            return await encode("text", texts)
        keys = [cache_key(self.scopes["text"], "text", text) for text in texts]

        async def misses(indices: list[int]) -> np.ndarray:
            return await encode("text", [texts[i] for i in indices])

        return await self._cached(keys, misses, use_cache)

    async def _cached(self, keys: Sequence[CacheKey], misses: Callable[[list[int]], Awaitable[np.ndarray]],
                      use_cache: bool) -> np.ndarray:
        return np.stack(await self.cache.get_many(keys, misses, bypass=not use_cache))
