"""The embedding cache (serve/ingress/embedding_cache.py): what its key holds, LRU by bytes, single flight that a
failed or cancelled first caller cannot poison or hang, the per-request bypass, and its counts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from siglip_serve.serve.ingress import embedding_cache as cache_module
from siglip_serve.serve.ingress.embedding_cache import (
    ENTRY_OVERHEAD_BYTES,
    CacheEvents,
    CacheKey,
    EmbeddingCache,
    cache_key,
    cache_scope,
)
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.service_plan import ModelPlan

DIM = 16
ENTRY = DIM * 4 + ENTRY_OVERHEAD_BYTES  # what one float32 vector of DIM costs


def vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def key(name: str, tower: str = "image") -> CacheKey:
    return cache_key(b"scope", tower, name.encode())


async def get_or_compute(cache: EmbeddingCache, key: CacheKey,
                         compute: Callable[[], Awaitable[np.ndarray]]) -> np.ndarray:
    """One item through `get_many`: its cached vector, the running computation's, or `compute()`'s."""
    async def one(_: list[int]) -> list[np.ndarray]:
        return [await compute()]

    (vector,) = await cache.get_many([key], one)
    return vector


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def hits(self, tower: str, count: int) -> None:
        self.seen.append(("hit", tower, count))

    def misses(self, tower: str, count: int) -> None:
        self.seen.append(("miss", tower, count))

    def evictions(self, tower: str, count: int) -> None:
        self.seen.append(("evicted", tower, count))

    def size(self, total_bytes: int) -> None:
        self.seen.append(("bytes", "", total_bytes))


class Model:
    """A compute function that counts what it is asked for."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def for_keys(self, names: Sequence[str]):  # type: ignore[no-untyped-def]
        async def compute(indices: list[int]) -> np.ndarray:
            self.asked.append([names[i] for i in indices])
            return np.stack([vec(int(names[i][1:])) for i in indices])

        return compute


def many(cache: EmbeddingCache, names: Sequence[str], model: Model, bypass: bool = False) -> list[np.ndarray]:
    return asyncio.run(cache.get_many([key(n) for n in names], model.for_keys(names), bypass))


def test_a_repeat_is_answered_byte_identical_without_computing_and_read_only() -> None:
    cache, model = EmbeddingCache(10 * ENTRY), Model()
    first = many(cache, ["i1", "i2"], model)
    again = many(cache, ["i2", "i1", "i3"], model)
    assert model.asked == [["i1", "i2"], ["i3"]]
    assert again[0].tobytes() == first[1].tobytes() and again[1].tobytes() == first[0].tobytes()
    assert again[2].tobytes() == vec(3).tobytes()
    with pytest.raises(ValueError, match="read-only"):
        again[0][0] = 1.0
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["bytes"]) == (2, 3, 3, 3 * ENTRY)
    assert stats["enabled"] and stats["hit_ratio"] == pytest.approx(2 / 5)


def test_identical_items_of_one_request_are_computed_once() -> None:
    cache, model = EmbeddingCache(10 * ENTRY), Model()
    rows = many(cache, ["i7", "i8", "i7", "i7"], model)
    assert model.asked == [["i7", "i8"]]
    assert [r.tobytes() for r in rows] == [vec(n).tobytes() for n in (7, 8, 7, 7)]
    assert (cache.stats()["misses"], cache.stats()["coalesced"]) == (2, 2)


def test_the_least_recently_used_go_first_and_the_bound_is_bytes() -> None:
    events = Events()
    cache, model = EmbeddingCache(2 * ENTRY, events), Model()
    many(cache, ["i1", "i2"], model)
    many(cache, ["i1"], model)  # i1 used last: i2 is the one to go
    many(cache, ["i3"], model)
    assert cache.stats()["evictions"] == 1 and cache.bytes == 2 * ENTRY
    many(cache, ["i1", "i3", "i2"], model)
    assert model.asked[-1] == ["i2"]  # i1 and i3 stayed, i2 had gone
    assert ("evicted", "image", 1) in events.seen and ("bytes", "", 2 * ENTRY) in events.seen
    assert events.seen[:3] == [("miss", "image", 1), ("miss", "image", 1), ("bytes", "", ENTRY)]
    # A vector larger than the whole cache is answered, not stored.
    tiny = EmbeddingCache(ENTRY - 1)
    assert len(many(tiny, ["i1"], model)) == 1 and tiny.stats()["entries"] == 0


