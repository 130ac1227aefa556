"""The ingress's text path (serve/ingress/schedule.py's one scheduling call, on serve/ingress/ingress.py's parts)
follows the image path: 503 while draining, a dead text replica retried once, the request's own deadline, the replica
call cancelled when the client leaves; and classify's labels kept in the one embedding cache. Each tower's link
(serve/ingress/tower_link.py) is built by one factory and read from what its warm replicas published: the text client is
tuned for coalescing like the image one, /readyz counts every tower it serves, and a tower that still loads is refused
at once, for classify as for embeddings. The registry and the handles are stand-ins; Serve's routing and a real
replica's record are tested in tests/integration/test_text_http.py and test_route_seam.py."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from ray.exceptions import RayActorError
from ray.serve._private.handle_options import DynamicHandleOptions

from siglip_serve.models.model_info import ModelInfo
from siglip_serve.serve.http.embed_request import Item
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.ingress.embedding_cache import ENTRY_OVERHEAD_BYTES, cache_key
from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.endpoints.probes import readyz
from siglip_serve.serve.ingress.http_app import http_app
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import Work
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.shared import registry
from tests.bounds import scaled
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
    """Stands in for the TextEncoder deployment handle: `embed_chunks.remote(chunks, deadlines)`, answering a
    fixed embedding per text after `seconds`, the first `deaths` calls failing as a replica that died would. It
    records every embed call, its deadlines and its Response. It does not prove Serve's routing, its
    cancellation inside a real replica, or the replica's batching (tests/integration/test_text_http.py runs
    the real deployment)."""

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

    async def _embed_chunks(self, chunks: list[list[str]], deadlines: list[float]) -> list[np.ndarray]:
        self.calls.extend(list(chunk) for chunk in chunks)
        self.deadlines.extend(deadlines)
        await asyncio.sleep(self.seconds)
        if self.deaths:
            self.deaths -= 1
            raise RayActorError()
        return [np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(4) for t in chunk])
                for chunk in chunks]


# What a warm replica of each tower publishes in the registry (serve/towers/tower_replica.py `publish`), in part.
IMAGE_RECORD = {"tower": "image", "replica_id": "image-1", "warmup_seconds": {"8": 0.002}}
TEXT_RECORD = {"tower": "text", "replica_id": "text-1", "warmup_seconds": {"32": 0.003}, "context_length": 16,
               "logit_scale": 10.0, "logit_bias": -10.0}


def routes(handle: TextHandle | None, records: list[dict[str, Any]] | None = None,
           refusals: dict[str, str] | None = None, text_off: str | None = None, **args: Any) -> Ingress:
    """An ingress whose registry holds `records` (default: one warm replica per tower it serves) and
    `refusals` (a tower's last refusal to start; default none), planned with `text_off` (why the start's checks
    turned text off)."""
    config = ServiceConfig.from_args({"model": "tiny-siglip", "ingress_replicas": 1, "replicas": 1,
                                      "text_replicas": 1 if handle else 0, **args})
    found = records if records is not None else [IMAGE_RECORD, *([TEXT_RECORD] if handle else [])]
    towers = {"image": HandleOptions(), **({"text": handle} if handle else {})}
    return Ingress({MODEL.name: towers}, plan_service(config, text_off=text_off),  # type: ignore[dict-item]
                   {MODEL.name: MODEL}, replica=("test", "ingress-1"),
                   live_replicas=lambda app: list(found), refusal=lambda app, tower: (refusals or {}).get(tower))


async def encode_texts(ingress: Ingress, texts: list[str], deadline: float) -> np.ndarray:
    """Texts through the scheduling call, as /v1/embeddings sends them."""
    items = [Item("text", text, f"input[{i}]") for i, text in enumerate(texts)]
    return (await ingress.serving(None).scheduler.embed(Work("embeddings", items), deadline)).rows


async def embed_prompts(ingress: Ingress, prompts: list[str], deadline: float) -> np.ndarray:
    """Prompts through the scheduling call, as /v1/classify sends its labels."""
    items = [Item("text", prompt, f"labels[{i}]") for i, prompt in enumerate(prompts)]
    return (await ingress.serving(None).scheduler.embed(Work("classify", items), deadline)).rows


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


class Request:
    """What the ingress's `_deadline` reads of a request (its headers) when tracing is off."""

    headers: dict[str, str] = {}


