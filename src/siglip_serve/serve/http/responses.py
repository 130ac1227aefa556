"""The JSON answers several endpoints share (docs/http-api.md) as pydantic models, for the OpenAPI document; each
endpoint's own answer model is in its module (serve/ingress/endpoints/), built on `Answer`.

The routes write their answers with orjson straight from numpy rows (serve/http/http_body.py, the endpoints'
modules), never through these models: the models say what those answers hold, and schemathesis checks
the live answers against them (tests/integration/test_openapi.py). A field the answer writes only sometimes is
`X | SkipJsonSchema[None] = None`: left out of `required` rather than published as nullable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from siglip_serve.serve.http.embed_request import Modality


def _no_null_defaults(schema: dict[str, Any]) -> None:
    # The answers leave such a field out; a published `default: null` would say it may be null.
    for field in schema.get("properties", {}).values():
        if field.get("default", ...) is None:
            del field["default"]


class Answer(BaseModel):
    model_config = ConfigDict(json_schema_extra=_no_null_defaults)


class Embedding(Answer):
    object: Literal["embedding"]
    index: int = Field(ge=0)
    embedding: list[float] | str = Field(description="numbers for float, integers for int8, uint8, binary, ubinary; "
                                                     "a string for base64 (little-endian float32)")
    scale: float | SkipJsonSchema[None] = Field(None, description="int8 / uint8 only: the vector is ~ q / scale "
                                                                  "(uint8: (q - 128) / scale)")


class EmbeddingsUsage(Answer):
    images: int
    texts: int
    prompt_tokens: int
    total_tokens: int
    read_as: list[Modality] | SkipJsonSchema[None] = Field(
        None, description="/v1/embeddings: how each input item was read, in order")


class EmbeddingsResponse(Answer):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class Counts(Answer):
    images: int
    texts: int
