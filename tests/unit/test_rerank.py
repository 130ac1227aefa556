"""/v1/rerank and /v2/rerank (serve/ingress/endpoints/rerank.py, a thin route on the scheduling call): Cohere's v2
shape read into items (texts, typed images, URLs), the results sorted (ties in the documents' order) and cut to
`top_n`, the documents echoed when asked, scores as classify's (SigLIP's sigmoid with the text tower's logit scale
and bias), the per-request limits naming the documents, and 404 with text off. On an ingress's real app
(serve/ingress/http_app.py) with stand-in tower handles; the real app and the official `cohere` client are in
tests/integration/test_urls_cache_rerank.py."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.endpoints.rerank import RerankRequest, read_rerank_items, render_rerank
from siglip_serve.serve.ingress.http_app import http_app
from siglip_serve.serve.shared import registry
from tests.helpers import STAND_IN_RECORDS, TowerHandle, stand_in_ingress


@pytest.fixture(autouse=True)
def _no_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray here: the drain mark is never set."""
    monkeypatch.setattr(registry, "is_draining", lambda app: False)


def parse(**body: Any) -> RerankRequest:
    return RerankRequest.model_validate(body)


def test_cohere_strings_are_texts_and_typed_items_may_be_images_or_urls() -> None:
    asked = parse(query={"type": "image", "image": "data:image/png;base64,AAAA"},
                  documents=["a cat", {"type": "text", "text": "a dog"},
                             {"type": "image_url", "image_url": {"url": "https://img.test/a.jpg"}},
                             {"type": "image", "image": "iVBORw0KGgo="}])
    items = read_rerank_items(asked)
    assert [(i.kind, i.label, i.url) for i in items] == [
        ("image", "query", False), ("text", "documents[0]", False), ("text", "documents[1]", False),
        ("image", "documents[2]", True), ("image", "documents[3]", False)]
    # A string is a text even when it looks like an image: Cohere's documents are texts.
    assert read_rerank_items(parse(query="data:image/png;base64,AAAA", documents=["x"]))[0].kind == "text"
    with pytest.raises(ApiError) as error:
        read_rerank_items(parse(query="q", documents=[]))
    assert error.value.status == 422 and "documents" in error.value.message
    with pytest.raises(ValidationError):
        parse(query="q", documents=["a"], top_n=0)  # Cohere's minimum is 1


def _body(response: Any) -> dict[str, Any]:
    import json

    return dict(json.loads(bytes(response.body)))


def test_results_are_sorted_ties_keep_order_cut_to_top_n_and_documents_echoed_when_asked() -> None:
    documents: list[Any] = ["a", {"type": "text", "text": "b"}, {"type": "image", "image": "QUJD"},
                            {"type": "image_url", "image_url": {"url": "https://img.test/d.jpg"}}]
    scores = np.array([0.2, 0.9, 0.2, 0.5])
    body = _body(render_rerank(parse(query="q", documents=documents), scores, "m", 2, 3))
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [(1, 0.9), (3, 0.5), (0, 0.2), (2, 0.2)]
    assert all("document" not in r for r in body["results"])
    assert body["model"] == "m" and body["meta"]["api_version"] == {"version": "2"}
    assert body["usage"] == {"images": 2, "texts": 3}
    cut = _body(render_rerank(parse(query="q", documents=documents, top_n=2, return_documents=True), scores, "m", 2, 3))
    assert [(r["index"], r["document"]) for r in cut["results"]] == [(1, {"text": "b"}),
                                                                       (3, {"image": "https://img.test/d.jpg"})]
    everything = _body(render_rerank(parse(query="q", documents=documents, top_n=10, return_documents=True),
                                     scores, "m", 2, 3))
    assert [r["document"] for r in everything["results"]][2:] == [{"text": "a"}, {"image": "QUJD"}]


def _sigmoid(query: np.ndarray, document: np.ndarray) -> float:
    record = STAND_IN_RECORDS[1]
    logit = float(record["logit_scale"]) * float(query.astype(np.float64) @ document.astype(np.float64))
    return float(1.0 / (1.0 + np.exp(-(logit + float(record["logit_bias"])))))


def test_scores_are_sigmoid_probabilities_from_the_scheduling_call_on_both_paths(photo_jpegs: list[bytes]) -> None:
    image, text = TowerHandle(), TowerHandle()
    ingress = stand_in_ingress(image, text, max_texts_per_request=3, max_images_per_request=2)
    b64 = base64.b64encode(photo_jpegs[0]).decode()
    documents = ["a dog", {"type": "image", "image": b64}, "a car"]
    with TestClient(http_app(ingress, ROUTES), raise_server_exceptions=False) as client:
        v1 = client.post("/v1/rerank", json={"query": "a cat", "documents": documents, "model": "tiny-siglip"})
        v2 = client.post("/v2/rerank", json={"query": "a cat", "documents": documents, "top_n": 1})
        too_many = client.post("/v1/rerank", json={"query": "a cat", "documents": ["a", "b", "c"]})
        images = client.post("/v1/rerank", json={"query": {"type": "image", "image": b64},
                                                 "documents": [{"type": "image", "image": b64}] * 2})
        wrong_model = client.post("/v1/rerank", json={"query": "q", "documents": ["a"], "model": "rerank-v3.5"})
    assert v1.status_code == 200, v1.text
    query = TowerHandle.vector("a cat")
    # The stand-in encodes the image's pixels; the rows come back as the scheduling call answers them.
    rows = {0: TowerHandle.vector("a dog"), 2: TowerHandle.vector("a car")}
    results = v1.json()["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert [r["relevance_score"] for r in results] == sorted((r["relevance_score"] for r in results), reverse=True)
    for result in results:
        if result["index"] in rows:
            assert result["relevance_score"] == pytest.approx(_sigmoid(query, rows[result["index"]]), rel=1e-6)
    assert v1.json()["usage"] == {"images": 1, "texts": 3}
    assert v2.status_code == 200 and v2.json()["results"] == results[:1]
    # The query counts with the documents against the per-request limits, and the message says so.
    assert too_many.status_code == 422 and too_many.json()["error"]["type"] == "too_many_texts"
    assert "4 texts (the query and documents) in one request; the limit is 3" in too_many.json()["error"]["message"]
    assert images.status_code == 422 and images.json()["error"]["type"] == "too_many_images"
    assert wrong_model.status_code == 404 and wrong_model.json()["error"]["type"] == "not_found"
    message = wrong_model.json()["error"]["message"]
    assert "rerank-v3.5" in message and "tiny-siglip" in message  # what was asked, and what is served


def test_rerank_needs_the_text_tower_for_its_logit_scale_and_bias() -> None:
    with TestClient(http_app(stand_in_ingress(TowerHandle(), None), ROUTES), raise_server_exceptions=False) as client:
        response = client.post("/v1/rerank")  # the capability is checked before the body is read
    assert response.status_code == 404 and "text_replicas: 0" in response.json()["error"]["message"]