def test_text_off_answers_404_naming_why_and_lists_only_images() -> None:
    ingress = routes(None)
    assert ingress.modalities == ["image"] and ingress.towers.info("text") is None
    with pytest.raises(ApiError) as error:
        asyncio.run(encode_texts(ingress, ["cat"], soon()))
    assert error.value.status == 404 and "text_replicas: 0" in error.value.message
    found = routes(None, text_off="the model hub huggingface.co:443 is unreachable")
    assert found.text_off_reason == "the model hub huggingface.co:443 is unreachable"
    with pytest.raises(ApiError) as error:
        asyncio.run(encode_texts(found, ["cat"], soon()))
    assert "unreachable" in error.value.message and "tokenizer: DIR" in error.value.message


def test_both_towers_call_their_replicas_over_grpc_in_serves_throughput_mode() -> None:
    ingress = routes(TextHandle(), throughput_optimized=True)
    assert {name: tower.client.transport for name, tower in ingress.towers.items()} == {"image": "gRPC",
                                                                                      "text": "gRPC"}
    assert routes(TextHandle(), throughput_optimized=False).towers["text"].client.transport == "Ray actor tasks"


def test_a_draining_ingress_refuses_texts_as_it_refuses_images() -> None:
    handle = TextHandle()
    ingress = routes(handle)
    ingress.door.draining = True
    for tower in ("text", "image"):
        async def admit(tower: str = tower) -> None:
            await ingress.serving(None).scheduler.admit(tower)

        with pytest.raises(ApiError) as error:
            asyncio.run(admit())
        assert (error.value.status, error.value.error_type.value) == (503, "not_ready")
        assert "shutting down" in error.value.message
    with pytest.raises(ApiError):
        asyncio.run(encode_texts(ingress, ["cat"], soon()))
    assert handle.calls == []


def test_a_dead_text_replica_is_retried_once_then_answered_503() -> None:
    handle = TextHandle(deaths=1)
    got = asyncio.run(encode_texts(routes(handle), ["cat", "dog"], soon()))
    assert got.shape == (2, 4) and handle.calls == [["cat", "dog"], ["cat", "dog"]]
    handle = TextHandle(deaths=2)
    with pytest.raises(ApiError) as error:
        asyncio.run(encode_texts(routes(handle), ["cat"], soon()))
    assert (error.value.status, error.value.error_type.value) == (503, "replica_unavailable")
    assert "text encoder replica" in error.value.message


def test_the_replica_gets_the_requests_own_deadline() -> None:
    handle = TextHandle()
    # A request that arrived 22 s ago under the 30 s default has 8 s left, not a fresh 30.
    asyncio.run(encode_texts(routes(handle), ["cat"], soon(8.0)))
    assert handle.deadlines and abs(handle.deadlines[0] - (time.time() + 8.0)) < 1.0


def test_a_client_that_leaves_cancels_the_text_replicas_call() -> None:
    handle = TextHandle(seconds=10.0)
    ingress = routes(handle)

    async def handler() -> np.ndarray:
        async with ingress.door.deadline(Request()) as deadline:  # the request's place, as a route takes it
            return await encode_texts(ingress, ["cat"], deadline)

    async def leave() -> None:
        request = asyncio.ensure_future(handler())
        while not handle.responses:
            await asyncio.sleep(0.01)
        assert ingress.door.slots.working == 1
        request.cancel()  # what Serve does to the handler when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0.05)

    asyncio.run(leave())
    assert [r.task.cancelled() for r in handle.responses] == [True]
    assert ingress.door.slots.working == 0 and ingress.door.slots.waiting == 0  # its place given back


def test_classify_prompts_are_embedded_once_and_the_cache_is_bounded() -> None:
    handle = TextHandle()
    # The embedding cache, room for three of tiny-siglip's text embeddings (4 float32 each) and not four.
    ingress = routes(handle, embedding_cache_mib=3.5 * (4 * 4 + ENTRY_OVERHEAD_BYTES) / (1024 * 1024))

    async def scenario() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        first = await embed_prompts(ingress, ["cat", "dog"], soon())
        again = await embed_prompts(ingress, ["dog", "cat", "car"], soon())
        evicted = await embed_prompts(ingress, ["bird", "cat"], soon())
        return first, again, evicted

    first, again, evicted = asyncio.run(scenario())
    assert handle.calls == [["cat", "dog"], ["car"], ["bird"]]
    np.testing.assert_array_equal(again[:2], first[::-1])
    np.testing.assert_array_equal(evicted[1], first[0])
    # "dog", least recently used, went first
    scope = ingress.serving(None).scheduler.rows.scopes["text"]
    assert list(ingress.cache._entries) == [cache_key(scope, "text", t) for t in ["car", "cat", "bird"]]


