"""POST /v1/embeddings: OpenAI's embeddings request shape, with images beside texts (docs/http-api.md).

An item is typed (serve/http/embed_request.py), or a string read by the request's `modality` (Infinity's field), or,
with neither, by the compatibility rule: a data URI, or bare base64 (whitespace such as MIME's line breaks allowed)
whose first bytes are the signature of an image format the service decodes, is an image; anything else is text. So
a broken base64 image sent without a modality can still read as text; a client that sends images says so and gets
the image's own error (400 naming the item). Every answer says how each item was read (`usage.read_as`). A string
read by the compatibility rule is never a URL (a text may well be one).

The document states the request as one of three shapes, by `modality` (`ImagesByModality`, `TextsByModality`,
`ItemsByContent`).
"""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import base64
import binascii
import re
from itertools import islice
from typing import Annotated, Any, Literal, get_args

from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field

from siglip_serve.core.texts import BLANK_CHAR
from siglip_serve.models.preprocess import SIGNATURE_BYTES, signature_format
from siglip_serve.serve.http.embed_request import (
    CACHE_TEXT,
    NON_EMPTY,
    TEXT_RULES,
    URLSAFE_TO_STD,
    Dimensions,
    Encoding,
    ImageItem,
    ImageString,
    ImageUrlItem,
    Item,
    Modality,
    ModelName,
    PatchBudget,
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
from siglip_serve.serve.http.http_body import read_json, render_embeddings
from siglip_serve.serve.http.openapi import WORK_ERRORS, Operation, service_limit
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
# A data URI, which looks_like_image reads as an image whatever follows.
_DATA_URI = f"^{BLANK_CHAR}*[dD][aA][tT][aA]:"


def _one_encoding(schema: dict[str, Any]) -> None:
    # `encoding` refuses two encodings: encoding_format and embedding_types name at most one between them.
    schema["anyOf"] = [{"properties": {
        "encoding_format": {"enum": [encoding, None]},
        "embedding_types": {"anyOf": [{"const": encoding}, {"type": "array", "items": {"const": encoding}},
                                      {"type": "null"}]}}} for encoding in get_args(Encoding)]


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request shape, with images beside texts: every item an image, every item a text, or
    (without `modality`) each item by its type or content."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_one_encoding)

    input: EmbeddingItem | list[EmbeddingItem] = Field(json_schema_extra=NON_EMPTY)
    model: ModelName = None
    modality: Modality | None = Field(None, description="optional: read every string item as this (a broken image "
                                                        "then fails as one)")
    encoding_format: Encoding | None = Field(None, description="float when neither this nor embedding_types is given")
    embedding_types: Encoding | list[Encoding] | None = Field(
        None, description="Cohere's name for encoding_format (one type per request)")
    dimensions: Dimensions = None
    # Named in the request rather than inferred, so a client can skip serve/ingress/embedding_cache.py for one call.
    cache: bool = Field(True, description=CACHE_TEXT)
    patch_budget: PatchBudget = None
    priority: Priority = None

    # anyOf: a body of images without `modality` is of the first shape and of the last.
    __get_pydantic_json_schema__ = views(lambda: ImagesByModality, lambda: TextsByModality, lambda: ItemsByContent,
                                         keyword="anyOf")

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


# The views' items. An image string is a data URI: one the server reads as an image with or without a modality. (Bare
# base64 of an image file is read as one too, but as a text's pattern JSON Schema cannot tell it from a text; typed
# items carry it.)
DataUri = Annotated[ImageString, Field(description="an image as a data URI (data:image/png;base64,...)",
                                       json_schema_extra={"pattern": _DATA_URI})]
ImageInput = DataUri | TypedImage
TextInput = Text | TextItem
ContentText = Annotated[str, Field(description="a text (a string that is a data URI, or base64 of an image file, is "
                                               "read as an image)",
                                   json_schema_extra={**TEXT_RULES, "not": {"pattern": _DATA_URI}})]
ContentItem = ContentText | DataUri | TypedItem
# What counts against max_images_per_request among ContentItems.
_IMAGE_ITEM = {"anyOf": [typed(ImageItem, ImageUrlItem), {"type": "string", "pattern": _DATA_URI}]}


class ImagesByModality(BaseModel):
    """Every item an image: with `modality` image, or without it (an image's string is then read by its content)."""

    # Not required: a body of images that leaves `modality` out is embedded the same.
    modality: Literal["image"] | None = None
    input: ImageInput | list[ImageInput] = Field(
        json_schema_extra={**NON_EMPTY, **service_limit(maxItems="max_images_per_request")})


class TextsByModality(BaseModel):
    """`modality` text: every item a text, a string or typed."""

    modality: Literal["text"]
    input: TextInput | list[TextInput] = Field(
        json_schema_extra={**NON_EMPTY, **service_limit(maxItems="max_texts_per_request")})


class ItemsByContent(BaseModel):
    """No `modality`: a typed item is what its type says; a string a text, or an image when it is a data URI."""

    modality: None = None
    input: ContentItem | list[ContentItem] = Field(json_schema_extra={**NON_EMPTY, **at_most(_IMAGE_ITEM)})


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
    parsed = await read_json(request, ingress.front.max_body_bytes, EmbeddingsRequest)
    served = ingress.serving(parsed.model)
    items = read_items(parsed)
    encoding, read_as = parsed.encoding(), [item.kind for item in items]

    def render(done: Scheduled) -> Response:
        return render_embeddings(done.rows, served.name, encoding, done.images, done.texts, read_as=read_as)

    work = Work("embeddings", items, dimensions=parsed.dimensions, cache=parsed.cache,
                patch_budget=parsed.patch_budget)
    return await served.scheduler.answer(work, deadline, render)


ROWS = (
    Route("POST", "/v1/embeddings", embeddings, endpoints=("embeddings",), texts=True, doc=Operation(
        "Embed images (base64) and texts in OpenAI's embeddings request shape", EmbeddingsResponse,
        "one embedding per input, in order", WORK_ERRORS, body=EmbeddingsRequest)),
)
