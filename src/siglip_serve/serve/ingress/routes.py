"""The HTTP contract's routes (docs/http-api.md), thin functions of the replica's `Ingress` (serve/ingress/ingress.py).

A work route reads its body into items (serve/http/embed_request.py, serve/http/http_body.py) and hands them to the one
scheduling call of the model it names, `ingress.serving(model).scheduler.answer(Work(...), deadline, render)`
(serve/ingress/schedule.py), saying only how to answer from the rows. What every route shares is written once: the API
key, the capability check, the request's place and deadline (serve/ingress/http_app.py), the limits, admission per tower
(drain, readiness), decoding, encoding and the metrics (serve/ingress/schedule.py). A new route is a function here and a
row in ROUTES (naming the `endpoint` labels its `Work` uses: the metrics export those), with its document in
serve/http/openapi.py; one that scores pairs (rerank) builds its items, asks `Work(score=True)` and renders
`done.scores(...)`, as classify does.
"""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import json
from collections.abc import Sequence

from fastapi import Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse

from siglip_serve.serve.http.embed_request import (
    CohereEmbedRequest,
    EmbeddingsRequest,
    Item,
    image_item,
    read_cohere_items,
    read_items,
)
from siglip_serve.serve.http.errors import ApiError, ErrorType, error_response
from siglip_serve.serve.http.http_body import (
    JsonRequest,
    check_image_content_type,
    file_labels,
    is_multipart,
    multipart_files,
    parse_json,
    read_body,
    read_classify,
    render_cohere,
    render_embeddings,
)
from siglip_serve.serve.http.openapi import openapi_document
from siglip_serve.serve.http.rerank import RerankRequest, read_rerank_items, render_rerank
from siglip_serve.serve.ingress.http_app import Probe, Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import SCORE, Scheduled, Work

# -- work: through the scheduling call ---------------------------------------------------------


async def embeddings(ingress: Ingress, request: Request, deadline: float) -> Response:
    parsed = await _read_json(ingress, request, EmbeddingsRequest)
    served = ingress.serving(parsed.model)
    items = read_items(parsed)
    encoding, read_as = parsed.encoding(), [item.kind for item in items]

    def render(done: Scheduled) -> Response:
        return render_embeddings(done.rows, served.name, encoding, done.images, done.texts, read_as=read_as)

    work = Work("embeddings", items, dimensions=parsed.dimensions, cache=parsed.cache)
    return await served.scheduler.answer(work, deadline, render)


async def embed_v2(ingress: Ingress, request: Request, deadline: float) -> Response:
    """Cohere's v2 embed shape on the same path as /v1/embeddings (serve/http/embed_request.py)."""
    parsed = await _read_json(ingress, request, CohereEmbedRequest)
    served = ingress.serving(parsed.model)
    items = read_cohere_items(parsed)
    texts = [str(item.value) for item in items if item.kind == "text"]
    work = Work("v2_embed", items, dimensions=parsed.output_dimension, cache=parsed.cache)
    return await served.scheduler.answer(work, deadline, lambda done: render_cohere(
        done.rows, served.name, parsed.embedding_types, texts, done.images))


async def embeddings_image(ingress: Ingress, request: Request, deadline: float) -> Response:
    """One image as the raw body, or any number as multipart file parts; the model by `?model=` (or the default)."""
    served = ingress.serving(request.query_params.get("model"))
    multipart = is_multipart(request)
    if not multipart:
        check_image_content_type(request)
    body = await read_body(request, ingress.config.max_body_bytes)
    if not multipart:
        work = Work("image", [Item("image", body, "image")])
    else:
        files = await multipart_files(request, body)
        work = Work("multipart", _images([data for _, data in files], file_labels(files)))
    return await served.scheduler.answer(work, deadline, lambda done: render_embeddings(
        done.rows, served.name, "float", images=done.images))


