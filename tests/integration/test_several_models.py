"""Several models in one service (serve/plan/served_models.py): tiny-siglip and the SigLIP 2 tiny architecture behind
one front door on one port, each on replicas of its own, chosen by the request's `model`; the real application
under the session's Ray."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from siglip_serve.models.loading import load_embedder
from siglip_serve.models.settings import ModelSettings
from tests.helpers import API_KEY, AUTH, ServeCluster, TinyReference, deploy

ROUTE = "/two"
# The two tiny architectures differ in their text towers only: another seed tells their images apart too.
MODELS = [{"name": "old", "model": "tiny-siglip", "text_replicas": 1},
          {"name": "new", "model": "tiny-siglip2", "seed": 1, "text_replicas": 0}]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster) -> Iterator[httpx.Client]:
    deploy("two", ROUTE, models=MODELS, replicas=1, neuron_cores_per_replica=0, encoder_num_cpus=0.25,
           text_num_cpus=0.25, ingress_replicas=1, torch_threads=1, batch_wait_timeout_s=0.01, api_key=API_KEY)
    with httpx.Client(base_url=serve_cluster.base_url + ROUTE, headers=AUTH, timeout=60) as client:
        yield client


def reference(model: str, seed: int = 0) -> TinyReference:
    embedder, info = load_embedder(ModelSettings(model=model, seed=seed))
    return TinyReference(embedder, info.image_size)


def embedding(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["data"][0]["embedding"], dtype=np.float32)


def test_each_request_gets_its_own_models_vectors(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[0]).decode()
    old, new = reference("tiny-siglip"), reference("tiny-siglip2", seed=1)
    want_old, want_new = old.embed(photo_jpegs[0]), new.embed(photo_jpegs[0])
    assert cosine(want_old, want_new) < 0.99  # two different models: the test can tell them apart
    for name, want in (("old", want_old), ("new", want_new)):
        answer = client.post("/v1/embeddings", json={"input": image, "modality": "image", "model": name})
        assert cosine(embedding(answer), want) >= 0.9999 and answer.json()["model"] == name
        raw = client.post("/v1/embeddings/image", params={"model": name}, content=photo_jpegs[0],
                          headers={"Content-Type": "image/jpeg"})
        assert cosine(embedding(raw), want) >= 0.9999
        cohere = client.post("/v2/embed", json={"images": [image], "model": name})
        assert cohere.status_code == 200 and cohere.json()["model"] == name
        row = np.array(cohere.json()["embeddings"]["float"][0], dtype=np.float32)
        assert cosine(row, want) >= 0.9999
    # No model: the default, the first.
    assert cosine(embedding(client.post("/v1/embeddings", json={"input": image, "modality": "image"})),
                  want_old) >= 0.9999
    # Text is on for "old" only, as each model's settings say.
    assert client.post("/v1/embeddings", json={"input": "a cat", "model": "old"}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": "a cat", "model": "new"}).status_code == 404


def test_an_unknown_model_is_404_naming_the_served_ones(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    answer = client.post("/v1/embeddings/image", params={"model": "newest"}, content=photo_jpegs[0],
                         headers={"Content-Type": "image/jpeg"})
    error = answer.json()["error"]
    assert answer.status_code == 404 and error["type"] == "not_found"
    assert "'newest'" in error["message"] and "'old'" in error["message"] and "'new'" in error["message"]
    rerank = client.post("/v1/rerank", json={"query": "a cat", "documents": ["a dog"], "model": "newest"})
    assert rerank.status_code == 404


def test_models_lists_both_and_readyz_says_each_is_ready(client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["model"], m["default"]) for m in listed] == [("old", "tiny-siglip", True),
                                                                   ("new", "tiny-siglip2", False)]
    assert listed[0]["modalities"] == ["image", "text"] and listed[1]["modalities"] == ["image"]
    assert listed[0]["embedding_dim"] == listed[1]["embedding_dim"] == 64
    assert all(len(m["replicas"]) == 1 for m in listed)  # each model counts its own replica only
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == {"old": True, "new": True}


def test_the_openai_and_cohere_clients_pick_a_model_by_name(serve_cluster: ServeCluster, client: httpx.Client,
                                                           photo_jpegs: list[bytes]) -> None:
    import cohere
    from openai import OpenAI

    image = "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[1]).decode()
    openai = OpenAI(base_url=f"{serve_cluster.base_url}{ROUTE}/v1", api_key=API_KEY, timeout=60)
    got = openai.embeddings.create(model="new", input=[image], encoding_format="float")
    assert got.model == "new"
    want = reference("tiny-siglip2", seed=1).embed(photo_jpegs[1])
    assert cosine(np.array(got.data[0].embedding, dtype=np.float32), want) >= 0.9999
    co = cohere.ClientV2(base_url=f"{serve_cluster.base_url}{ROUTE}", api_key=API_KEY, timeout=60)
    embedded = co.embed(model="new", input_type="image", images=[image], embedding_types=["float"])
    assert embedded.embeddings.float_ is not None
    assert cosine(np.array(embedded.embeddings.float_[0], dtype=np.float32), want) >= 0.9999
