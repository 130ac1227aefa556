"""POST /v1/embeddings: OpenAI's embeddings request shape, with images beside texts (docs/http-api.md).

An item is typed (serve/http/embed_request.py), or a string read by the request's `modality` (Infinity's field), or,
with neither, by the compatibility rule: a data URI, or bare base64 (whitespace such as MIME's line breaks allowed)
whose first bytes are the signature of an image format the service decodes, is an image; anything else is text. So
a broken base64 image sent without a modality can still read as text; a client that sends images says so and gets
the image's own error (400 naming the item). Every answer says how each item was read (`usage.read_as`). A string
read by the compatibility rule is never a URL (a text may well be one).
"""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import base64
import binascii
import re
from itertools import islice
from typing import Annotated

from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field

from siglip_serve.models.preprocess import SIGNATURE_BYTES, signature_format
from siglip_serve.serve.http.embed_request import (
    CACHE_TEXT,
    NON_EMPTY,
    URLSAFE_TO_STD,
    Encoding,
    ImageItem,
    Item,
    Modality,
    ModelName,
    Priority,
    TextItem,
    TypedItem,
    image_item,
)
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.http.http_body import read_json, render_embeddings
from siglip_serve.serve.http.openapi import WORK_ERRORS, Operation
from siglip_serve.serve.http.responses import EmbeddingsResponse
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import Scheduled, Work

# No image file in a supported format is under 24 bytes (32 base64 characters); a shorter word is text.
MIN_BARE_IMAGE_CHARS = 32
# The base64 alphabets and whitespace anywhere (MIME's line break every 76 characters, what Python's
# base64.encodebytes writes; CRLF, spaces), as serve/http/http_body.py's tolerant decoder reads them.
_BARE_BASE64 = re.compile(r"[A-Za-z0-9+/_\-\s]+(?:=\s*){0,2}")
# Characters that decode to at least SIGNATURE_BYTES bytes.
_HEAD_CHARS = -(-SIGNATURE_BYTES // 3) * 4
_ITEM_TEXT = ("an image or a text: read by `modality`, else an image when it is a data URI or base64 (whitespace "
              "such as MIME line breaks skipped) of an image file's bytes, else a text (docs/http-api.md)")
EmbeddingItem = Annotated[str, Field(description=_ITEM_TEXT)] | TypedItem


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request shape, with images beside texts."""

    model_config = ConfigDict(extra="ignore")

    input: EmbeddingItem | list[EmbeddingItem] = Field(json_schema_extra=NON_EMPTY)
    model: ModelName = None
    modality: Modality | None = Field(None, description="optional: read every string item as this (a broken image "
                                                        "then fails as one)")
    encoding_format: Encoding | None = Field(None, description="float when neither this nor embedding_types is given")
    embedding_types: Encoding | list[Encoding] | None = Field(
        None, description="Cohere's name for encoding_format (one type per request)")
    dimensions: int | None = Field(None, ge=1, description="the model's size, or fewer where the operator allows "
                                                            "truncation")
    # Named in the request rather than inferred, so a client can skip serve/ingress/embedding_cache.py for one call.
    cache: bool = Field(True, description=CACHE_TEXT)
    priority: Priority = None

    def encoding(self) -> Encoding:
        """`encoding_format`, or `embedding_types` as its alias; float when neither is given."""
        alias = self.embedding_types
        if isinstance(alias, list):
            if len(set(alias)) > 1:
                raise ApiError(422, ErrorType.INVALID_REQUEST,
                               f"embedding_types: one type per request, got {alias}; send one request per type")
            alias = alias[0] if alias else None
        if alias is not None and self.encoding_format is not None and alias != self.encoding_format:
            raise ApiError(422, ErrorType.INVALID_REQUEST,
                           f"encoding_format {self.encoding_format!r} and embedding_types {alias!r} disagree; "
                           "send one of them")
        return self.encoding_format or alias or "float"


def looks_like_image(item: str) -> bool:
    """The compatibility rule for an untyped string without `modality` (see the module docstring)."""
    stripped = item.strip()
    if stripped[:5].lower() == "data:":
        return True
    if len(stripped) < MIN_BARE_IMAGE_CHARS or _BARE_BASE64.fullmatch(stripped) is None:
        return False
    # Only the first characters that are not whitespace: an image's base64 runs to megabytes.
    first = "".join(islice((c for c in stripped if not c.isspace()), MIN_BARE_IMAGE_CHARS))
    if len(first) < MIN_BARE_IMAGE_CHARS:
        return False
    try:
        head = base64.b64decode(first[:_HEAD_CHARS].translate(URLSAFE_TO_STD), validate=True)
    except (binascii.Error, ValueError):
        return False
    return signature_format(head) is not None


def read_items(request: EmbeddingsRequest) -> list[Item]:
    """Each input item with the tower it goes to, in order; 422 for an empty input or a typed item
    that contradicts `modality`."""
    raw = request.input if isinstance(request.input, list) else [request.input]
    labels = [f"input[{i}]" for i in range(len(raw))] if isinstance(request.input, list) else ["input"]
    if not raw:
        raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image or text is needed")
    items = []
    for value, label in zip(raw, labels, strict=True):
        if isinstance(value, str):
            if request.modality == "image":
                items.append(image_item(value, label))
            elif request.modality == "text" or not looks_like_image(value):
                items.append(Item("text", value, label))
            else:
                items.append(Item("image", value, label))
            continue
        kind: Modality = "text" if isinstance(value, TextItem) else "image"
        if request.modality is not None and kind != request.modality:
            raise ApiError(422, ErrorType.INVALID_REQUEST,
                           f"{label} is typed {kind} but the request's modality is {request.modality}")
        if isinstance(value, TextItem):
            items.append(Item("text", value.text, label))
        else:
            items.append(image_item(value.image if isinstance(value, ImageItem) else value.image_url.url, label))
    return items


async def embeddings(ingress: Ingress, request: Request, deadline: float) -> Response:
    parsed = await read_json(request, ingress.config.max_body_bytes, EmbeddingsRequest)
    served = ingress.serving(parsed.model)
    items = read_items(parsed)
    encoding, read_as = parsed.encoding(), [item.kind for item in items]

    def render(done: Scheduled) -> Response:
        return render_embeddings(done.rows, served.name, encoding, done.images, done.texts, read_as=read_as)

    work = Work("embeddings", items, dimensions=parsed.dimensions, cache=parsed.cache)
    return await served.scheduler.answer(work, deadline, render)


ROWS = (
    Route("POST", "/v1/embeddings", embeddings, endpoints=("embeddings",), texts=True, doc=Operation(
        "Embed images (base64) and texts in OpenAI's embeddings request shape", EmbeddingsResponse,
        "one embedding per input, in order", WORK_ERRORS, body=EmbeddingsRequest)),
)
