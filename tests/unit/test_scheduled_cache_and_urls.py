"""The scheduling call (serve/ingress/schedule.py, serve/ingress/item_rows.py) with the embedding cache and image URLs,
on an ingress's real parts (serve/ingress/ingress.py) with stand-in tower handles: a repeat (inline or fetched) is
answered from the cache byte-identical without decoding or a replica call, for both towers; identical items in flight
are computed once; `"cache": false` computes again; with the cache off nothing is shared; a URL is fetched
before decoding and within the request's own deadline; /v1/models shows the cache's counts. Nothing leaves
the process (httpx's mock transport). The real app, its fetches over loopback and the official clients are in
tests/integration/test_urls_cache_rerank.py."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import httpx
import numpy as np
import pytest

from siglip_serve.serve.http.embed_request import Item, image_item
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import Work
from siglip_serve.serve.ingress.url_fetch import UrlFetcher
from siglip_serve.serve.shared import registry
from tests.bounds import scaled
from tests.helpers import TowerHandle as Handle
from tests.helpers import stand_in_ingress as ingress


@pytest.fixture(autouse=True)
def _no_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray here: the drain mark is never set."""
    monkeypatch.setattr(registry, "is_draining", lambda app: False)


async def rows(ingress: Ingress, items: list[Item], cache: bool = True, seconds: float = 30.0) -> np.ndarray:
    """The items' rows through the scheduling call (one event loop per ingress: its batchers are bound to it)."""
    work = Work("embeddings", items, cache=cache)
    done = await ingress.serving(None).scheduler.embed(work, time.monotonic() + seconds)
    return done.rows


def images(*values: str | bytes) -> list[Item]:
    return [image_item(value, f"input[{i}]") for i, value in enumerate(values)]


def test_a_repeated_image_is_answered_from_the_cache_byte_identical_however_it_was_sent(
        photo_jpegs: list[bytes]) -> None:
    image, text = Handle(), Handle()
    served = ingress(image, text, embedding_cache_mib=1)
    b64 = base64.b64encode(photo_jpegs[0]).decode()

    async def scenario() -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        first = await rows(served, images(b64))
        assert image.items == [1]
        # The same file as a data URI, and twice in one request beside a new one: only the new one is encoded.
        again = await rows(served, images(f"data:image/jpeg;base64,{b64}", photo_jpegs[1], b64))
        # A text is cached by its text, in the text tower's own scope.
        await rows(served, [Item("text", "a cat", "input")])
        await rows(served, [Item("text", "a cat", "input"), Item("text", "a dog", "input[1]")])
        return first, again, (await served.describe())[0]["cache"]

    first, again, stats = asyncio.run(scenario())
    assert image.items == [1, 1] and text.items == [1, 1]
    assert again[0].tobytes() == first[0].tobytes() == again[2].tobytes()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["bypassed"]) == (3, 4, 4, 0)


def test_cache_false_and_the_cache_off_compute_every_time(photo_jpegs: list[bytes]) -> None:
    image, text = Handle(), Handle()
    served = ingress(image, text, embedding_cache_mib=1)

    async def scenario() -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        await rows(served, images(photo_jpegs[0]))
        bypassed = await rows(served, images(photo_jpegs[0]), cache=False)
        await rows(served, [Item("text", "a cat", "input")], cache=False)
        await rows(served, [Item("text", "a cat", "input")])
        stats = (await served.describe())[0]["cache"]
        return bypassed, await rows(served, images(photo_jpegs[0])), stats

    bypassed, cached, stats = asyncio.run(scenario())
    assert image.items == [1, 1] and text.items == [1, 1]
    assert (stats["bypassed"], stats["entries"], stats["hits"]) == (2, 2, 0)
    assert bypassed[0].tobytes() == cached[0].tobytes()

    image, text = Handle(), Handle()
    off = ingress(image, text)  # embedding_cache_mib: 0, the default

    async def uncached() -> dict[str, Any]:
        await rows(off, images(photo_jpegs[0], photo_jpegs[0]))
        await rows(off, images(photo_jpegs[0]))
        return (await off.describe())[0]["cache"]

    assert asyncio.run(uncached())["enabled"] is False
    assert image.items == [2, 1]


def test_identical_images_in_flight_share_one_computation(photo_jpegs: list[bytes]) -> None:
    image, text = Handle(seconds=0.2), Handle()
    served = ingress(image, text, embedding_cache_mib=1)

    async def together() -> tuple[list[np.ndarray], dict[str, Any]]:
        answers = await asyncio.gather(*(rows(served, images(photo_jpegs[2])) for _ in range(3)))
        return answers, (await served.describe())[0]["cache"]

    answers, stats = asyncio.run(together())
    assert image.items == [1]  # three requests at once, one image encoded
    assert all(a.tobytes() == answers[0].tobytes() for a in answers)
    assert stats["coalesced"] == 2


def _fetching(served: Ingress, answer: Any) -> list[str]:
    """Replace the ingress's fetcher by one with the same settings over httpx's mock transport; the paths asked."""
    asked: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return await answer(request)

    served.serving(None).scheduler.rows.fetcher = UrlFetcher(served.front.url_fetch,
                                                             transport=httpx.MockTransport(handler))
    return asked


def test_an_image_url_is_fetched_then_cached_by_its_bytes(photo_jpegs: list[bytes]) -> None:
    image, text = Handle(), Handle()
    served = ingress(image, text, embedding_cache_mib=1, url_fetch_allowlist="127.0.0.2/32", url_fetch_concurrency=3)
    assert served.fetcher.settings.concurrency == 3  # the per-ingress bound on fetches at once

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=httpx.ByteStream(photo_jpegs[3]))

    asked = _fetching(served, answer)

    async def scenario() -> tuple[np.ndarray, np.ndarray]:
        inline = await rows(served, images(photo_jpegs[3]))
        return inline, await rows(served, [Item("text", "a cat", "input[0]"), *images("http://127.0.0.2:8/a.jpg")])

    inline, fetched = asyncio.run(scenario())
    assert asked == ["/a.jpg"] and image.items == [1]  # fetched, then a hit: the key is the file's bytes
    assert fetched[1].tobytes() == inline[0].tobytes()


def test_a_url_is_fetched_within_the_requests_own_deadline(photo_jpegs: list[bytes]) -> None:
    image, text = Handle(), Handle()
    served = ingress(image, text, url_fetch_allowlist="127.0.0.2/32", url_fetch_timeout_s=30)

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200, stream=httpx.ByteStream(photo_jpegs[0]))

    asked = _fetching(served, slow)
    began = time.monotonic()
    with pytest.raises(ApiError) as error:
        asyncio.run(rows(served, images("http://127.0.0.2:8/slow.jpg"), seconds=0.5))
    # The request's 0.5 s, not url_fetch_timeout_s's 30 nor the server's 10; nothing decoded or encoded.
    assert time.monotonic() - began < scaled(2.0)
    assert (error.value.status, error.value.error_type.value) == (504, "url_timeout")
    assert error.value.message.startswith("input[0]: ")
    assert asked == ["/slow.jpg"] and image.items == []
