"""POST /v1/rerank (and /v2/rerank, Cohere's path): order documents by SigLIP's probability that each goes with
the query.

The shape is Cohere's v2 rerank (docs.cohere.com/v2/reference/rerank; the `cohere` SDK's `V2RerankResponse`,
cohere-ai/cohere-python src/cohere/v2/types/v2rerank_response.py): `model`, `query`, `documents`, `top_n`,
and `return_documents` as the SDK had it before July 2025 (each result then carries `document`). A document or
the query is a text (a string, as Cohere's) or a typed item as /v1/embeddings has them (`{"type": "text"}`,
`{"type": "image"}`, `{"type": "image_url"}`, an image's value base64, a data URI or an http(s) URL). The score is
classify's: sigmoid(logit_scale * cos(query, document) + logit_bias) with the text tower's published scale and
bias (serve/ingress/schedule.py `Scheduled.scores`). Results are sorted by score, highest first; equal scores keep the
documents' order (as Infinity's and vLLM's stable sorts; TEI reverses ties). Nothing here knows Ray. The document
states the request as one of two shapes, by the query's kind (`RerankTextQuery`, `RerankImageQuery`), as the query
counts among its kind's items.
"""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import uuid
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from siglip_serve.serve.http.embed_request import (
    CACHE_TEXT,
    NON_EMPTY,
    ImageItem,
    ImageUrlItem,
    Item,
    ModelName,
    Priority,
    Text,
    TextItem,
    TypedImage,
    TypedItem,
    at_most,
    image_item,
    typed,
    views,
)
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.http.http_body import read_json
from siglip_serve.serve.http.openapi import WORK_ERRORS, Operation
from siglip_serve.serve.http.responses import Answer, Counts
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import SCORE, Scheduled, Work


class RerankRequest(BaseModel):
    """Cohere's v2 rerank request; its other fields (`max_tokens_per_doc`...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName = None
    query: Annotated[str, Field(description="a text")] | TypedItem
    documents: list[Annotated[str, Field(description="a text (as Cohere's documents)")] | TypedItem] = Field(
        description="texts and images count against max_texts_per_request / max_images_per_request, the query "
                    "included", json_schema_extra=NON_EMPTY)
    # Cohere's minimum is 1; more than there are documents returns them all (Cohere, Infinity, vLLM).
    top_n: int | None = Field(None, ge=1, description="at most this many results; default all")
    return_documents: bool = Field(False, description="each result carries its document: {text} or {image} as sent")
    cache: bool = Field(True, description=CACHE_TEXT)
    priority: Priority = None

    __get_pydantic_json_schema__ = views(lambda: RerankTextQuery, lambda: RerankImageQuery)


Document = Annotated[Text, Field(description="a text (as Cohere's documents)")] | TypedItem
_IMAGES = typed(ImageItem, ImageUrlItem)


class RerankTextQuery(BaseModel):
    """A text query: the documents hold one text fewer than max_texts_per_request."""

    query: Text | TextItem
    documents: list[Document] = Field(json_schema_extra={**NON_EMPTY, **at_most(
        _IMAGES, text_limit=("max_texts_per_request", -1))})


class RerankImageQuery(BaseModel):
    """An image query: the documents hold one image fewer than max_images_per_request."""

    query: TypedImage
    documents: list[Document] = Field(json_schema_extra={**NON_EMPTY, **at_most(
        _IMAGES, image_limit=("max_images_per_request", -1))})


def _item(value: str | TypedItem, label: str) -> Item:
    if isinstance(value, str):
        return Item("text", value, label)  # Cohere's documents and query are texts
    if isinstance(value, TextItem):
        return Item("text", value.text, label)
    return image_item(value.image if isinstance(value, ImageItem) else value.image_url.url, label)


def read_rerank_items(request: RerankRequest) -> list[Item]:
    """The query's item first, then every document's in order; 422 without documents."""
    if not request.documents:
        raise ApiError(422, ErrorType.INVALID_REQUEST, "documents: at least one document is needed")
    return [_item(request.query, "query"),
            *(_item(document, f"documents[{i}]") for i, document in enumerate(request.documents))]


def _document(value: str | TypedItem) -> dict[str, Any]:
    """A document as a result echoes it: Cohere's `{"text": ...}`, or the image as it was sent."""
    if isinstance(value, str):
        return {"text": value}
    if isinstance(value, TextItem):
        return {"text": value.text}
    if isinstance(value, ImageUrlItem):
        return {"image": value.image_url.url}
    return {"image": value.image}


def render_rerank(request: RerankRequest, scores: np.ndarray, model: str, images: int, texts: int) -> Response:
    """`scores`: each document's probability, in the documents' order."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the documents' order
    results = []
    for i in order[:request.top_n]:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if request.return_documents:
            result["document"] = _document(request.documents[i])
        results.append(result)
    body = {"id": uuid.uuid4().hex, "results": results, "model": model,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"images": images}},
            "usage": {"images": images, "texts": texts}}
    return Response(orjson.dumps(body), media_type="application/json")


class RerankDocument(Answer):
    text: str | SkipJsonSchema[None] = None
    image: str | SkipJsonSchema[None] = None


class RerankResult(Answer):
    index: int = Field(ge=0, description="the document's place in the request")
    relevance_score: float = Field(ge=0, le=1, description="SigLIP's sigmoid probability, as classify's score")
    document: RerankDocument | SkipJsonSchema[None] = Field(None, description="return_documents only")


class RerankResponse(Answer):
    id: str
    results: list[RerankResult] = Field(description="highest relevance_score first; ties in the documents' order")
    model: str
    meta: dict[str, Any]
    usage: Counts


async def rerank(ingress: Ingress, request: Request, deadline: float) -> Response:
    """The query's row scored against every document's, as classify scores labels."""
    parsed = await read_json(request, ingress.front.max_body_bytes, RerankRequest)
    served = ingress.serving(parsed.model)

    def render(done: Scheduled) -> Response:
        scores = done.scores(done.rows[:1], done.rows[1:])[0]
        return render_rerank(parsed, scores, served.name, done.images, done.texts)

    work = Work("rerank", read_rerank_items(parsed), score=True, cache=parsed.cache,
                texts_called="texts (the query and documents)")
    return await served.scheduler.answer(work, deadline, render)


def _row(path: str, summary: str) -> Route:
    return Route("POST", path, rerank, needs=(SCORE,), endpoints=("rerank",), texts=True, doc=Operation(
        summary, RerankResponse, "the documents' indices and scores, highest first", WORK_ERRORS, body=RerankRequest))


_SUMMARY = "Rerank (Cohere's v2 shape): documents, texts or images, ordered by SigLIP's probability for the query"
# Jina's, Infinity's and TEI's path, and Cohere's (what the `cohere` SDK posts to), as vLLM serves both.
ROWS = (_row("/v1/rerank", _SUMMARY),
        _row("/v2/rerank", _SUMMARY + " (Cohere's path, as the cohere SDK calls it)"))