def test_off_and_bypass_compute_every_time_and_store_nothing() -> None:
    off, model = EmbeddingCache(0), Model()
    many(off, ["i1"], model)
    many(off, ["i1"], model)
    assert model.asked == [["i1"], ["i1"]] and off.stats()["enabled"] is False and off.stats()["misses"] == 0
    cache = EmbeddingCache(10 * ENTRY)
    many(cache, ["i1"], model)
    assert many(cache, ["i1", "i2"], model, bypass=True)[0].tobytes() == vec(1).tobytes()
    assert model.asked[-1] == ["i1", "i2"]  # read nothing although i1 is held
    assert cache.stats()["entries"] == 1 and cache.stats()["bypassed"] == 2  # and stored nothing


def test_a_second_caller_waits_for_the_first_computation_of_the_same_item() -> None:
    async def main() -> tuple[list[np.ndarray], int]:
        cache = EmbeddingCache(10 * ENTRY)
        release = asyncio.Event()
        calls = 0

        async def slow() -> np.ndarray:
            nonlocal calls
            calls += 1
            await release.wait()
            return vec(5)

        first = asyncio.ensure_future(get_or_compute(cache, key("i5"), slow))
        second = asyncio.ensure_future(get_or_compute(cache, key("i5"), slow))
        await asyncio.sleep(0.01)
        assert cache.stats()["in_flight"] == 1
        release.set()
        return list(await asyncio.gather(first, second)), calls

    (a, b), calls = asyncio.run(main())
    assert calls == 1 and a.tobytes() == b.tobytes() == vec(5).tobytes()


@pytest.mark.parametrize("how", ["fails", "is cancelled"])
def test_a_first_caller_that_fails_or_is_cancelled_neither_poisons_nor_hangs_the_second(how: str) -> None:
    async def main() -> None:
        cache = EmbeddingCache(10 * ENTRY)
        started = asyncio.Event()

        async def leader_compute() -> np.ndarray:
            started.set()
            await asyncio.sleep(0.05)
            if how == "fails":
                raise RuntimeError("this request's own problem (its deadline, a replica it lost)")
            await asyncio.sleep(10)  # cancelled before this ends
            return vec(0)

        async def waiter_compute() -> np.ndarray:
            return vec(9)

        leader = asyncio.ensure_future(get_or_compute(cache, key("i9"), leader_compute))
        await started.wait()
        waiter = asyncio.ensure_future(get_or_compute(cache, key("i9"), waiter_compute))
        await asyncio.sleep(0.01)
        if how == "is cancelled":
            leader.cancel()
        got = await asyncio.wait_for(waiter, timeout=2)  # not hung
        assert got.tobytes() == vec(9).tobytes()  # computed by the waiter itself, not the leader's failure
        with pytest.raises(RuntimeError if how == "fails" else asyncio.CancelledError):
            await leader
        assert cache.stats()["in_flight"] == 0 and cache.stats()["entries"] == 1
        # The next caller is answered from the cache.
        assert (await get_or_compute(cache, key("i9"), waiter_compute)).tobytes() == vec(9).tobytes()

    asyncio.run(main())


def test_a_waiter_that_is_cancelled_does_not_cancel_the_computation_the_others_wait_for() -> None:
    async def main() -> None:
        cache = EmbeddingCache(10 * ENTRY)
        release = asyncio.Event()

        async def slow() -> np.ndarray:
            await release.wait()
            return vec(4)

        leader = asyncio.ensure_future(get_or_compute(cache, key("i4"), slow))
        gone = asyncio.ensure_future(get_or_compute(cache, key("i4"), slow))
        stays = asyncio.ensure_future(get_or_compute(cache, key("i4"), slow))
        await asyncio.sleep(0.01)
        gone.cancel()
        release.set()
        a, b = await asyncio.wait_for(asyncio.gather(leader, stays), timeout=2)
        assert a.tobytes() == b.tobytes() == vec(4).tobytes() and gone.cancelled()

    asyncio.run(main())