async def classify(ingress: Ingress, request: Request, deadline: float) -> Response:
    """Zero-shot: every image scored against every label's prompt with SigLIP's sigmoid."""
    body = await read_body(request, ingress.config.max_body_bytes)
    asked = await read_classify(request, body)
    served = ingress.serving(asked.model)
    if not asked.images:
        raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image is needed")
    prompts = prompts_of(asked.labels, asked.template)
    count = len(asked.images)
    items = [*_images(asked.images, asked.image_labels),
             *(Item("text", prompt, f"labels[{i}]") for i, prompt in enumerate(prompts))]

    def render(done: Scheduled) -> Response:
        data = []
        for i, row in enumerate(done.scores(done.rows[:count], done.rows[count:])):
            order = sorted(range(len(prompts)), key=lambda j: -row[j])  # stable: ties keep label order
            data.append({"object": "classification", "index": i,
                         "labels": [{"label": asked.labels[j], "score": float(row[j])} for j in order]})
        answer = {"object": "list", "data": data, "model": served.name, "template": asked.template,
                  "usage": {"images": done.images, "texts": done.texts}}
        return Response(json.dumps(answer, separators=(",", ":")), media_type="application/json")

    work = Work("classify", items, score=True, texts_called="labels")
    return await served.scheduler.answer(work, deadline, render)


async def rerank(ingress: Ingress, request: Request, deadline: float) -> Response:
    """Cohere's v2 rerank: documents (texts or images) ordered by SigLIP's probability for the query
    (serve/http/rerank.py), the query's row scored against every document's as classify scores labels."""
    parsed = await _read_json(ingress, request, RerankRequest)
    served = ingress.serving(parsed.model)

    def render(done: Scheduled) -> Response:
        scores = done.scores(done.rows[:1], done.rows[1:])[0]
        return render_rerank(parsed, scores, served.name, done.images, done.texts)

    work = Work("rerank", read_rerank_items(parsed), score=True, cache=parsed.cache,
                texts_called="texts (the query and documents)")
    return await served.scheduler.answer(work, deadline, render)


def prompts_of(labels: Sequence[str], template: str) -> list[str]:
    if template.count("{}") != 1:
        raise ApiError(422, ErrorType.INVALID_REQUEST,
                       "template must contain '{}' exactly once, where each label goes (e.g. \"a photo of {}\")")
    if len(set(labels)) != len(labels):
        raise ApiError(422, ErrorType.INVALID_REQUEST, "labels must be distinct")
    # str.replace, not str.format: braces in a label are text, never a format field.
    return [template.replace("{}", label) for label in labels]


async def _read_json(ingress: Ingress, request: Request, schema: type[JsonRequest]) -> JsonRequest:
    return parse_json(await read_body(request, ingress.config.max_body_bytes), schema)


def _images(values: Sequence[bytes | str], labels: Sequence[str]) -> list[Item]:
    """Image items; a JSON string that is an http(s) URL is fetched (serve/ingress/item_rows.py), file bytes
    never are."""
    return [image_item(value, label) for value, label in zip(values, labels, strict=True)]


# -- probes: about the service -----------------------------------------------------------------


async def models(ingress: Ingress, _: Request) -> Response:
    return JSONResponse({"object": "list", "data": await ingress.describe()})


async def healthz(_: Ingress, __: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(ingress: Ingress, _: Request) -> Response:
    # Probe answers are not counted as rejections: a 503 here is a state, not a refused request.
    refused, counts = await ingress.readiness()
    if refused is not None:
        return error_response(refused)
    return JSONResponse({"status": "ready", **counts})


async def openapi(ingress: Ingress, request: Request) -> Response:
    return Response(json.dumps(openapi_document(request.app, list(ingress.served))), media_type="application/json")


async def docs(_: Ingress, request: Request) -> Response:
    # With an API key the browser's fetch of /openapi.json needs the header too (docs/http-api.md).
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="siglip-serve")


ROUTES: tuple[Route | Probe, ...] = (
    Route("POST", "/v1/embeddings/image", embeddings_image, endpoints=("image", "multipart")),
    Route("POST", "/v1/embeddings", embeddings, endpoints=("embeddings",), texts=True),
    Route("POST", "/v2/embed", embed_v2, endpoints=("v2_embed",), texts=True),
    Route("POST", "/v1/classify", classify, needs=(SCORE,), endpoints=("classify",), texts=True),
    # Jina's, Infinity's and TEI's path, and Cohere's (what the `cohere` SDK posts to), as vLLM serves both.
    Route("POST", "/v1/rerank", rerank, needs=(SCORE,), endpoints=("rerank",), texts=True),
    Route("POST", "/v2/rerank", rerank, needs=(SCORE,), endpoints=("rerank",), texts=True),
    Probe("GET", "/v1/models", models),
    Probe("GET", "/healthz", healthz, auth=False),
    Probe("GET", "/readyz", readyz, auth=False),
    Probe("GET", "/openapi.json", openapi, in_schema=False),
    Probe("GET", "/docs", docs, in_schema=False),
)
