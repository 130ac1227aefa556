"""What a bulk run already embedded, by the SHA-256 of each file's bytes: a repeat is neither decoded nor embedded.

Catalogues and crawls hold the same image under many paths (thumbnails copied, re-posts). The decode
tasks hash every file's bytes they read (or fetched), ask the run's record for those digests, and pass
on the vector of each one found instead of pixels; the embed actors add what they computed. Within one
block a repeat is decoded once, and within one encoder call it is run through the model once. A repeat
whose first copy is still being decoded or embedded when its own block is read is embedded again:
nothing waits on another block.

The record is one Ray actor per run (`RunRecord`, an EmbeddingCache of serve/ingress/embedding_cache.py
underneath: LRU by bytes, `--repeat-cache-mib`), created by bulk/job.py; the stages talk to it through
`RecordClient`, or to a `RunRecord` itself in tests. It lives as long as the run: a rerun skips finished
shards by their names instead (bulk/inputs.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from siglip_serve.serve.ingress.embedding_cache import CacheKey, EmbeddingCache

MiB = 1024 * 1024
DEFAULT_MIB = 256.0


def digest(data: bytes) -> str:
    """A file's digest as the record keys it (hex: Ray Data carries it as a string column)."""
    return hashlib.sha256(data).hexdigest()


class Record(Protocol):
    def lookup(self, digests: Sequence[str]) -> list[np.ndarray | None]: ...
    def add(self, digests: Sequence[str], vectors: np.ndarray) -> None: ...


class RunRecord:
    """The run's digests and vectors, bounded by bytes (least recently used out first)."""

    def __init__(self, max_mib: float = DEFAULT_MIB) -> None:
        self._cache = EmbeddingCache(int(max_mib * MiB))

    def lookup(self, digests: Sequence[str]) -> list[np.ndarray | None]:
        return [self._cache.peek(CacheKey("image", bytes.fromhex(d))) for d in digests]

    def add(self, digests: Sequence[str], vectors: np.ndarray) -> None:
        for d, vector in zip(digests, vectors, strict=True):
            self._cache.put(CacheKey("image", bytes.fromhex(d)), vector)

    def stats(self) -> dict[str, Any]:
        return self._cache.stats()


class RecordClient:
    """A RunRecord actor as a Record: lookups wait for the answer, additions do not."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def lookup(self, digests: Sequence[str]) -> list[np.ndarray | None]:
        import ray

        return list(ray.get(self.actor.lookup.remote(list(digests))))

    def add(self, digests: Sequence[str], vectors: np.ndarray) -> None:
        self.actor.add.remote(list(digests), vectors)


def start_record(max_mib: float) -> RecordClient | None:
    """The run's record as a Ray actor (in the running Ray), or None with `max_mib` 0 (repeats embedded)."""
    if max_mib <= 0:
        return None
    import ray

    # One CPU-less actor: a dictionary lookup per block of 64 files, nothing a core is needed for.
    actor = ray.remote(num_cpus=0)(RunRecord).remote(max_mib)
    return RecordClient(actor)
