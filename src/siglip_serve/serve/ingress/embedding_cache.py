"""The embeddings an ingress replica already computed, by what the client sent: a repeat costs a hash.

Key: a SHA-256 of the scope and the payload. The payload is the image file's bytes (after base64 or a
data URI is undone, so the same file sent either way, or fetched from a URL, is one entry) or the text's
UTF-8. The scope (`cache_scope`) is everything else that changes the answer: the tower, the model, its
weights, backend and settings, the preprocessing version, the model's image size and the decode choices
(`fast_jpeg_decode`, `device_jpeg_decode`). A part missing from a key makes two different inputs one
entry, as Infinity's vector cache keys an image by a string built from its height alone
(libs/infinity_emb/infinity_emb/primitives.py, ImageSingle.str_repr, used as the key by
inference/caching_layer.py); tests/unit/test_embedding_cache.py changes each part alone and sees a new key.

Bounded by bytes (`embedding_cache_mib`, 0 = off): each entry costs its vector's bytes, its key and
ENTRY_OVERHEAD_BYTES; the least recently used go first. Identical items in flight are computed once:
the first caller computes, later callers wait for its result. If the first caller fails or is
cancelled (its client left, its own deadline passed), the waiters are not handed its failure: each
tries again, and one of them computes. A request can bypass the cache (`"cache": false`): it is
computed, neither read nor stored. Values are read-only float32 vectors; copy before changing one.

One instance per ingress replica; asyncio only (no locks: one event loop). Nothing here knows Ray,
FastAPI or torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from siglip_serve.models.preprocess import PREPROCESS_VERSION

if TYPE_CHECKING:
    from siglip_serve.serve.plan.service_plan import ModelPlan

MiB = 1024 * 1024
# An entry's bookkeeping beside its vector's bytes: the ndarray object (~112 bytes), the key tuple and
# its 32-byte digest (~130), the OrderedDict node and the entry record (~150), rounded up.
ENTRY_OVERHEAD_BYTES = 400


class CacheKey(NamedTuple):
    tower: str  # "image" or "text": the metrics' label; the digest already differs per tower (the scope)
    digest: bytes


def cache_scope(model: ModelPlan, tower: str, image_size: tuple[int, int]) -> bytes:
    """Everything besides the payload that decides an embedding, as one digest. Every model setting is in
    it (backend, dtype, artifacts, tokenizer...), and the weights by their source and, for a checkpoint
    file, its size and modification time: a replaced checkpoint at the same path is another scope."""
    settings, front = model.run.settings, model.front
    weights = front.weights
    if settings.checkpoint is not None:
        try:
            stat = os.stat(settings.checkpoint)
            weights += f":{stat.st_size}:{stat.st_mtime_ns}"
        except OSError:  # not on this node: the encoder replicas have it, the path still names it
            pass
    parts: dict[str, Any] = {
        "tower": tower,
        "settings": settings.model_dump(mode="json"),
        "weights": weights,
        "preprocessing": PREPROCESS_VERSION,
        "image_size": list(image_size),
        "fast_jpeg_decode": front.fast_jpeg_decode,
        "device_jpeg_decode": front.device_jpeg_decode,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()


def budget_scope(scope: bytes, budget: int | None) -> bytes:
    """The image scope of a NaFlex model's images at a patch budget a request asked for: another embedding of the
    same file (None: the model's own budget, the scope as it is)."""
    return scope if budget is None else hashlib.sha256(scope + f"patch_budget={budget}".encode()).digest()


def cache_key(scope: bytes, tower: str, payload: bytes | str) -> CacheKey:
    """The key of one item: `payload` is the image file's bytes or the text."""
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    return CacheKey(tower, hashlib.sha256(scope + data).digest())


@runtime_checkable
class CacheEvents(Protocol):
    """Where the counts go (serve/shared/metrics.py EmbeddingCacheMetrics in an ingress)."""

    def hits(self, tower: str, count: int) -> None: ...
    def misses(self, tower: str, count: int) -> None: ...
    def evictions(self, tower: str, count: int) -> None: ...
    def size(self, total_bytes: int) -> None: ...


@dataclass
class _Entry:
    vector: np.ndarray
    cost: int


# What a failed or cancelled first caller leaves its waiters: not its exception, a sign to try again.
_RETRY = object()

# (indices of the keys this call must compute) -> their vectors in that order ([n, D] or n vectors).
Compute = Callable[[list[int]], Awaitable[np.ndarray | Sequence[np.ndarray]]]


class EmbeddingCache:
    """LRU by bytes, single-flight per key. `max_bytes` 0: off (every call computes; no counts)."""

    def __init__(self, max_bytes: int, events: CacheEvents | None = None) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.events = events
        self._entries: OrderedDict[CacheKey, _Entry] = OrderedDict()
        self._in_flight: dict[CacheKey, asyncio.Future[Any]] = {}
        self.bytes = 0
        self.hits = self.misses = self.evictions = self.coalesced = self.bypassed = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def publish_size(self) -> None:
        """Report the bytes held again (serve/ingress/ingress.py does on each readiness probe): a gauge set only
        when the cache changes would show nothing for a cache that is off or idle."""
        if self.events is not None:
            self.events.size(self.bytes)

    def stats(self) -> dict[str, Any]:
        """For /v1/models' `cache` entry."""
        looked_up = self.hits + self.misses
        return {"enabled": self.enabled, "max_bytes": self.max_bytes, "bytes": self.bytes,
                "entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                "hit_ratio": self.hits / looked_up if looked_up else None, "coalesced": self.coalesced,
                "evictions": self.evictions, "bypassed": self.bypassed, "in_flight": len(self._in_flight)}

    def peek(self, key: CacheKey) -> np.ndarray | None:
        """The held vector (now the most recently used), or None; counts nothing. Synchronous: bulk's
        run-wide record of embedded files (bulk/repeats.py) uses it from a Ray actor."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry.vector

    def put(self, key: CacheKey, vector: np.ndarray) -> np.ndarray:
        """Hold `vector` under `key` (evicting the least recently used past max_bytes); the read-only copy."""
        return self._store(key, _frozen(vector)) if self.enabled else _frozen(vector)

    async def get_many(self, keys: Sequence[CacheKey], compute: Compute, bypass: bool = False) -> list[np.ndarray]:
        """A vector per key, in order. `compute(indices)` is called (at most once per round) for the keys
        neither cached nor being computed by another caller, each distinct key once (its first index);
        keys another caller is computing are awaited. Raises what `compute` raises."""
        if bypass or not self.enabled:
            if bypass:
                self.bypassed += len(keys)
            return [_frozen(v) for v in _rows(await compute(list(range(len(keys)))), len(keys))]
        results: list[np.ndarray | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        while pending:
            pending = await self._round(keys, pending, results, compute)
        return [r for r in results if r is not None]

    async def _round(self, keys: Sequence[CacheKey], pending: list[int], results: list[np.ndarray | None],
                     compute: Compute) -> list[int]:
        """Answer what the cache holds, compute what nobody is computing, then wait for the rest; returns
        the indices whose computing caller failed (to try again)."""
        led: dict[CacheKey, list[int]] = {}
        awaited: dict[CacheKey, tuple[asyncio.Future[Any], list[int]]] = {}
        for i in pending:
            key = keys[i]
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                results[i] = entry.vector
                self._count("hit", key.tower)
            elif key in led:
                led[key].append(i)
                self.coalesced += 1
                self._count("hit", key.tower)
            elif key in self._in_flight:
                awaited.setdefault(key, (self._in_flight[key], []))[1].append(i)
            else:
                led[key] = [i]
                self._in_flight[key] = asyncio.get_running_loop().create_future()
                self._count("miss", key.tower)
        if led:
            await self._lead(led, keys, results, compute)
        retry: list[int] = []
        for key, (future, indices) in awaited.items():
            # shield: a waiter that is cancelled must not cancel the future the others wait on.
            vector = await asyncio.shield(future)
            if vector is _RETRY:
                retry += indices
                continue
            self.coalesced += len(indices)
            self._count("hit", key.tower, len(indices))
            for i in indices:
                results[i] = vector
        return retry

    async def _lead(self, led: dict[CacheKey, list[int]], keys: Sequence[CacheKey],
                    results: list[np.ndarray | None], compute: Compute) -> None:
        futures = {key: self._in_flight[key] for key in led}
        outcome: dict[CacheKey, Any] = dict.fromkeys(led, _RETRY)
        try:
            firsts = [indices[0] for indices in led.values()]
            for key, vector in zip(led, _rows(await compute(firsts), len(firsts)), strict=True):
                outcome[key] = self._store(key, _frozen(vector))
                for i in led[key]:
                    results[i] = outcome[key]
        finally:  # success, an error or a cancellation: every waiter is released, never left hanging
            for key, future in futures.items():
                if self._in_flight.get(key) is future:
                    del self._in_flight[key]
                if not future.done():
                    future.set_result(outcome[key])

    def _store(self, key: CacheKey, vector: np.ndarray) -> np.ndarray:
        cost = vector.nbytes + ENTRY_OVERHEAD_BYTES
        if cost > self.max_bytes or key in self._entries:
            return vector
        self._entries[key] = _Entry(vector, cost)
        self.bytes += cost
        self._evict()
        return vector

    def resize(self, max_bytes: int) -> None:
        """A new bound (`embedding_cache_mib`, a live setting: serve/plan/live_settings.py): the least recently
        used out first down to it; 0 turns the cache off and empties it."""
        self.max_bytes = max(0, int(max_bytes))
        self._evict()

    def _evict(self) -> None:
        evicted: dict[str, int] = {}
        while self.bytes > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self.bytes -= old.cost
            evicted[old_key.tower] = evicted.get(old_key.tower, 0) + 1
        for tower, count in evicted.items():
            self.evictions += count
            if self.events is not None:
                self.events.evictions(tower, count)
        if self.events is not None:
            self.events.size(self.bytes)

    def _count(self, what: str, tower: str, count: int = 1) -> None:
        if what == "hit":
            self.hits += count
            if self.events is not None:
                self.events.hits(tower, count)
        else:
            self.misses += count
            if self.events is not None:
                self.events.misses(tower, count)


def _rows(computed: np.ndarray | Sequence[np.ndarray], expected: int) -> list[np.ndarray]:
    rows = list(computed)
    if len(rows) != expected:
        raise ValueError(f"compute returned {len(rows)} vectors for {expected} items")
    return rows


def _frozen(vector: np.ndarray) -> np.ndarray:
    """A read-only float32 copy: what the cache holds and every caller shares."""
    out = np.array(vector, dtype=np.float32, copy=True)
    out.setflags(write=False)
    return out