# -- the towers' links ---------------------------------------------------------------------------

class Probe:
    """What a probe route reads of its request: nothing."""

    headers: dict[str, str] = {}


def ready_answer(ingress: Ingress) -> tuple[int, dict[str, Any]]:
    response = asyncio.run(readyz(ingress, Probe()))  # type: ignore[arg-type]
    return response.status_code, json.loads(bytes(response.body))


@pytest.fixture(autouse=True)
def _no_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray here: the drain mark is never set."""
    monkeypatch.setattr(registry, "is_draining", lambda app: False)


def test_both_towers_are_linked_by_one_factory_and_both_clients_are_tuned_from_their_warm_up() -> None:
    ingress = routes(TextHandle(), throughput_optimized=False)
    image, text = ingress.towers["image"], ingress.towers["text"]
    assert (image.plan.largest_bucket, text.plan.largest_bucket) == (8, 32)
    assert not image.client.tuned and not text.client.tuned
    assert asyncio.run(ingress.towers.ready())
    # A full batch of 32 texts in 3 ms costs less than its 32 calls would: the text calls coalesce too
    # (before, only the image client was ever tuned).
    assert text.client.tuned and text.client.calls.concurrency == text.client.coalescing_window
    assert image.client.tuned and image.client.calls.concurrency == image.client.coalescing_window


def test_readyz_counts_every_tower_it_serves() -> None:
    status, body = ready_answer(routes(TextHandle(), records=[IMAGE_RECORD]))
    assert status == 503 and body["error"]["type"] == "not_ready"
    assert body["error"]["message"] == "0 of 1 text encoder replicas ready; 1 needed"
    status, body = ready_answer(routes(TextHandle(), records=[IMAGE_RECORD], refusals={"image": "not shown"}))
    assert body["error"]["message"] == "0 of 1 text encoder replicas ready; 1 needed"


def test_readyz_says_why_a_towers_replicas_refused_to_start_on_their_node() -> None:
    line = "text encoder replica on node worker-1 (10.0.0.7) refused to start: cannot load the tokenizer; set ..."
    status, body = ready_answer(routes(TextHandle(), records=[IMAGE_RECORD], refusals={"text": line}))
    assert status == 503 and body["error"]["type"] == "not_ready"
    assert body["error"]["message"] == f"0 of 1 text encoder replicas ready; 1 needed ({line})"
    status, body = ready_answer(routes(TextHandle()))
    assert status == 200
    assert body["replicas"] == 1 and body["replicas_expected"] == 1 and body["replicas_min_ready"] == 1
    assert body["towers"] == {"image": {"replicas": 1, "replicas_expected": 1, "replicas_min_ready": 1},
                              "text": {"replicas": 1, "replicas_expected": 1, "replicas_min_ready": 1}}
    status, body = ready_answer(routes(None))
    assert status == 200 and list(body["towers"]) == ["image"]


def test_a_loading_text_tower_is_refused_at_once_for_embeddings_and_classify_alike() -> None:
    ingress = routes(TextHandle(), records=[IMAGE_RECORD])
    for work in (Work("embeddings", [Item("text", "cat", "input")]),
                 Work("classify", [Item("text", "a photo of cat", "labels[0]")], score=True)):
        began = time.monotonic()
        with pytest.raises(ApiError) as error:
            asyncio.run(ingress.serving(None).scheduler.embed(work, time.monotonic() + 30))
        # Before, a text request waited up to its whole deadline for the text replica's description.
        assert time.monotonic() - began < scaled(1.0)
        assert (error.value.status, error.value.error_type.value) == (503, "not_ready")
        assert "text encoder is still loading" in error.value.message


def test_classify_scores_with_the_logit_the_text_replica_published() -> None:
    ingress = routes(TextHandle(), records=[IMAGE_RECORD, {**TEXT_RECORD, "logit_scale": 2.0, "logit_bias": 0.5}])
    done = asyncio.run(ingress.serving(None).scheduler.embed(
        Work("classify", [Item("text", "cat", "labels[0]")], score=True), time.monotonic() + 30))
    assert done.logit == (2.0, 0.5)
    row = done.rows[0].astype(np.float64)
    assert done.scores(done.rows, done.rows)[0, 0] == pytest.approx(1 / (1 + np.exp(-(2.0 * row @ row + 0.5))))


def test_a_route_needing_a_tower_that_is_off_is_answered_404_before_its_body_is_read() -> None:
    with TestClient(http_app(routes(None), ROUTES), raise_server_exceptions=False) as client:
        # Not even a body: the capability is checked first (serve/ingress/http_app.py), naming why text is off.
        response = client.post("/v1/classify")
    assert response.status_code == 404 and "text_replicas: 0" in response.json()["error"]["message"]


def test_an_ingress_of_two_models_reads_the_registry_once_per_probe_and_counts_each_models_own() -> None:
    config = ServiceConfig.from_args({"ingress_replicas": 1, "replicas": 1, "text_replicas": 0, "models": [
        {"name": "old", "model": "tiny-siglip"}, {"name": "new", "model": "tiny-siglip2"}]})
    reads: list[str] = []

    def live(app: str) -> list[dict[str, Any]]:
        reads.append(app)
        return [{**IMAGE_RECORD, registry.SERVED_AS: "old"}]  # only the default model's replica is warm

    ingress = Ingress({"old": {"image": HandleOptions()}, "new": {"image": HandleOptions()}},  # type: ignore[dict-item]
                      plan_service(config), {"old": MODEL, "new": MODEL}, replica=("test", "ingress-1"),
                      live_replicas=live, refusal=lambda app, tower: None)
    status, body = ready_answer(ingress)
    assert status == 200 and body["models"] == {"old": True, "new": False}
    assert reads == ["test"]
    described = asyncio.run(ingress.describe())
    assert [(m["id"], len(m["replicas"])) for m in described] == [("old", 1), ("new", 0)]
    assert len(reads) == 2


def test_the_check_before_the_body_passes_where_any_model_can_do_the_work() -> None:
    """Text is off for the default model and on for the other: a text request naming the other is not
    refused before its body is read; its own scheduling call then serves it, the default's refuses."""
    config = ServiceConfig.from_args({"ingress_replicas": 1, "replicas": 1, "models": [
        {"name": "old", "model": "tiny-siglip", "text_replicas": 0},
        {"name": "new", "model": "tiny-siglip", "text_replicas": 1}]})
    records = [{**IMAGE_RECORD, registry.SERVED_AS: name} for name in ("old", "new")]
    ingress = Ingress({"old": {"image": HandleOptions()},  # type: ignore[dict-item]
                       "new": {"image": HandleOptions(), "text": TextHandle()}},
                      plan_service(config), {"old": MODEL, "new": MODEL}, replica=("test", "ingress-1"),
                      live_replicas=lambda app: [*records, {**TEXT_RECORD, registry.SERVED_AS: "new"}],
                      refusal=lambda app, tower: None)
    ingress.require("text")
    rows = asyncio.run(ingress.serving("new").scheduler.embed(Work("embeddings", [Item("text", "cat", "input")]),
                                                              time.monotonic() + 30)).rows
    assert rows.shape == (1, 4)
    with pytest.raises(ApiError) as refused:
        ingress.serving(None).scheduler.require("text")
    assert refused.value.status == 404
    with pytest.raises(ApiError) as single:
        routes(None).require("text")  # one model, no text: refused before the body, as before
    assert single.value.status == 404


