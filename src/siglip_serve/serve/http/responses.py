"""The JSON answers of the HTTP contract (docs/http-api.md) as pydantic models, for the OpenAPI document.

The routes write their answers with orjson straight from numpy rows (serve/http/http_body.py, serve/http/rerank.py,
serve/ingress/routes.py), never through these models: the models say what those answers hold, and schemathesis checks
the live answers against them (tests/integration/test_openapi.py). A field the answer writes only sometimes is
`X | SkipJsonSchema[None] = None`: left out of `required` rather than published as nullable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from siglip_serve.serve.http.embed_request import Encoding, Modality


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


class LabelScore(Answer):
    label: str
    score: float = Field(ge=0, le=1, description="SigLIP's sigmoid probability")


class Classification(Answer):
    object: Literal["classification"]
    index: int = Field(ge=0)
    labels: list[LabelScore] = Field(description="every label with its sigmoid probability, highest first")


class Counts(Answer):
    images: int
    texts: int


class ClassifyResponse(Answer):
    object: Literal["list"]
    data: list[Classification]
    model: str
    template: str
    usage: Counts


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


class ModelsResponse(Answer):
    object: Literal["list"]
    data: list[dict[str, Any]] = Field(description="the served model, its replicas and its cache "
                                                   "(docs/http-api.md, GET /v1/models)")


class Health(Answer):
    status: str


class Ready(Answer):
    status: str
    replicas: int
    towers: dict[str, Any] | SkipJsonSchema[None] = Field(None, description="the counts per tower")