def _model(config: ServiceConfig) -> ModelPlan:
    """The plan's record of `config`'s model, which the ingress's cache scope is read from."""
    return plan_service(config).model


def test_every_part_of_the_scope_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = ServiceConfig(model="tiny-siglip")
    scope = cache_scope(_model(base), "image", (64, 64))
    assert cache_scope(_model(ServiceConfig(model="tiny-siglip")), "image", (64, 64)) == scope  # stable
    changed = {
        "tower": cache_scope(_model(base), "text", (64, 64)),
        "image size": cache_scope(_model(base), "image", (96, 96)),
        "model": cache_scope(_model(ServiceConfig(model="tiny-siglip2")), "image", (64, 64)),
        "weights": cache_scope(_model(ServiceConfig(model="tiny-siglip", seed=1)), "image", (64, 64)),
        "backend": cache_scope(_model(ServiceConfig(model="tiny-siglip", backend="cuda")), "image", (64, 64)),
        "dtype": cache_scope(_model(ServiceConfig(model="tiny-siglip", backend="cuda", cuda_dtype="fp32")), "image",
                             (64, 64)),
        "fast_jpeg_decode": cache_scope(_model(ServiceConfig(model="tiny-siglip", fast_jpeg_decode=False)), "image",
                                        (64, 64)),
        "device_jpeg_decode": cache_scope(_model(ServiceConfig(model="tiny-siglip", device_jpeg_decode=True)), "image",
                                          (64, 64)),
    }
    monkeypatch.setattr(cache_module, "PREPROCESS_VERSION", "squash-bicubic-uint8-v2")
    changed["preprocessing"] = cache_scope(_model(base), "image", (64, 64))
    monkeypatch.undo()
    checkpoint = tmp_path / "weights.pt"
    checkpoint.write_bytes(b"first weights")
    real = ServiceConfig(model="ViT-B-16-SigLIP", checkpoint=checkpoint)
    before = cache_scope(_model(real), "image", (224, 224))
    checkpoint.write_bytes(b"other weights, same path")
    os.utime(checkpoint, ns=(1, 1))
    changed["checkpoint replaced"] = cache_scope(_model(real), "image", (224, 224))
    assert changed["checkpoint replaced"] != before
    for part, other in changed.items():
        assert other != scope, part
    assert len(set(changed.values())) == len(changed)
    # Two different images of one size are two keys (Infinity's vector cache keyed an image by its height).
    a, b = np.zeros((8, 8, 3), np.uint8).tobytes(), np.ones((8, 8, 3), np.uint8).tobytes()
    assert cache_key(scope, "image", a) != cache_key(scope, "image", b)
    # A text and the same characters sent as an image's bytes are read by different towers: different keys.
    text_scope = changed["tower"]
    assert cache_key(text_scope, "text", "abc") != cache_key(scope, "image", b"abc")
    assert cache_key(text_scope, "text", "abc") == cache_key(text_scope, "text", b"abc")


def test_the_metrics_collectors_take_the_caches_events() -> None:
    from siglip_serve.serve.shared.metrics import CACHE_METRIC_NAMES, EmbeddingCacheMetrics

    collectors = EmbeddingCacheMetrics()  # Ray's metric objects record without a cluster (nothing exported)
    assert isinstance(collectors, CacheEvents)
    cache, model = EmbeddingCache(ENTRY, collectors), Model()
    many(cache, ["i1", "i2", "i2"], model)  # a miss, a miss, a hit, an eviction, sizes
    assert all(name.startswith("siglip_embedding_cache_") for name in CACHE_METRIC_NAMES)
    assert CACHE_METRIC_NAMES[-1].endswith("_bytes") and all(n.endswith("_total") for n in CACHE_METRIC_NAMES[:-1])
