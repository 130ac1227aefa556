"""The contract as types: the OpenAPI document's bodies are the pydantic models' schemas (serve/http/openapi.py), the
error body is one model (serve/http/errors.py), and the metrics' endpoint labels come from the route table. The
document a service serves states its limits and the rules across fields (tests/integration/test_openapi.py checks
the live service against it)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from fastapi import FastAPI, Request, Response

from siglip_serve.serve.http.embed_request import IMAGE_FORMAT
from siglip_serve.serve.http.errors import ApiError, ErrorType, error_response
from siglip_serve.serve.http.openapi import SERVICE_LIMIT, ModelLimits, ServiceLimits, openapi_document
from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.http_app import Probe, endpoint_labels, operations


def document(limits: ServiceLimits | None = None) -> dict[str, Any]:
    app = FastAPI(title="siglip-serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    for route in ROUTES:
        async def endpoint(request: Request) -> Response:
            raise NotImplementedError

        app.add_api_route(route.path, endpoint, methods=[route.method], name=route.handler.__name__,
                          include_in_schema=route.in_schema if isinstance(route, Probe) else True)
    return openapi_document(app, operations(ROUTES), limits)


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def test_metrics_endpoint_labels_come_from_the_route_table() -> None:
    assert endpoint_labels(ROUTES) == (("image", "multipart", "embeddings", "v2_embed", "classify", "rerank"),
                                       ("embeddings", "v2_embed", "classify", "rerank"))


def test_json_bodies_are_the_request_models() -> None:
    doc = document()
    refs = {path: doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            for path in ("/v1/embeddings", "/v2/embed", "/v1/classify", "/v1/rerank", "/v2/rerank")}
    assert refs == {"/v1/embeddings": "#/components/schemas/EmbeddingsRequest",
                    "/v2/embed": "#/components/schemas/CohereEmbedRequest",
                    "/v1/classify": "#/components/schemas/ClassifyRequest",
                    "/v1/rerank": "#/components/schemas/RerankRequest",
                    "/v2/rerank": "#/components/schemas/RerankRequest"}
    schemas = doc["components"]["schemas"]
    # Field descriptions live on the models, and image strings carry the contract's format.
    assert "served model" in json.dumps(schemas["EmbeddingsRequest"]["properties"]["model"])
    assert schemas["ImageItem"]["properties"]["image"]["format"] == IMAGE_FORMAT
    embeddings = validator(doc, {"$ref": refs["/v1/embeddings"]})
    assert embeddings.is_valid({"input": ["a cat", {"type": "image", "image": "data:image/png;base64,AAAA"}],
                                "encoding_format": "int8"})
    assert not embeddings.is_valid({"input": []})
    assert not embeddings.is_valid({"input": "a cat", "encoding_format": "float16"})
    cohere = validator(doc, {"$ref": refs["/v2/embed"]})
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert not cohere.is_valid({"inputs": [{"content": two}]})


def test_every_error_status_publishes_the_error_model_that_error_response_writes() -> None:
    doc = document()
    body = json.loads(bytes(error_response(ApiError(422, ErrorType.INVALID_REQUEST, "input: bad")).body))
    assert body == {"error": {"message": "input: bad", "type": "invalid_request", "code": 422}}
    for path, methods in doc["paths"].items():
        for operation in methods.values():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {key: value for key, value in doc["components"]["schemas"]["ErrorBody"].items()
                                      if key != "$defs"}, (path, status)
    error = validator(doc, {"$ref": "#/components/schemas/ErrorBody"})
    assert error.is_valid(body)
    assert not error.is_valid({**body, "detail": "x"})
    assert not error.is_valid({"error": {**body["error"], "type": "teapot"}})


SMALL = ServiceLimits((ModelLimits("tiny-siglip", 64, truncation=False),), max_text_chars=10, max_texts_per_request=3,
                      max_images_per_request=2)
IMAGE = "data:image/png;base64,AAAA"  # the validator leaves `format` to the server: any string is an image here


def body(doc: dict[str, Any], path: str, media: str = "application/json") -> jsonschema.Draft202012Validator:
    return validator(doc, doc["paths"][path]["post"]["requestBody"]["content"][media]["schema"])


def test_the_document_without_a_service_names_the_settings_that_bound_it() -> None:
    text = document()["components"]["schemas"]["TextItem"]["properties"]["text"]
    assert text[SERVICE_LIMIT] == {"maxLength": "max_text_chars"} and "maxLength" not in text
    served = document(SMALL)["components"]["schemas"]["TextItem"]["properties"]["text"]
    assert served["maxLength"] == 10 and SERVICE_LIMIT not in json.dumps(document(SMALL))


def test_the_served_embeddings_bodies_are_the_ones_the_service_embeds() -> None:
    embeddings = body(document(SMALL), "/v1/embeddings")
    for valid in ({"input": "a cat"}, {"input": ["a", "b", "c"]}, {"input": IMAGE}, {"input": IMAGE, "modality": None},
                  {"input": [IMAGE, IMAGE], "modality": "image"}, {"input": [IMAGE, IMAGE, "a", "b", "c"]},
                  {"input": [{"type": "image", "image": "x"}, {"type": "text", "text": "data:,x"}, "a cat"]},
                  {"input": ["data:,x"], "modality": "text"}, {"input": "a", "model": "tiny-siglip", "dimensions": 64},
                  {"input": "a", "encoding_format": "int8", "embedding_types": ["int8", "int8"]}):
        assert embeddings.is_valid(valid), valid
    # What read_items, check_texts, the image count, EmbeddingsRequest.encoding and check_dimensions refuse.
    for invalid in ({"input": " \u3000\x1c"}, {"input": "x" * 11}, {"input": ["a"] * 4}, {"input": [IMAGE] * 3},
                    {"input": [{"type": "text", "text": "a"}], "modality": "image"},
                    {"input": [{"type": "image", "image": "x"}], "modality": "text"}, {"input": "a", "model": "other"},
                    {"input": "a", "dimensions": 32}, {"input": "a", "embedding_types": ["int8", "float"]},
                    {"input": "a", "encoding_format": "int8", "embedding_types": "float"},
                    {"input": [{"type": "text", "text": " "}]}):
        assert not embeddings.is_valid(invalid), invalid


def test_the_served_cohere_rerank_and_classify_bodies_state_their_rules() -> None:
    doc = document(SMALL)
    cohere = body(doc, "/v2/embed")
    assert cohere.is_valid({"texts": ["a"], "images": None})
    assert cohere.is_valid({"images": [IMAGE], "output_dimension": 64})
    text = {"content": [{"type": "text", "text": "a"}]}
    for invalid in ({"texts": ["a"], "images": [IMAGE]}, {}, {"texts": ["a"] * 4}, {"texts": [" "]},
                    {"inputs": [text] * 4}, {"texts": ["a"], "output_dimension": 32}):
        assert not cohere.is_valid(invalid), invalid
    rerank = body(doc, "/v2/rerank")
    image = {"type": "image", "image": IMAGE}
    assert rerank.is_valid({"query": "q", "documents": ["a", "b", image, image]})
    assert not rerank.is_valid({"query": "q", "documents": ["a", "b", "c"]})  # the query is the fourth text
    assert rerank.is_valid({"query": image, "documents": [image, "a"]})
    assert not rerank.is_valid({"query": image, "documents": [image, image]})
    for media in ("application/json", "multipart/form-data"):
        classify = body(doc, "/v1/classify", media)
        images = {"input": IMAGE} if media == "application/json" else {"file": ["x"]}
        for valid in ({"labels": ["cat"]}, {"labels": [" "], "template": "a {}"},
                      {"labels": ["x" * 10], "template": "{}"}):
            assert classify.is_valid({**images, **valid}), valid
        # What prompts_of and the checks of its prompts refuse.
        for invalid in ({"labels": ["cat", "cat"]}, {"labels": ["cat"], "template": "a photo"},
                        {"labels": ["cat"], "template": "{}{}"}, {"labels": [" "]},
                        {"labels": [" "], "template": " {}\n"}, {"labels": ["a", "b", "c", "d"]},
                        {"labels": ["x" * 11]}):
            assert not classify.is_valid({**images, **invalid}), invalid
    assert not body(doc, "/v1/classify").is_valid({"input": [IMAGE] * 3, "labels": ["cat"]})


def test_models_of_different_sizes_each_state_their_own_dimensions() -> None:
    limits = ServiceLimits((ModelLimits("big", 64, truncation=False), ModelLimits("small", 32, truncation=True)),
                           max_text_chars=10, max_texts_per_request=3, max_images_per_request=2)
    embeddings = body(document(limits), "/v1/embeddings")
    for valid in ({"dimensions": 64}, {"model": None, "dimensions": 64}, {"model": "big", "dimensions": 64},
                  {"model": "small", "dimensions": 16}, {"model": "small"}):
        assert embeddings.is_valid({"input": "a", **valid}), valid
    for invalid in ({"dimensions": 16}, {"model": "small", "dimensions": 64}, {"model": "other"}):
        assert not embeddings.is_valid({"input": "a", **invalid}), invalid


def test_a_patch_budget_is_offered_only_where_a_naflex_model_serves_it() -> None:
    """The ingress answers 422 to a budget its models do not serve (serve/ingress/schedule.py check_patch_budget):
    the served document says so, so that what the schema allows is what the service takes."""
    fixed = body(document(SMALL), "/v1/embeddings")
    assert fixed.is_valid({"input": IMAGE, "patch_budget": None})
    assert not fixed.is_valid({"input": IMAGE, "patch_budget": 256})
    naflex = ServiceLimits((ModelLimits("naflex", 64, truncation=False, patch_budgets=(256, 64)),),
                           max_text_chars=10, max_texts_per_request=3, max_images_per_request=2)
    served = body(document(naflex), "/v1/embeddings")
    for budget in (64, 256, None):
        assert served.is_valid({"input": IMAGE, "patch_budget": budget}), budget
    assert not served.is_valid({"input": IMAGE, "patch_budget": 128})
