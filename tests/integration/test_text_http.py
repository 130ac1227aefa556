"""Text embeddings and /v1/classify end to end, against the real application on tiny-siglip under Ray."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.models.backends.implementation import create_text_encoder
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEncoder
from siglip_serve.serve.ingress.schedule import zero_shot
from tests.bounds import SETTLE_S
from tests.helpers import (
    API_KEY,
    AUTH,
    CHECKPOINT_MODEL,
    REPO,
    SRC,
    ServeCluster,
    TinyReference,
    assert_error,
    cosine,
    deploy,
    forced_checkpoint,
    small_tokenizer,
)

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def client(main_app: str) -> httpx.Client:
    with httpx.Client(base_url=main_app, headers=AUTH, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def text_reference() -> TextEncoder:
    return create_text_encoder(ModelSettings(model="tiny-siglip", torch_threads=1))


def text_embeddings(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "tiny-siglip"
    assert body["usage"]["texts"] == len(body["data"]) and body["usage"]["images"] == 0
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    return np.array([item["embedding"] for item in body["data"]], dtype=np.float32)


def data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def test_text_embeddings_match_the_in_process_text_tower(client: httpx.Client, text_reference: TextEncoder) -> None:
    texts = ["a photo of a cat", "rocket", "Coffee, black!"]
    got = text_embeddings(client.post("/v1/embeddings", json={"input": texts, "model": "tiny-siglip"}))
    want = text_reference.encode(texts)
    assert got.shape == (3, 64)
    for row, ref in zip(got, want, strict=True):
        assert cosine(row, ref) >= 0.9999
    single = text_embeddings(client.post("/v1/embeddings", json={"input": "rocket"}))
    assert single.shape == (1, 64) and cosine(single[0], want[1]) >= 0.9999
    encoded = client.post("/v1/embeddings", json={"input": ["rocket"], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, single[0], atol=1e-7)
    # More texts than the largest text bucket (32) travel in several chunks, answered in order.
    many = [f"photo {i}" for i in range(40)]
    np.testing.assert_allclose(text_embeddings(client.post("/v1/embeddings", json={"input": many})),
                               text_reference.encode(many), atol=1e-5)


def test_text_input_errors(client: httpx.Client) -> None:
    empty = assert_error(client.post("/v1/embeddings", json={"input": ["cat", "  "]}), 422, "invalid_request")
    assert "input[1]" in empty["message"]
    long = assert_error(client.post("/v1/embeddings", json={"input": ["x " * 600]}), 413, "text_too_long")
    assert "1000-character limit" in long["message"]
    many = assert_error(client.post("/v1/embeddings", json={"input": ["cat"] * 65}), 422, "too_many_texts")
    assert "64" in many["message"]
    assert_error(client.post("/v1/embeddings", json={"input": ["cat", 3]}), 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": {"text": "cat"}}), 422, "invalid_request")


def test_a_mixed_request_keeps_input_order_and_says_how_each_item_was_read(
        client: httpx.Client, photo_jpegs: list[bytes], text_reference: TextEncoder,
        tiny_reference: TinyReference) -> None:
    bare = base64.b64encode(photo_jpegs[0]).decode()
    body = client.post("/v1/embeddings", json={"input": [
        "a cat", bare, {"type": "text", "text": bare[:50]}, {"type": "image", "image": data_uri(photo_jpegs[1])}]})
    assert body.status_code == 200, body.text
    answer = body.json()
    assert answer["usage"]["read_as"] == ["text", "image", "text", "image"]
    assert (answer["usage"]["images"], answer["usage"]["texts"]) == (2, 2)
    rows = np.array([item["embedding"] for item in answer["data"]], dtype=np.float32)
    texts = text_reference.encode(["a cat", bare[:50]])
    assert cosine(rows[0], texts[0]) >= 0.9999 and cosine(rows[2], texts[1]) >= 0.9999
    assert cosine(rows[1], tiny_reference.embed(photo_jpegs[0])) >= 0.9999
    assert cosine(rows[3], tiny_reference.embed(photo_jpegs[1])) >= 0.9999


def test_base64_with_line_breaks_or_spaces_is_read_as_the_image_it_is(
        client: httpx.Client, photo_jpegs: list[bytes], tiny_reference: TinyReference) -> None:
    bare = base64.b64encode(photo_jpegs[0]).decode()
    mime = base64.encodebytes(photo_jpegs[0]).decode()  # a line break every 76 characters
    spaced = " ".join(bare[i:i + 4] for i in range(0, len(bare), 4))
    # Before: 413 text_too_long, the MIME base64 read as a text of thousands of characters.
    body = client.post("/v1/embeddings", json={"input": [mime, "a cat", mime.replace("\n", "\r\n"), spaced]})
    assert body.status_code == 200, body.text
    answer = body.json()
    assert answer["usage"]["read_as"] == ["image", "text", "image", "image"]
    want = tiny_reference.embed(photo_jpegs[0])
    for index in (0, 2, 3):
        assert cosine(np.array(answer["data"][index]["embedding"], dtype=np.float32), want) >= 0.9999


def test_a_file_that_starts_as_a_jpeg_and_does_not_decode_is_invalid_image_however_it_arrives(
        client: httpx.Client) -> None:
    for soi in (b"\xff\xd8", b"\xff\xd8\xff"):  # the SOI marker alone, and with the next marker's FF
        broken = soi + b"printable garbage after a JPEG's SOI marker\n" * 40
        encoded = base64.b64encode(broken).decode()
        # Before: 415 unsupported_media_type, "data is text, not an image" (bulk: tests/integration/test_bulk.py).
        for response in (
                client.post("/v1/embeddings/image", content=broken, headers={"Content-Type": "image/jpeg"}),
                client.post("/v1/embeddings/image", files=[("files", ("cut.jpg", broken, "image/jpeg"))]),
                client.post("/v1/embeddings", json={"input": ["a cat", encoded]}),  # an image by its signature
                client.post("/v1/embeddings", json={"input": [encoded], "modality": "image"})):
            error = assert_error(response, 400, "invalid_image")
            assert "starts as a JPEG file but cannot be decoded" in error["message"], error


def test_a_client_that_says_image_gets_the_images_own_error(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    bare = base64.b64encode(photo_jpegs[0]).decode()
    broken = bare[:40] + "!" + bare[41:]
    # Without a modality the broken image reads as a (long) text, as the compatibility rule says.
    guessed = assert_error(client.post("/v1/embeddings", json={"input": [bare, broken]}), 413, "text_too_long")
    assert "input[1]" in guessed["message"]
    for body, label in (({"input": [bare, broken], "modality": "image"}, "input[1]"),
                        ({"input": [{"type": "image", "image": broken}]}, "input[0]")):
        error = assert_error(client.post("/v1/embeddings", json=body), 400, "invalid_base64")
        assert label in error["message"]
    wrong = assert_error(client.post("/v1/embeddings", json={"input": [{"type": "text", "text": "x"}],
                                                             "modality": "image"}), 422, "invalid_request")
    assert "typed text" in wrong["message"]


def test_dimensions_and_quantized_encodings_over_http(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = data_uri(photo_jpegs[2])
    full = client.post("/v1/embeddings", json={"input": [image, "a cat"], "dimensions": 64})
    assert full.status_code == 200, full.text
    floats = np.array([item["embedding"] for item in full.json()["data"]], dtype=np.float32)
    refused = assert_error(client.post("/v1/embeddings", json={"input": [image], "dimensions": 32}),
                           400, "invalid_request")
    assert "allow_dimension_truncation" in refused["message"]
    int8 = client.post("/v1/embeddings", json={"input": [image, "a cat"], "encoding_format": "int8"}).json()
    for item, want in zip(int8["data"], floats, strict=True):
        q = np.array(item["embedding"], dtype=np.float32)
        assert q.min() >= -127 and q.max() <= 127 and np.abs(q).max() == 127
        np.testing.assert_allclose(q / item["scale"], want, atol=0.5 / item["scale"] + 1e-6)
    ubinary = client.post("/v1/embeddings", json={"input": [image], "embedding_types": ["ubinary"]}).json()
    assert ubinary["data"][0]["embedding"] == np.packbits(floats[0] > 0).tolist()


def test_cohere_v2_embed_answers_the_same_embeddings_by_type(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = data_uri(photo_jpegs[3])
    v1 = client.post("/v1/embeddings", json={"input": [{"type": "text", "text": "a cat"},
                                                       {"type": "image", "image": image}]}).json()
    want = np.array([item["embedding"] for item in v1["data"]], dtype=np.float32)
    answer = client.post("/v2/embed", json={
        "model": "tiny-siglip", "input_type": "search_document", "embedding_types": ["float", "int8", "ubinary"],
        "inputs": [{"content": [{"type": "text", "text": "a cat"}]},
                   {"content": [{"type": "image_url", "image_url": {"url": image}}]}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["response_type"] == "embeddings_by_type" and body["texts"] == ["a cat"]
    assert body["meta"]["billed_units"]["images"] == 1
    np.testing.assert_allclose(np.array(body["embeddings"]["float"], dtype=np.float32), want, atol=1e-6)
    for row, scale, floats in zip(body["embeddings"]["int8"], body["scales"]["int8"], want, strict=True):
        np.testing.assert_allclose(np.array(row) / scale, floats, atol=0.5 / scale + 1e-6)
    assert body["embeddings"]["ubinary"][1] == np.packbits(want[1] > 0).tolist()
    texts = client.post("/v2/embed", json={"texts": ["a cat", "rocket"]}).json()["embeddings"]["float"]
    assert len(texts) == 2 and cosine(np.array(texts[0]), want[0]) > 0.9999
    assert_error(client.post("/v2/embed", json={"texts": ["a"], "images": [image]}), 422, "invalid_request")
    assert_error(client.post("/v2/embed", json={"images": [image], "output_dimension": 16}), 400, "invalid_request")


def test_the_openai_client_works_unchanged(main_app: str, photo_jpegs: list[bytes], text_reference: TextEncoder,
                                           tiny_reference: TinyReference) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{main_app}/v1", api_key=API_KEY, timeout=TIMEOUT)
    # The client asks for base64 unless told (and decodes it); then floats as asked.
    both = client.embeddings.create(model="tiny-siglip", input=["a photo of a cat", data_uri(photo_jpegs[0])])
    floats = client.embeddings.create(model="tiny-siglip", input="rocket", encoding_format="float")
    got = [np.array(item.embedding, dtype=np.float32) for item in (*both.data, *floats.data)]
    assert [len(row) for row in got] == [64, 64, 64]
    assert cosine(got[0], text_reference.encode(["a photo of a cat"])[0]) >= 0.9999
    assert cosine(got[1], tiny_reference.embed(photo_jpegs[0])) >= 0.9999
    assert cosine(got[2], text_reference.encode(["rocket"])[0]) >= 0.9999


def test_models_lists_modalities_and_the_text_tower(client: httpx.Client) -> None:
    (model,) = client.get("/v1/models").json()["data"]
    assert model["modalities"] == ["image", "text"]
    text = model["text"]
    assert text["context_length"] == 16 and text["text_buckets"] == [1, 2, 4, 8, 16, 32]
    assert text["tokenizer"].endswith("tiny-siglip-tokenizer") and text["logit_bias"] == -10.0


def test_classify_scores_are_siglips_sigmoid(client: httpx.Client, photo_jpegs: list[bytes],
                                             tiny_reference: TinyReference, text_reference: TextEncoder) -> None:
    labels = ["cat", "rocket", "coffee", "astronaut"]
    response = client.post("/v1/classify", json={"input": [data_uri(photo_jpegs[0]), data_uri(photo_jpegs[3])],
                                                 "labels": labels, "template": "a photo of {}"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "tiny-siglip" and body["template"] == "a photo of {}"
    assert body["usage"] == {"images": 2, "texts": 4}
    # The server's own image embeddings (its JPEG decode is checked against open_clip in test_http_api).
    served = client.post("/v1/embeddings", json={"input": [data_uri(photo_jpegs[i]) for i in (0, 3)]}).json()
    images = np.array([item["embedding"] for item in served["data"]], dtype=np.float32)
    for row, i in zip(images, (0, 3), strict=True):
        assert cosine(row, tiny_reference.embed(photo_jpegs[i])) >= 0.9999
    info = text_reference.info
    prompts = text_reference.encode([f"a photo of {x}" for x in labels])
    want = zero_shot(images, prompts, info.logit_scale, info.logit_bias)
    for item, row in zip(body["data"], want, strict=True):
        assert item["object"] == "classification"
        scores = [entry["score"] for entry in item["labels"]]
        assert scores == sorted(scores, reverse=True) and sorted(e["label"] for e in item["labels"]) == sorted(labels)
        for entry in item["labels"]:
            assert entry["score"] == pytest.approx(row[labels.index(entry["label"])], rel=1e-4, abs=1e-12)


def test_classify_errors(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = data_uri(photo_jpegs[0])
    assert_error(client.post("/v1/classify", json={"input": image, "labels": []}), 422, "invalid_request")
    assert_error(client.post("/v1/classify", json={"input": image}), 422, "invalid_request")
    slot = assert_error(client.post("/v1/classify", json={"input": image, "labels": ["cat"], "template": "a photo"}),
                        422, "invalid_request")
    assert "'{}'" in slot["message"]
    assert_error(client.post("/v1/classify", json={"input": image, "labels": ["cat", "cat"]}), 422, "invalid_request")
    assert_error(client.post("/v1/classify", json={"input": image, "labels": [str(i) for i in range(65)]}),
                 422, "too_many_texts")
    assert_error(client.post("/v1/classify", json={"input": image, "labels": ["y" * 1001]}), 413, "text_too_long")
    bad = assert_error(client.post("/v1/classify", json={"input": [image, "data:image/jpeg;base64,AAAA"],
                                                         "labels": ["cat"]}), 400, "invalid_image")
    assert "input[1]" in bad["message"]
    assert_error(client.post("/v1/classify", json={"input": image, "labels": ["cat"], "model": "other"}),
                 404, "not_found")
    assert_error(client.post("/v1/classify", files=[("labels", (None, "cat"))]), 400, "empty_body")
    no_auth = httpx.post(f"{client.base_url}/v1/classify", json={"input": image, "labels": ["cat"]}, timeout=TIMEOUT)
    assert_error(no_auth, 401, "unauthorized")


@pytest.fixture(scope="module")
def forced_app(serve_cluster: ServeCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """tiny-siglip-checkpoint built so that "cat" wins for every image, with a tokenizer built here."""
    root: Path = tmp_path_factory.mktemp("forced")
    checkpoint = forced_checkpoint(root / "forced.pt", winner="cat")
    tokenizer = small_tokenizer(root / "tokenizer")
    deploy("forced", "/forced", model=CHECKPOINT_MODEL, checkpoint=str(checkpoint), tokenizer=str(tokenizer),
           replicas=1, encoder_num_cpus=0.5, text_replicas=1, text_num_cpus=0.5, torch_threads=1)
    return f"{serve_cluster.base_url}/forced"


def test_classify_answer_forced_by_construction(forced_app: str, photo_jpegs: list[bytes]) -> None:
    labels = ["dog", "car", "cat", "tree"]
    with httpx.Client(base_url=forced_app, timeout=TIMEOUT) as c:
        as_json = c.post("/v1/classify", json={"input": [base64.b64encode(j).decode() for j in photo_jpegs[:3]],
                                               "labels": labels, "template": "a photo of the {}"})
        files = [("files", ("a.jpg", photo_jpegs[4], "image/jpeg"))] + [("labels", (None, x)) for x in labels]
        as_multipart = c.post("/v1/classify", files=files)
    for response, count in ((as_json, 3), (as_multipart, 1)):
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert len(data) == count
        for item in data:
            ranked = item["labels"]
            assert ranked[0]["label"] == "cat" and ranked[0]["score"] == pytest.approx(0.9933, abs=1e-3)
            assert sorted(e["label"] for e in ranked[1:]) == ["car", "dog", "tree"]
            assert all(e["score"] < 0.01 for e in ranked[1:])


def test_a_siglip2_architecture_serves_images_and_texts(serve_cluster: ServeCluster, photo_jpegs: list[bytes]) -> None:
    """tiny-siglip2 (SigLIP 2's text architecture, a Gemma-layout tokenizer) through the real app: both
    towers equal the in-process ones."""
    import torch

    from siglip_serve.models.loading import load_embedder
    from siglip_serve.models.preprocess import preprocess_image

    deploy("siglip2", "/siglip2", model="tiny-siglip2", text_replicas=1, encoder_num_cpus=0.5, text_num_cpus=0.5,
           torch_threads=1)
    settings = ModelSettings(model="tiny-siglip2", torch_threads=1)
    embedder, info = load_embedder(settings)
    with torch.no_grad():
        image = embedder(torch.from_numpy(preprocess_image(photo_jpegs[0], info.image_size))[None]).numpy()[0]
    text = create_text_encoder(settings).encode(["a photo of a cat"])[0]
    with httpx.Client(base_url=f"{serve_cluster.base_url}/siglip2", timeout=TIMEOUT) as c:
        assert c.get("/v1/models").json()["data"][0]["text"]["tokenizer"].endswith("tiny-siglip2-tokenizer")
        answer = c.post("/v1/embeddings", json={"input": [{"type": "image", "image": data_uri(photo_jpegs[0])},
                                                          {"type": "text", "text": "a photo of a cat"}]})
    assert answer.status_code == 200, answer.text
    rows = [np.array(item["embedding"], dtype=np.float32) for item in answer.json()["data"]]
    assert cosine(rows[0], image) >= 0.9999 and cosine(rows[1], text) >= 0.9999


def test_an_air_gapped_checkpoint_serves_images_and_says_why_text_is_off(
        serve_cluster: ServeCluster, tmp_path: Path, photo_jpegs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Images from a local checkpoint, no tokenizer: DIR and the hub unreachable, text not named: the
    application starts with text off, and says how to turn it on (a Serve deploy's builder runs on the
    Ray head, which does not look for the tokenizer: serve/app.py text_by_shape)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the builder runs here (tests.helpers.deploy)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    checkpoint = forced_checkpoint(tmp_path / "weights.pt", winner="cat")
    deploy("notext", "/notext", model=CHECKPOINT_MODEL, checkpoint=str(checkpoint), text_replicas=None,
           encoder_num_cpus=0.5, torch_threads=1)
    with httpx.Client(base_url=f"{serve_cluster.base_url}/notext", timeout=TIMEOUT) as c:
        model = c.get("/v1/models").json()["data"][0]
        assert model["modalities"] == ["image"] and "set text_replicas: 1" in model["text_off_reason"]
        image = c.post("/v1/embeddings", json={"input": [data_uri(photo_jpegs[0])]})
        assert image.status_code == 200, image.text
        text = assert_error(c.post("/v1/embeddings", json={"input": ["a cat"]}), 404, "not_found")
        assert "set text_replicas: 1" in text["message"]


def test_a_draining_ingress_answers_texts_503_as_it_answers_images(forced_app: str, photo_jpegs: list[bytes]) -> None:
    """What `siglip-serve run` does on SIGTERM (the drain mark), on this module's own app: texts are
    refused like images, not accepted while images get 503. Last of the tests that use forced_app."""
    from siglip_serve.serve.shared import registry

    registry.set_draining("forced")
    try:
        with httpx.Client(base_url=forced_app, timeout=TIMEOUT) as c:
            poll(lambda: c.get("/readyz").status_code, lambda code: code == 503, SETTLE_S, interval_s=0.1)
            for body in ({"input": ["a photo of a cat"]}, {"input": [data_uri(photo_jpegs[0])]}):
                refused = assert_error(c.post("/v1/embeddings", json=body), 503, "not_ready")
                assert "shutting down" in refused["message"]
    finally:
        registry.clear_draining("forced")


def test_locust_text_and_classify_users_run_clean(main_app: str, tmp_path: Path) -> None:
    """Both user classes, briefly, against the live tiny app: every checked answer a success."""
    import csv
    import os
    import subprocess
    import sys

    env = {**os.environ, "SIGLIP_LOADTEST_API_KEY": API_KEY, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(SRC / "loadtest" / "text_locustfile.py"), "--headless",
         "--host", main_app, "-u", "2", "-r", "2", "-t", "6s", "--texts-per-request", "4", "--labels", "3",
         "--only-summary", "--csv", str(tmp_path / "text"), "TextUser", "ClassifyUser"],
        cwd=env["PYTHONPATH"], env=env, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    with open(tmp_path / "text_stats.csv") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    assert int(rows["text x4"]["Request Count"]) > 0 and int(rows["text x4"]["Failure Count"]) == 0
    assert int(rows["classify x3"]["Request Count"]) > 0 and int(rows["classify x3"]["Failure Count"]) == 0