def test_a_model_still_loading_answers_503_for_its_own_requests_only() -> None:
    """The other model's replicas have not warmed up: its requests are 503 not_ready, the default's are
    served, and /readyz, which the default model alone decides, stays 200 naming which model is ready."""
    config = ServiceConfig.from_args({"ingress_replicas": 1, "replicas": 1, "models": [
        {"name": "old", "model": "tiny-siglip", "text_replicas": 1},
        {"name": "new", "model": "tiny-siglip", "text_replicas": 1}]})
    warm = [{**IMAGE_RECORD, registry.SERVED_AS: "old"}, {**TEXT_RECORD, registry.SERVED_AS: "old"}]
    ingress = Ingress({"old": {"image": HandleOptions(), "text": TextHandle()},  # type: ignore[dict-item]
                       "new": {"image": HandleOptions(), "text": TextHandle()}},
                      plan_service(config), {"old": MODEL, "new": MODEL}, replica=("test", "ingress-1"),
                      live_replicas=lambda app: warm, refusal=lambda app, tower: None)
    status, body = ready_answer(ingress)
    assert status == 200 and body["models"] == {"old": True, "new": False}
    work = Work("embeddings", [Item("text", "cat", "input")])
    assert asyncio.run(ingress.serving("old").scheduler.embed(work, time.monotonic() + 30)).rows.shape == (1, 4)
    with pytest.raises(ApiError) as loading:
        asyncio.run(ingress.serving("new").scheduler.embed(work, time.monotonic() + 30))
    assert (loading.value.status, loading.value.error_type) == (503, ErrorType.NOT_READY)
    assert "still loading" in loading.value.message
