"""POST /v2/embed: Cohere's v2 embed shape (`texts`, `images` or `inputs`; embeddings by type), read into the same
items as /v1/embeddings (serve/ingress/endpoints/embeddings.py) for one code path (docs/http-api.md). The document
states the request as one of three shapes, by the one of the three it gives (`CohereTexts`, `CohereImages`,
`CohereInputs`)."""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from siglip_serve.serve.http.embed_request import (
    CACHE_TEXT,
    NON_EMPTY,
    Dimensions,
    Encoding,
    ImageString,
    ImageUrl,
    Item,
    ModelName,
    PatchBudget,
    Priority,
    Text,
    at_most,
    image_item,
    typed,
    views,
)
from siglip_serve.serve.http.embedding_output import encode_rows
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.http.http_body import read_json
from siglip_serve.serve.http.openapi import WORK_ERRORS, Operation, service_limit
from siglip_serve.serve.http.responses import Answer
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import Work


class CohereText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text


class CohereImage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["image_url"]
    image_url: ImageUrl


class CohereInput(BaseModel):
    # maxItems for the document only: read_cohere_items refuses more with a message that says why.
    content: list[Annotated[CohereText | CohereImage, Field(discriminator="type")]] = Field(
        min_length=1, description="one text or one image per input (SigLIP fuses none)",
        json_schema_extra={"maxItems": 1})


def _float_only() -> list[Encoding]:
    return ["float"]


class CohereEmbedRequest(BaseModel):
    """Cohere's v2 embed request (and vLLM's Cohere route): exactly one of texts, images, inputs."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName = None
    texts: list[str] | None = Field(None, json_schema_extra=NON_EMPTY)
    images: list[ImageString] | None = Field(None, json_schema_extra=NON_EMPTY)
    inputs: list[CohereInput] | None = Field(None, json_schema_extra=NON_EMPTY)
    # SigLIP has no per-task prefixes.
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = Field(
        None, description="accepted; no effect on SigLIP")
    embedding_types: list[Encoding] = Field(default_factory=_float_only, min_length=1)
    output_dimension: Dimensions = None
    priority: Priority = None
    # NONE (an error instead) and START are refused: the tokens are counted only in the replica.
    truncate: Literal["END"] | None = Field(None, description="texts are cut at the end, as open_clip")
    cache: bool = Field(True, description=CACHE_TEXT)
    patch_budget: PatchBudget = None

    __get_pydantic_json_schema__ = views(lambda: CohereTexts, lambda: CohereImages, lambda: CohereInputs)


class CohereTexts(BaseModel):
    """`texts`"""

    texts: list[Text] = Field(json_schema_extra={**NON_EMPTY, **service_limit(maxItems="max_texts_per_request")})
    images: None = None
    inputs: None = None


class CohereImages(BaseModel):
    """`images`"""

    texts: None = None
    images: list[ImageString] = Field(
        json_schema_extra={**NON_EMPTY, **service_limit(maxItems="max_images_per_request")})
    inputs: None = None


class CohereInputs(BaseModel):
    """`inputs`, each one text or one image"""

    texts: None = None
    images: None = None
    inputs: list[CohereInput] = Field(json_schema_extra={**NON_EMPTY, **at_most(
        {"type": "object", "required": ["content"], "properties": {"content": {"contains": typed(CohereImage)}}})})


def read_cohere_items(request: CohereEmbedRequest) -> list[Item]:
    """The same items as /v1/embeddings': `texts` are texts, `images` images, each `inputs` entry one
    item; 422 when not exactly one of the three is given, or an input holds more than one content."""
    given = [name for name in ("texts", "images", "inputs") if getattr(request, name) is not None]
    if len(given) != 1:
        raise ApiError(422, ErrorType.INVALID_REQUEST,
                       f"give exactly one of texts, images or inputs (got {', '.join(given) or 'none'})")
    if request.texts is not None:
        items = [Item("text", text, f"texts[{i}]") for i, text in enumerate(request.texts)]
    elif request.images is not None:
        items = [image_item(image, f"images[{i}]") for i, image in enumerate(request.images)]
    else:
        items = []
        for i, entry in enumerate(request.inputs or []):
            if len(entry.content) != 1:
                raise ApiError(422, ErrorType.INVALID_REQUEST,
                               f"inputs[{i}] has {len(entry.content)} contents; SigLIP embeds one image or one "
                               "text per input (it does not fuse them): send each as its own input")
            (part,) = entry.content
            items.append(Item("text", part.text, f"inputs[{i}]") if isinstance(part, CohereText)
                         else image_item(part.image_url.url, f"inputs[{i}]"))
    if not items:
        raise ApiError(422, ErrorType.INVALID_REQUEST, f"{given[0]}: at least one item is needed")
    return items


class CohereEmbedResponse(Answer):
    id: str
    response_type: Literal["embeddings_by_type"]
    embeddings: dict[Encoding, list[list[float] | str]] = Field(
        description="per asked type, one row per input in order")
    scales: dict[Encoding, list[float]] | SkipJsonSchema[None] = Field(
        None, description="int8 / uint8: each row's scale (row ~ q / scale)")
    texts: list[str]
    model: str
    meta: dict[str, Any]


def render_cohere(embeddings: np.ndarray, model: str, encodings: Sequence[str], texts: Sequence[str],
                  images: int) -> Response:
    """Cohere's v2 embed answer: every asked encoding of every row, by type; int8/uint8 scales beside them."""
    by_type: dict[str, Any] = {}
    scales: dict[str, Any] = {}
    for encoding in dict.fromkeys(encodings):
        rows, row_scales = encode_rows(embeddings, encoding)
        by_type[encoding] = rows
        if row_scales is not None:
            scales[encoding] = row_scales
    body: dict[str, Any] = {
        "id": uuid.uuid4().hex, "response_type": "embeddings_by_type", "embeddings": by_type,
        "texts": list(texts), "model": model,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"images": images, "input_tokens": 0}},
    }
    if scales:
        body["scales"] = scales
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


async def embed_v2(ingress: Ingress, request: Request, deadline: float) -> Response:
    parsed = await read_json(request, ingress.front.max_body_bytes, CohereEmbedRequest)
    served = ingress.serving(parsed.model)
    items = read_cohere_items(parsed)
    texts = [str(item.value) for item in items if item.kind == "text"]
    work = Work("v2_embed", items, dimensions=parsed.output_dimension, cache=parsed.cache,
                patch_budget=parsed.patch_budget)
    return await served.scheduler.answer(work, deadline, lambda done: render_cohere(
        done.rows, served.name, parsed.embedding_types, texts, done.images))


ROWS = (
    Route("POST", "/v2/embed", embed_v2, endpoints=("v2_embed",), texts=True, doc=Operation(
        "Cohere's v2 embed shape (texts, images or inputs; embeddings by type), same path as /v1/embeddings",
        CohereEmbedResponse, "every asked type, one row per input, in order", WORK_ERRORS, body=CohereEmbedRequest)),
)
