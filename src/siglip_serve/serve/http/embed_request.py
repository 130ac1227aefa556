"""What an embeddings request asks for (docs/http-api.md): its items, each read as an image or a text,
the output encoding and `dimensions`. Two shapes, one reading: OpenAI's (/v1/embeddings) and Cohere's
v2 (/v2/embed: `texts`, `images` or `inputs`), both turned into the same items for one code path.

An item is typed (`{"type": "image", "image": ...}` / `{"type": "text", "text": ...}`, as Cohere's and
vLLM's typed inputs, or OpenAI's content part `{"type": "image_url", "image_url": {"url": ...}}`), or a
string read by the request's `modality` (Infinity's field), or, with neither, by the compatibility
rule: a data URI, or bare base64 (whitespace such as MIME's line breaks allowed) whose first bytes are
the signature of an image format the service decodes, is an image; anything else is text. So a broken
base64 image sent without a modality can still read as text; a client that sends images says so and gets the
image's own error (400 naming the item). Every answer says how each item was read (`usage.read_as`).
An image item whose value is a URL (`scheme://...`, not a data URI) is marked `url`: the route fetches
it (serve/ingress/url_fetch.py, which refuses every scheme but http and https) before it is decoded; a string
read by the compatibility rule is never a URL (a text may well be one). Nothing here knows Ray or torch.
"""

import base64
import binascii
import re
from dataclasses import dataclass
from itertools import islice
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from siglip_serve.models.preprocess import SIGNATURE_BYTES, signature_format
from siglip_serve.serve.http.errors import ApiError, ErrorType

Modality = Literal["image", "text"]
# float / base64 (little-endian float32) as OpenAI; int8 / uint8 / binary / ubinary as Cohere, vLLM
# and NIM name them (serve/http/embedding_output.py says how each is made).
Encoding = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]

# No image file in a supported format is under 24 bytes (32 base64 characters); a shorter word is text.
MIN_BARE_IMAGE_CHARS = 32
# The base64 alphabets and whitespace anywhere (MIME's line break every 76 characters, what Python's
# base64.encodebytes writes; CRLF, spaces), as serve/http/http_body.py's tolerant decoder reads them.
_BARE_BASE64 = re.compile(r"[A-Za-z0-9+/_\-\s]+(?:=\s*){0,2}")
# base64url (RFC 4648 section 5) to the standard alphabet: some clients send the former.
URLSAFE_TO_STD = str.maketrans("-_", "+/")
# An image given by URL: any scheme but data: (the fetcher answers the ones it does not fetch).
_URL = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\-]*://")
# Characters that decode to at least SIGNATURE_BYTES bytes.
_HEAD_CHARS = -(-SIGNATURE_BYTES // 3) * 4


# The OpenAPI document marks image strings with this format (serve/http/openapi.py): JSON Schema cannot say
# "decodes to an image", and a format names it for readers and generators (tests/integration/test_openapi.py).
IMAGE_FORMAT = "image-base64"
_IMAGE_TEXT = "an image: a data URI (data:image/png;base64,...) or bare base64 of the file"
_URL_TEXT = "an http(s) URL the service fetches where url_fetch_allowlist allows it (docs/http-api.md, Images by URL)"
ImageString = Annotated[str, Field(description=f"{_IMAGE_TEXT}, or {_URL_TEXT}",
                                   json_schema_extra={"format": IMAGE_FORMAT})]
ModelName = Annotated[str | None, Field(description="optional; must name the served model")]
# vLLM's and Cohere's `priority` (lower is earlier); here it can only move the request down from its key's
# lane (core/lanes.py), so Cohere's default of 0 changes nothing.
Priority = Annotated[int | None, Field(ge=0, le=999, description=(
    "lower is handled earlier, as vLLM's and Cohere's: 0 the interactive lane, 1 the default lane, 2 and above "
    "the bulk lane; the request's lane is the later of this and its API key's (a request can only move itself "
    "down); also the X-Priority header"))]
CACHE_TEXT = "false: neither read nor fill the embedding cache (embedding_cache_mib) for this request"
# For the document only: an empty list is refused by the reading functions, with a message naming the field.
NON_EMPTY: dict[str, Any] = {"minItems": 1}


class ImageItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["image"]
    image: ImageString


class TextItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    url: str = Field(description=f"a data URI of the image, or {_URL_TEXT}", json_schema_extra={"format": IMAGE_FORMAT})


class ImageUrlItem(BaseModel):
    """OpenAI's image content part, as chat messages write it (`detail` and other keys are ignored)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["image_url"]
    image_url: ImageUrl


TypedItem = Annotated[ImageItem | TextItem | ImageUrlItem, Field(discriminator="type")]
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


@dataclass(frozen=True)
class Item:
    kind: Modality
    value: str | bytes  # text, base64 or data URI; a raw body's or file part's bytes; the URL of a url item
    label: str  # how messages name it: input, input[3], file[0] (a.jpg)
    url: bool = False  # an image to fetch (serve/ingress/url_fetch.py) before decoding; value is the URL


def image_item(value: str | bytes, label: str) -> Item:
    """An image item, marked `url` when its value is a URL rather than the image (data URI, base64, bytes)."""
    is_url = isinstance(value, str) and _URL.match(value) is not None
    return Item("image", value.strip() if is_url and isinstance(value, str) else value, label, is_url)


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


# -- Cohere's v2 shape (/v2/embed) ---------------------------------------------------------

class CohereText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


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
    output_dimension: int | None = Field(None, ge=1)
    priority: Priority = None
    # NONE (an error instead) and START are refused: the tokens are counted only in the replica.
    truncate: Literal["END"] | None = Field(None, description="texts are cut at the end, as open_clip")
    cache: bool = Field(True, description=CACHE_TEXT)


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
