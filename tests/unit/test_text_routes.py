"""The ingress's text path (serve/text_routes.py on serve/ingress_core.py) follows the image path: 503
while draining, a dead text replica retried once, the request's own deadline, the replica call
cancelled when the client leaves; and the classify prompt cache."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

import numpy as np
import pytest
from ray.exceptions import RayActorError
from ray.serve._private.handle_options import DynamicHandleOptions

from siglip_serve.models.loading import ModelInfo
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.errors import ApiError
from siglip_serve.serve.text_routes import TextRoutes
from tests.helpers import ServeResponse as Response

MODEL = ModelInfo("tiny-siglip", 4, (64, 64), "random")


class HandleOptions:
    """Serve's handle as far as the ingress's constructor uses it: `options(...)` (recorded, the same
    handle back) and the options it holds. Alone it stands for the image tower's handle, never called
    here; a real DeploymentHandle's options() needs a running Serve."""

    handle_options = DynamicHandleOptions()

    def options(self, **options: Any) -> HandleOptions:
        self.handle_options = self.handle_options.copy_and_update(**options)
        return self


class TextHandle(HandleOptions):
    """Stands in for the TextEncoder deployment handle: `embed_chunks.remote(chunks, deadlines)` and
    `describe.remote()`, answering a fixed embedding per text after `seconds`, the first `deaths` calls
    failing as a replica that died would. It records every embed call, its deadlines and its Response. It
    does not prove Serve's routing, its cancellation inside a real replica, or the replica's batching
    (tests/integration/test_text_http.py runs the real deployment)."""

    def __init__(self, seconds: float = 0.0, deaths: int = 0) -> None:
        self.seconds = seconds
        self.deaths = deaths
        self.calls: list[list[str]] = []
        self.deadlines: list[float] = []
        self.responses: list[Response] = []
        handle = self

        class Method:
            def __init__(self, run: Any, record: bool) -> None:
                self.run, self.record = run, record

            def remote(self, *args: Any) -> Response:
                response = Response(self.run(*args))
                if self.record:
                    handle.responses.append(response)
                return response

        self.embed_chunks = Method(self._embed_chunks, record=True)
        self.describe = Method(self._describe, record=False)

    async def _describe(self) -> dict[str, Any]:
        return {"context_length": 16, "logit_scale": 10.0, "logit_bias": -10.0}

    async def _embed_chunks(self, chunks: list[list[str]], deadlines: list[float]) -> list[np.ndarray]:
        self.calls.extend(list(chunk) for chunk in chunks)
        self.deadlines.extend(deadlines)
        await asyncio.sleep(self.seconds)
        if self.deaths:
            self.deaths -= 1
            raise RayActorError()
        return [np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(4) for t in chunk])
                for chunk in chunks]


def routes(handle: TextHandle | None, **args: Any) -> TextRoutes:
    config = ServiceConfig.from_args({"model": "tiny-siglip", "ingress_replicas": 1,
                                      "text_replicas": 1 if handle else 0, **args})
    return TextRoutes(HandleOptions(), config, 1, MODEL, handle, replica=("test", "ingress-1"))  # type: ignore[arg-type]


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


class Request:
    """What the ingress's `_deadline` reads of a request (its headers) when tracing is off."""

    headers: dict[str, str] = {}


def test_text_off_answers_404_naming_why_and_lists_only_images() -> None:
    ingress = routes(None)
    assert ingress.modalities == ["image"] and asyncio.run(ingress.text_info()) is None
    with pytest.raises(ApiError) as error:
        asyncio.run(ingress.encode_texts(["cat"], soon()))
    assert error.value.status == 404 and "text_replicas: 0" in error.value.message
    found = routes(None, text_off_reason="the model hub huggingface.co:443 is unreachable")
    assert found.text_off_reason == "the model hub huggingface.co:443 is unreachable"
    with pytest.raises(ApiError) as error:
        asyncio.run(found.encode_texts(["cat"], soon()))
    assert "unreachable" in error.value.message and "tokenizer: DIR" in error.value.message


def test_both_towers_call_their_replicas_over_grpc_in_serves_throughput_mode() -> None:
    ingress = routes(TextHandle(), throughput_optimized=True)
    assert {name: tower.client.transport for name, tower in ingress.towers.items()} == {"image": "gRPC",
                                                                                      "text": "gRPC"}
    assert routes(TextHandle(), throughput_optimized=False).towers["text"].client.transport == "Ray actor tasks"


def test_a_draining_ingress_refuses_texts_as_it_refuses_images() -> None:
    handle = TextHandle()
    ingress = routes(handle)
    ingress._draining = True
    for tower in ("text", "image"):
        async def admit(tower: str = tower) -> None:
            await ingress._admitted(tower, soon())

        with pytest.raises(ApiError) as error:
            asyncio.run(admit())
        assert (error.value.status, error.value.error_type.value) == (503, "not_ready")
        assert "shutting down" in error.value.message
    with pytest.raises(ApiError):
        asyncio.run(ingress.encode_texts(["cat"], soon()))
    assert handle.calls == []


def test_a_dead_text_replica_is_retried_once_then_answered_503() -> None:
    handle = TextHandle(deaths=1)
    got = asyncio.run(routes(handle).encode_texts(["cat", "dog"], soon()))
    assert got.shape == (2, 4) and handle.calls == [["cat", "dog"], ["cat", "dog"]]
    handle = TextHandle(deaths=2)
    with pytest.raises(ApiError) as error:
        asyncio.run(routes(handle).encode_texts(["cat"], soon()))
    assert (error.value.status, error.value.error_type.value) == (503, "replica_unavailable")
    assert "text encoder replica" in error.value.message


def test_the_replica_gets_the_requests_own_deadline() -> None:
    handle = TextHandle()
    # A request that arrived 22 s ago under the 30 s default has 8 s left, not a fresh 30.
    asyncio.run(routes(handle).encode_texts(["cat"], soon(8.0)))
    assert handle.deadlines and abs(handle.deadlines[0] - (time.time() + 8.0)) < 1.0


def test_a_client_that_leaves_cancels_the_text_replicas_call() -> None:
    handle = TextHandle(seconds=10.0)
    ingress = routes(handle)

    async def handler() -> np.ndarray:
        async with ingress._deadline(Request()) as deadline:  # the request's place, as a route takes it
            return await ingress.encode_texts(["cat"], deadline)

    async def leave() -> None:
        request = asyncio.ensure_future(handler())
        while not handle.responses:
            await asyncio.sleep(0.01)
        assert ingress.slots.working == 1
        request.cancel()  # what Serve does to the handler when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0.05)

    asyncio.run(leave())
    assert [r.task.cancelled() for r in handle.responses] == [True]
    assert ingress.slots.working == 0 and ingress.slots.waiting == 0  # its place given back


def test_classify_prompts_are_embedded_once_and_the_cache_is_bounded() -> None:
    handle = TextHandle()
    ingress = routes(handle, classify_cache_size=3)

    async def scenario() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        first = await ingress.embed_prompts(["cat", "dog"], soon())
        again = await ingress.embed_prompts(["dog", "cat", "car"], soon())
        evicted = await ingress.embed_prompts(["bird", "cat"], soon())
        return first, again, evicted

    first, again, evicted = asyncio.run(scenario())
    assert handle.calls == [["cat", "dog"], ["car"], ["bird"]]
    np.testing.assert_array_equal(again[:2], first[::-1])
    np.testing.assert_array_equal(evicted[1], first[0])
    assert list(ingress._prompt_cache) == ["car", "cat", "bird"]  # "dog", least recently used, went first
