"""Images by URL, the embedding cache and /v1/rerank end to end: the real application (tiny-siglip under the
session's Ray, HAProxy in front), one app for the three. Image servers listen on 127.0.0.2 (allowed as
127.0.0.2/32) and 127.0.0.3 (not): nothing is sent beyond loopback and no name is resolved."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import numpy as np
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.serve.ingress.schedule import zero_shot
from tests.bounds import SETTLE_S
from tests.helpers import API_KEY, AUTH, FileServer, ServeCluster, assert_error, cosine, deploy, jpeg_bytes

APP = "wire"
FETCHES_AT_ONCE = 2
MAX_TEXTS = 6


@pytest.fixture(scope="module")
def wire_app(serve_cluster: ServeCluster) -> str:
    deploy(APP, f"/{APP}", api_key=API_KEY, text_replicas=1, ingress_replicas=1, encoder_num_cpus=0.5,
           text_num_cpus=0.5, torch_threads=1, url_fetch_allowlist=["127.0.0.2/32"],
           url_fetch_concurrency=FETCHES_AT_ONCE, embedding_cache_mib=4, max_texts_per_request=MAX_TEXTS)
    return f"{serve_cluster.base_url}/{APP}"


@pytest.fixture(scope="module")
def client(wire_app: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=wire_app, headers=AUTH, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def servers(photo_jpegs: list[bytes]) -> Iterator[tuple[FileServer, FileServer]]:
    files = {f"/{i}.jpg": data for i, data in enumerate(photo_jpegs)}
    with FileServer("127.0.0.2", files) as allowed, FileServer("127.0.0.3", files) as other:
        yield allowed, other


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def url_item(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def rows_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    body = response.json()
    if "embeddings" in body:  # /v2/embed
        return np.array(body["embeddings"]["float"], dtype=np.float32)
    return np.array([item["embedding"] for item in body["data"]], dtype=np.float32)


def cache_stats(client: httpx.Client) -> dict[str, object]:
    stats: dict[str, object] = client.get("/v1/models").json()["data"][0]["cache"]
    return stats


def test_image_urls_are_fetched_on_every_route_that_takes_images(client: httpx.Client, photo_jpegs: list[bytes],
                                                                  servers: tuple[FileServer, FileServer]) -> None:
    allowed, _ = servers
    url, inline = f"{allowed.base}/1.jpg", b64(photo_jpegs[1])
    before = len(allowed.hits)
    ref = rows_of(client.post("/v1/embeddings", json={"input": inline, "modality": "image", "cache": False}))[0]
    answers = [
        client.post("/v1/embeddings", json={"input": [url_item(url), {"type": "image", "image": url}, "a cat"],
                                            "cache": False}),
        client.post("/v1/embeddings", json={"input": [url], "modality": "image", "cache": False}),
        client.post("/v2/embed", json={"images": [url], "cache": False}),
        client.post("/v2/embed", json={"inputs": [{"content": [url_item(url)]}], "cache": False}),
    ]
    got = [rows_of(answer) for answer in answers]
    for row in (got[0][0], got[0][1], got[1][0], got[2][0], got[3][0]):
        assert cosine(row, ref) >= 0.99999
    classified = client.post("/v1/classify", json={"input": [url, inline], "labels": ["cat", "rocket"]})
    assert classified.status_code == 200, classified.text
    by_url, by_value = ({x["label"]: x["score"] for x in item["labels"]} for item in classified.json()["data"])
    assert by_url == pytest.approx(by_value, abs=1e-5)
    ranked = client.post("/v1/rerank", json={"query": "a cat", "documents": [url_item(url), {"type": "image",
                                                                                            "image": inline}]})
    assert ranked.status_code == 200, ranked.text
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)
    # Each URL item fetched once per request, from the address that was checked, with the Host it named.
    fetched = allowed.hits[before:]
    assert [path for path, _ in fetched] == ["/1.jpg"] * 7
    assert {host for _, host in fetched} == {allowed.base.removeprefix("http://")}


def test_another_loopback_address_and_a_redirect_to_it_are_refused(client: httpx.Client,
                                                                   servers: tuple[FileServer, FileServer]) -> None:
    allowed, other = servers
    elsewhere = f"{other.base}/1.jpg"
    refused = assert_error(client.post("/v1/embeddings", json={"input": ["a cat", url_item(elsewhere)]}),
                           400, "url_not_allowed")
    assert refused["message"].startswith("input[1]: 127.0.0.3 resolves to a loopback address")
    assert "url_fetch_allowlist" in refused["message"]
    redirect = f"{allowed.base}/redirect?{quote(elsewhere, safe='')}"
    refused = assert_error(client.post("/v1/rerank", json={"query": "a cat", "documents": ["x", url_item(redirect)]}),
                           400, "url_not_allowed")
    assert refused["message"].startswith("documents[1]: 127.0.0.3 resolves to a loopback address")
    assert_error(client.post("/v1/classify", json={"input": elsewhere, "labels": ["cat"]}), 400, "url_not_allowed")
    scheme = assert_error(client.post("/v2/embed", json={"images": ["file:///etc/passwd"]}), 400, "url_not_allowed")
    assert "only http and https" in scheme["message"]
    assert other.hits == []  # nothing reached 127.0.0.3
    assert (f"/redirect?{quote(elsewhere, safe='')}", allowed.base.removeprefix("http://")) in allowed.hits


def test_fetches_at_once_are_bounded_per_ingress(client: httpx.Client, servers: tuple[FileServer, FileServer]) -> None:
    allowed, _ = servers
    allowed.most_active = 0
    items = [url_item(f"{allowed.base}/slow/{i}.jpg") for i in range(4)]
    assert rows_of(client.post("/v1/embeddings", json={"input": items, "cache": False})).shape == (4, 64)
    assert allowed.most_active == FETCHES_AT_ONCE  # url_fetch_concurrency; 4 without the bound


def _cache_hits(metrics_port: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "ray_siglip_embedding_cache_hits_total" and sample.labels.get("application") == APP)


def test_a_repeated_image_or_text_is_answered_byte_identical_from_the_cache(
        client: httpx.Client, serve_cluster: ServeCluster, servers: tuple[FileServer, FileServer]) -> None:
    allowed, _ = servers
    fresh = jpeg_bytes(np.random.default_rng(37).integers(0, 255, (96, 128, 3), dtype=np.uint8))
    allowed.files["/fresh.jpg"] = fresh
    asked = {"input": [{"type": "image", "image": b64(fresh)}, "a photo of a new thing"], "encoding_format": "base64"}
    before = cache_stats(client)
    first, again = (client.post("/v1/embeddings", json=asked) for _ in range(2))
    fetched = client.post("/v1/embeddings", json={"input": [url_item(f"{allowed.base}/fresh.jpg")],
                                                  "encoding_format": "base64"})
    after = cache_stats(client)
    assert first.status_code == again.status_code == fetched.status_code == 200, first.text
    # base64 is the float32 bytes themselves: the repeat and the fetched copy are the first answer's bytes.
    assert [d["embedding"] for d in again.json()["data"]] == [d["embedding"] for d in first.json()["data"]]
    assert fetched.json()["data"][0]["embedding"] == first.json()["data"][0]["embedding"]
    assert after["enabled"] is True and after["max_bytes"] == 4 * 1024 * 1024
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (2, 3)  # type: ignore[operator]
    # "cache": false computes again (and stores nothing); the answer is the same vector.
    bypassed = client.post("/v1/embeddings", json={**asked, "cache": False})
    last = cache_stats(client)
    assert (last["hits"], last["misses"], last["entries"]) == (after["hits"], after["misses"], after["entries"])
    assert last["bypassed"] == after["bypassed"] + 2  # type: ignore[operator]
    computed = np.frombuffer(base64.b64decode(bypassed.json()["data"][0]["embedding"]), "<f4")
    cached = np.frombuffer(base64.b64decode(first.json()["data"][0]["embedding"]), "<f4")
    assert cosine(computed, cached) >= 0.99999
    # The hits reach Prometheus as siglip_embedding_cache_hits_total (Ray pushes every second).
    hits, _, _ = poll(lambda: _cache_hits(serve_cluster.metrics_port), lambda n: n >= float(after["hits"]), SETTLE_S,
                      interval_s=0.5)
    assert hits >= float(after["hits"])  # type: ignore[arg-type]


def test_the_official_cohere_client_reranks_unchanged(wire_app: str, client: httpx.Client) -> None:
    import cohere

    documents = ["a photo of a rocket", "a cup of coffee", "a cat on a sofa", "an astronaut", "a tree"]
    query = "a photo of a cat"
    co = cohere.ClientV2(base_url=wire_app, api_key=API_KEY, timeout=60)
    answer = co.rerank(model="tiny-siglip", query=query, documents=documents, top_n=3)
    every = co.rerank(model="tiny-siglip", query=query, documents=documents)
    # What the scores must be: SigLIP's sigmoid over the served embeddings, with the published scale and bias.
    rows = rows_of(client.post("/v1/embeddings", json={"input": [query, *documents], "modality": "text"}))
    text = client.get("/v1/models").json()["data"][0]["text"]
    expected = zero_shot(rows[:1], rows[1:], text["logit_scale"], text["logit_bias"])[0]
    order = sorted(range(len(documents)), key=lambda i: -expected[i])
    assert [r.index for r in every.results] == order
    assert [r.index for r in answer.results] == order[:3]
    for result in every.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-9)
        assert 0.0 < result.relevance_score < 1.0
    assert isinstance(answer.id, str) and answer.id
    # Too many documents: the client raises the contract's 422 (the query counts among the texts).
    with pytest.raises(cohere.core.api_error.ApiError) as error:
        co.rerank(model="tiny-siglip", query=query, documents=["x"] * MAX_TEXTS)
    assert error.value.status_code == 422 and error.value.body["error"]["type"] == "too_many_texts"


def test_an_image_query_ranks_texts_and_images_and_echoes_documents(client: httpx.Client, photo_jpegs: list[bytes],
                                                                    servers: tuple[FileServer, FileServer]) -> None:
    allowed, _ = servers
    documents = ["an astronaut", {"type": "image", "image": b64(photo_jpegs[3])}, "coffee",
                 {"type": "image", "image": b64(photo_jpegs[0])}]
    ranked = client.post("/v2/rerank", json={"query": url_item(f"{allowed.base}/0.jpg"), "documents": documents,
                                             "return_documents": True, "top_n": 3})
    assert ranked.status_code == 200, ranked.text
    body = ranked.json()
    results = body["results"]
    assert len(results) == 3 and body["usage"] == {"images": 3, "texts": 2}
    # The query's own image (cosine 1) ranks first, echoed as it was sent.
    assert results[0]["index"] == 3 and results[0]["document"] == {"image": b64(photo_jpegs[0])}
    assert [r["relevance_score"] for r in results] == sorted((r["relevance_score"] for r in results), reverse=True)
    for result in results:
        document = documents[result["index"]]
        assert result["document"] == ({"text": document} if isinstance(document, str) else {"image": document["image"]})
