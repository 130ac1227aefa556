"""Several models in one service (serve/plan/served_models.py): tiny-siglip and the SigLIP 2 tiny architecture behind
one front door on one port, each on replicas of its own, chosen by the request's `model`; the real application
under the session's Ray."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.models.loading import load_embedder
from siglip_serve.models.settings import ModelSettings
from tests.bounds import SETTLE_S
from tests.helpers import API_KEY, AUTH, ServeCluster, TinyReference, deploy

ROUTE = "/two"
# The two tiny architectures differ in their text towers only: another seed tells their images apart too.
MODELS = [{"name": "old", "model": "tiny-siglip", "text_replicas": 1},
          {"name": "new", "model": "tiny-siglip2", "seed": 1, "text_replicas": 0}]
# The service's args, as a Serve YAML's `args:` would hold them.
ARGS = {"models": MODELS, "replicas": 1, "neuron_cores_per_replica": 0, "encoder_num_cpus": 0.25,
        "text_num_cpus": 0.25, "ingress_replicas": 1, "torch_threads": 1, "batch_wait_timeout_s": 0.01,
        "api_key": API_KEY}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster) -> Iterator[httpx.Client]:
    deploy("two", ROUTE, **ARGS)
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


def _series(text: str, name: str, app: str) -> list[dict[str, str]]:
    """The labels of every sample of `name` (Ray's exposition) that application `app` exported."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.index("}") + 1]))
            if labels.get("application") == app:
                found.append(labels)
    return found


def test_each_models_requests_and_forward_passes_carry_its_model_label(
        serve_cluster: ServeCluster, client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    for name in ("old", "new"):
        answer = client.post("/v1/embeddings/image", params={"model": name}, content=photo_jpegs[2],
                             headers={"Content-Type": "image/jpeg"})
        assert answer.status_code == 200, answer.text
    url = f"http://127.0.0.1:{serve_cluster.metrics_port}/metrics"

    def labelled() -> dict[str, set[str]]:
        text = httpx.get(url, timeout=10).text
        return {metric: {labels.get("model", "") for labels in _series(text, metric, "two")} for metric in (
            "ray_siglip_request_seconds_count", "ray_siglip_images_embedded_total",
            "ray_siglip_preprocess_seconds_count", "ray_siglip_encoder_forward_seconds_count")}

    # Ray pushes its metrics to the exporter every second (the test cluster's metrics_report_interval_ms).
    got, done, _ = poll(labelled, lambda got: all(models == {"old", "new"} for models in got.values()), SETTLE_S,
                        interval_s=0.5)
    assert done, got
    text = httpx.get(url, timeout=10).text
    forward = {(s["model"], s["deployment"]) for s in _series(text, "ray_siglip_encoder_forward_seconds_count", "two")
               if s["tower"] == "image"}
    assert forward == {("old", "Encoder-old"), ("new", "Encoder-new")}  # each model's passes on its own replicas


def test_bulk_on_a_named_model_of_the_service_config_equals_that_models_served_vectors(
        client: httpx.Client, photo_jpegs: list[bytes], tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    import yaml

    from siglip_serve.bulk.cli import main
    from siglip_serve.serve.serve_yaml import BUILDER

    photos = []
    for i, data in enumerate(photo_jpegs[:3]):
        photos.append(tmp_path / f"photo{i}.jpg")
        photos[-1].write_bytes(data)
    (tmp_path / "list.txt").write_text("\n".join(map(str, photos)))
    # The YAML `serve deploy` would take: deploy() adds the single-model defaults the args leave out.
    app = {"name": "two", "route_prefix": ROUTE, "import_path": BUILDER,
           "args": {"model": "tiny-siglip", "text_replicas": 0, **ARGS}}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({"applications": [app]}))
    # In the tests' Ray (the service runs there): the job joins it rather than starting its own.
    assert main([str(tmp_path / "list.txt"), "-o", str(tmp_path / "out"), "--service-config",
                 str(tmp_path / "serve.yaml"), "--served-model", "new"]) == 0
    table = pq.read_table(tmp_path / "out")
    assert set(table.column("model").to_pylist()) == {"tiny-siglip2"}
    rows = dict(zip(table.column("path").to_pylist(), table.column("embedding").to_pylist(), strict=True))
    for path, data in zip(photos, photo_jpegs[:3], strict=True):
        bulk = np.array(rows[str(path)], dtype=np.float32)
        new = client.post("/v1/embeddings/image", params={"model": "new"}, content=data,
                          headers={"Content-Type": "image/jpeg"})
        old = client.post("/v1/embeddings/image", params={"model": "old"}, content=data,
                          headers={"Content-Type": "image/jpeg"})
        assert cosine(bulk, embedding(new)) >= 0.99999
        assert cosine(bulk, embedding(old)) < 0.99  # the model named, not the default
