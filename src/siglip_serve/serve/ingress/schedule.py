"""The one scheduling call every route goes through, for any mix of images and texts.

A route reads its body into items (serve/http/embed_request.py's `Item`: an image or a text, with the label
messages name it by), says what it wants (`Work`) and how to answer (`render`), and hands them to
`Scheduler.answer`. As in Infinity's `BatchHandler` (libs/infinity_emb/infinity_emb/inference/
batch_handler.py: `embed`, `rerank`, `classify` and `image_embed` each check the capability they need, then
await the one `_schedule`), the call first checks what the service can do, then, in this order, each before
any cost of the next:
1. `dimensions`, then the images per request (422); the towers the items need (and, for `score`, the text
   tower's logit scale and bias) served, else 404 naming why not; each text (count, empty, length);
2. admission, per tower: 503 while draining or while the tower still loads;
3. both towers' items to rows at once (serve/ingress/item_rows.py): image URLs fetched within the request's deadline,
   every item looked up in the embedding cache by what was sent, the rest decoded (serve/ingress/image_prep.py) and
   encoded (serve/ingress/tower_client.py: a dead replica retried once, the request's deadline, the call cancelled
   once nobody waits), identical items computed once; a bad image or URL cancels the texts' call;
4. the rows back in input order, cut to `dimensions`, the route's answer rendered, the items counted, and the
   request's seconds observed (siglip_request_seconds) with the status it ended in.
The request's place, deadline and API key are the front door's (serve/ingress/front_door.py), taken before the body.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from fastapi import Response

from siglip_serve.core import lanes
from siglip_serve.core.errors import DeadlineExceeded
from siglip_serve.core.texts import TextRejected, check_text
from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.serve.http.embed_request import Item
from siglip_serve.serve.http.embedding_output import check_dimensions, cut_dimensions
from siglip_serve.serve.http.errors import ApiError, ErrorType, rejection_error
from siglip_serve.serve.ingress.front_door import FrontDoor
from siglip_serve.serve.ingress.item_rows import ItemRows
from siglip_serve.serve.ingress.tower_link import Towers
from siglip_serve.serve.plan.replica_slices import ModelFront
from siglip_serve.serve.shared import tracing
from siglip_serve.serve.shared.metrics import ModelMetrics

# One line per request with `access_log` on, naming its tenant (never the key) and lane.
access_log = logging.getLogger("siglip_serve.access")

# What a route can ask of the service: a tower per kind of item, and `score` (SigLIP's sigmoid, whose logit
# scale and bias the text tower publishes).
SCORE = "score"


@dataclass(frozen=True)
class Work:
    """What a route asks: its items in the request's order, and how they are checked and counted."""

    endpoint: str  # the `endpoint` label of the metrics
    items: Sequence[Item]
    score: bool = False  # the answer scores pairs (`Scheduled.scores`): needs the text tower's logit scale, bias
    texts_called: str = "texts"  # what the too-many-texts message calls the texts (classify: "labels")
    dimensions: int | None = None  # cut every row to this many (serve/http/embedding_output.py), checked first
    cache: bool = True  # false: the embedding cache is neither read nor filled (the request's "cache": false)
    patch_budget: int | None = None  # a NaFlex model's images resized to this served budget (default: its own)


