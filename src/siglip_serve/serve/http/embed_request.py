"""What the endpoints' requests share (docs/http-api.md): the item a route hands to the scheduling call, each
an image or a text, and the pieces their request models are built of: typed items, image strings, the model's
name, the output encodings, the priority. Each endpoint's own request model and how it reads its items are in its
module (serve/ingress/endpoints/).

An item is typed (`{"type": "image", "image": ...}` / `{"type": "text", "text": ...}`, as Cohere's and
vLLM's typed inputs, or OpenAI's content part `{"type": "image_url", "image_url": {"url": ...}}`), or a string
its endpoint reads (/v1/embeddings by `modality` or by its content). An image item whose value is a URL
(`scheme://...`, not a data URI) is marked `url`: the route fetches it (serve/ingress/url_fetch.py, which refuses
every scheme but http and https) before it is decoded. Nothing here knows Ray or torch.

A request model parses loosely and its route checks the rest with messages that name the item; its schema, the
OpenAPI document's, says all a body must be to be embedded: a text not blank and within max_text_chars, the items
of each kind a request may hold, the model's name and size (serve/http/openapi.py puts in the service's values).
Where the rule is across fields, the schema is also one of several shapes (`views`), each a model of the fields
concerned, narrowed: the routes never parse with those.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from siglip_serve.core.lanes import MAX_PRIORITY
from siglip_serve.core.texts import NOT_BLANK
from siglip_serve.serve.http.openapi import service_limit

Modality = Literal["image", "text"]
# float / base64 (little-endian float32) as OpenAI; int8 / uint8 / binary / ubinary as Cohere, vLLM
# and NIM name them (serve/http/embedding_output.py says how each is made).
Encoding = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]

# An image given by URL: any scheme but data: (the fetcher answers the ones it does not fetch).
_URL = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\-]*://")
# base64url (RFC 4648 section 5) to the standard alphabet: some clients send the former.
URLSAFE_TO_STD = str.maketrans("-_", "+/")


# The OpenAPI document marks image strings with this format (serve/http/openapi.py): JSON Schema cannot say
# "decodes to an image", and a format names it for readers and generators (tests/integration/test_openapi.py).
IMAGE_FORMAT = "image-base64"
_IMAGE_TEXT = "an image: a data URI (data:image/png;base64,...) or bare base64 of the file"
_URL_TEXT = "an http(s) URL the service fetches where url_fetch_allowlist allows it (docs/http-api.md, Images by URL)"
ImageString = Annotated[str, Field(description=f"{_IMAGE_TEXT}, or {_URL_TEXT}",
                                   json_schema_extra={"format": IMAGE_FORMAT})]
# What core/texts.py check_text refuses, as the document says it: blank, or over max_text_chars.
TEXT_RULES: dict[str, Any] = {"pattern": NOT_BLANK, **service_limit(maxLength="max_text_chars")}
Text = Annotated[str, Field(description="a text: not blank, at most max_text_chars characters",
                            json_schema_extra=TEXT_RULES)]
ModelName = Annotated[Annotated[str, Field(json_schema_extra=service_limit(enum="models"))] | None,
                      Field(description="optional; must name a served model (default: the first)")]
# The model's size, or fewer where the operator allows truncation (serve/http/embedding_output.py check_dimensions).
Dimensions = Annotated[Annotated[int, Field(ge=1, json_schema_extra=service_limit(
    minimum="fewest_dimensions", maximum="dimensions"))] | None, Field(
    description="the model's size, or fewer where the operator allows truncation")]
# vLLM's and Cohere's `priority` (lower is earlier); here it can only move the request down from its key's
# lane (core/lanes.py), so Cohere's default of 0 changes nothing.
Priority = Annotated[int | None, Field(ge=0, le=MAX_PRIORITY, description=(
    "lower is handled earlier, as vLLM's and Cohere's: 0 the interactive lane, 1 the default lane, 2 and above "
    "the bulk lane; the request's lane is the later of this and its API key's (a request can only move itself "
    "down); also the X-Priority header"))]
# A SigLIP 2 NaFlex model's images are resized to a patch budget: its own, or one of its `patch_budgets`.
PatchBudget = Annotated[int | None, Field(ge=1, description=(
    "SigLIP 2 NaFlex models: the patch budget each image is resized to, one the model serves (/v1/models "
    "patch_budgets; default its own); for other models, or a budget not served, 422"))]
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
    text: Text


class ImageUrl(BaseModel):
    url: str = Field(description=f"a data URI of the image, or {_URL_TEXT}", json_schema_extra={"format": IMAGE_FORMAT})


class ImageUrlItem(BaseModel):
    """OpenAI's image content part, as chat messages write it (`detail` and other keys are ignored)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["image_url"]
    image_url: ImageUrl


TypedItem = Annotated[ImageItem | TextItem | ImageUrlItem, Field(discriminator="type")]
TypedImage = Annotated[ImageItem | ImageUrlItem, Field(discriminator="type")]


def typed(*items: type[BaseModel]) -> dict[str, Any]:
    """The schema of an item typed as one of `items` (their `type`)."""
    kinds = [get_args(item.model_fields["type"].annotation)[0] for item in items]
    return {"type": "object", "required": ["type"], "properties": {"type": {"enum": kinds}}}


def at_most(images: dict[str, Any], image_limit: str | tuple[str, int] = "max_images_per_request",
            text_limit: str | tuple[str, int] = "max_texts_per_request") -> dict[str, Any]:
    """A list's bound on its images (the items `images` matches) and its texts (the others), each its limit."""
    return {"allOf": [{"contains": images, "minContains": 0, **service_limit(maxContains=image_limit)},
                      {"contains": {"not": images}, "minContains": 0, **service_limit(maxContains=text_limit)}]}


def views(*shapes: Callable[[], type[BaseModel]], keyword: str = "oneOf") -> Any:
    """A request model's `__get_pydantic_json_schema__`: its schema, with the fields whose rules depend on each other
    said by one of `shapes` instead (models of those fields, each one shape of body; given as functions, as they are
    defined after it). Each field is said once: a constraint said twice would be negated in one place alone."""

    def schema(cls: type[BaseModel], core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        own = handler(core_schema)
        viewed = {name for shape in shapes for name in shape().model_fields}
        own["properties"] = {name: field for name, field in own["properties"].items() if name not in viewed}
        own["required"] = [name for name in own.get("required", []) if name not in viewed]
        if not own["required"]:
            del own["required"]
        return {**own, "allOf": [*own.get("allOf", []),
                                 {keyword: [handler(shape().__pydantic_core_schema__) for shape in shapes]}]}

    return classmethod(schema)


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


def image_items(values: Sequence[bytes | str], labels: Sequence[str]) -> list[Item]:
    """Image items; a JSON string that is an http(s) URL is fetched (serve/ingress/item_rows.py), file bytes
    never are."""
    return [image_item(value, label) for value, label in zip(values, labels, strict=True)]