@dataclass(frozen=True)
class Scheduled:
    """The rows of a `Work`'s items in their order, how many were images and texts, and the logit scale and
    bias when it asked to score."""

    rows: np.ndarray
    images: int
    texts: int
    logit: tuple[float, float] | None = None

    def scores(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """SigLIP's probability for every pair of a row in `left` and one in `right`: [len(left), len(right)]."""
        if self.logit is None:
            raise ValueError("scores need Work(score=True)")
        return zero_shot(left, right, *self.logit)


Render = Callable[[Scheduled], Response]


def zero_shot(images: np.ndarray, texts: np.ndarray, scale: float, bias: float) -> np.ndarray:
    """SigLIP's per-pair probability: sigmoid(scale * cos + bias), [n_images, n_labels]."""
    logits = scale * (images.astype(np.float64) @ texts.astype(np.float64).T) + bias
    return 1.0 / (1.0 + np.exp(-logits))


def check_texts(texts: Sequence[str], labels: Sequence[str], front: ModelFront, what: str = "texts") -> None:
    """Limits before any tokenizing: count (422), then each text by core/texts.py's check (bulk's too):
    empty or blank (422), characters per text (413)."""
    if len(texts) > front.max_texts_per_request:
        raise ApiError(422, ErrorType.TOO_MANY_TEXTS,
                       f"{len(texts)} {what} in one request; the limit is {front.max_texts_per_request}")
    for text, label in zip(texts, labels, strict=True):
        try:
            check_text(text, front.max_text_chars)
        except TextRejected as exc:
            raise rejection_error(exc, label) from None


def check_patch_budget(budget: int | None, model: ModelInfo) -> int | None:
    """The patch budget a request's images are resized to (None: the model's own, asked for or not, so that its
    embeddings are cached as one), or 422 where the model is not NaFlex or does not serve it: a budget is a
    bucket, never made for one request."""
    if budget is None:
        return None
    if model.naflex is None:
        raise ApiError(422, ErrorType.INVALID_REQUEST, f"patch_budget is for SigLIP 2 NaFlex models; {model.name} "
                                                       "takes one fixed image size")
    if budget not in model.naflex.budgets:
        raise ApiError(422, ErrorType.INVALID_REQUEST, f"patch_budget {budget} is not served by {model.name}; "
                                                       f"served: {list(model.naflex.budgets)} (patch_budgets)")
    return None if budget == model.naflex.default_budget else budget


@dataclass
class Scheduler:
    """The call, on the ingress's parts (serve/ingress/ingress.py)."""

    front: ModelFront
    model: ModelInfo
    metrics: ModelMetrics  # this model's share of the ingress's collectors
    door: FrontDoor
    towers: Towers
    rows: ItemRows

    # -- what the service can do -------------------------------------------------------------

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset([*self.towers, *([SCORE] if "text" in self.towers else [])])

    def require(self, *needs: str) -> None:
        """404 when the service cannot do one of `needs` (a tower's kind of item, or `score`): only the text
        tower can be off, and the message says why it is."""
        if all(need in self.capabilities for need in needs):
            return
        why = self.front.text_off_reason or "text_replicas: 0"
        raise ApiError(404, ErrorType.NOT_FOUND,
                       f"this service serves no text tower ({why}); send images, or set tokenizer: DIR / "
                       "text_replicas: N and restart")

    async def admit(self, tower: str) -> None:
        """`tower` takes this request's work, or 503 now: while draining, or while the tower still loads."""
        self.door.check_open()
        if not await self.towers.accepting(tower):
            what = "the text encoder is" if tower == "text" else "encoder replicas are"
            raise ApiError(503, ErrorType.NOT_READY, f"{what} still loading; retry later", self.door.retry_after())

    # -- the call -----------------------------------------------------------------------------

    async def answer(self, work: Work, deadline: float, render: Render) -> Response:
        """`work` scheduled within the request's deadline (time.monotonic()) and answered by `render`; the
        request metric says "text" for texts alone, as before mixed requests."""
        async def run() -> Response:
            done = await self.embed(work, deadline)
            with tracing.span("render", rows=len(done.rows)):
                response = render(done)
            self.metrics.embedded(work.endpoint, done.images, done.texts)
            return response

        texts_only = all(item.kind == "text" for item in work.items)
        return await self._timed("text" if texts_only else work.endpoint, run(), deadline)

    async def embed(self, work: Work, deadline: float) -> Scheduled:
        """Checked, admitted and encoded: every item's row in input order (steps 1-4 of the module's list)."""
        cut = check_dimensions(work.dimensions, self.model.embed_dim, self.front.allow_dimension_truncation)
        budget = check_patch_budget(work.patch_budget, self.model)
        images = [i for i, item in enumerate(work.items) if item.kind == "image"]
        texts = [i for i, item in enumerate(work.items) if item.kind == "text"]
        if len(images) > self.front.max_images_per_request:
            raise ApiError(422, ErrorType.TOO_MANY_IMAGES,
                           f"{len(images)} images in one request; the limit is {self.front.max_images_per_request}")
        needs = [tower for tower, places in (("image", images), ("text", texts)) if places]
        self.require(*needs, *([SCORE] if work.score else []))
        text_values = [str(work.items[i].value) for i in texts]
        if texts:
            check_texts(text_values, [work.items[i].label for i in texts], self.front, work.texts_called)
        for tower in needs:
            await self.admit(tower)
        logit = self._logit() if work.score else None
        tasks = [asyncio.ensure_future(self._images([work.items[i] for i in images], deadline, work.cache, budget)),
                 asyncio.ensure_future(self._texts(text_values, deadline, work.cache))]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one tower failed (a bad image): the other's work is not wanted
                task.cancel()
            raise
        rows = _in_order(len(work.items), self.model.embed_dim, (images, parts[0]), (texts, parts[1]))
        if cut is not None:
            rows = cut_dimensions(rows, cut)
        return Scheduled(rows, len(images), len(texts), logit)

    async def encode(self, tower: str, items: np.ndarray | JpegFiles | Sequence[str], deadline: float) -> np.ndarray:
        """Admitted items -> float32 [n, D], within the request's deadline (time.monotonic())."""
        wall_deadline = time.time() + (deadline - time.monotonic())
        try:
            with tracing.span("encode", tower=tower, items=len(items)):
                link = self.towers.for_lane(tower, lanes.current().lane)
                return await link.client.embed(items, wall_deadline, tracing.inject())
        except DeadlineExceeded:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED,
                           f"request did not finish within {self.door.front.live.request_timeout_s:g} s") from None
        except ImageRejected as exc:  # a JPEG the device decoder refused (device_jpeg_decode)
            raise rejection_error(exc) from None

    # -- the steps ----------------------------------------------------------------------------

    def _logit(self) -> tuple[float, float]:
        info = self.towers.info("text") or {}
        return float(info["logit_scale"]), float(info["logit_bias"])

    async def _images(self, items: Sequence[Item], deadline: float, use_cache: bool,
                      budget: int | None = None) -> np.ndarray | None:
        if not items:
            return None
        return await self.rows.image_rows(items, deadline, partial(self.encode, deadline=deadline), use_cache,
                                          budget)

    async def _texts(self, texts: list[str], deadline: float, use_cache: bool) -> np.ndarray | None:
        if not texts:
            return None
        return await self.rows.text_rows(texts, partial(self.encode, deadline=deadline), use_cache)

    async def _timed(self, endpoint: str, work: Awaitable[Response], deadline: float) -> Response:
        """Await a route's work and observe siglip_request_seconds with the status it ended in."""
        began = time.perf_counter()
        status = "200"
        try:
            return await work
        except ApiError as exc:
            status = str(exc.status)
            raise
        except asyncio.CancelledError:
            # The deadline (answered 504 by the front door) or the client went away (499: nginx's and
            # Ray Serve's code for it).
            status = "504" if time.monotonic() >= deadline else "499"
            raise
        except Exception:
            status = "500"
            raise
        finally:
            seconds = time.perf_counter() - began
            self.metrics.request(seconds, endpoint, status)
            ticket = lanes.current()
            lane = ticket.lane.name.lower()
            self.metrics.tenant_request(seconds, lane, ticket.tenant, status)
            if self.door.front.access_log:  # Serve's own access line cannot carry the tenant: ours beside it
                access_log.info("%s %s %.1fms tenant=%s lane=%s", endpoint, status, seconds * 1e3, ticket.tenant, lane)
            tracing.annotate(**{"http.response.status_code": int(status), "siglip.endpoint": endpoint,
                                "siglip.tenant": ticket.tenant, "siglip.lane": lane})


def _in_order(count: int, width: int, *parts: tuple[list[int], np.ndarray | None]) -> np.ndarray:
    """Each tower's rows put back at their items' places in the request."""
    width = next((rows.shape[1] for _, rows in parts if rows is not None), width)
    out = np.empty((count, width), dtype=np.float32)
    for places, rows in parts:
        if rows is not None:
            out[places] = rows
    return out
