"""The HTTP contract, end to end, against the real application on tiny-siglip under a real Ray."""

from __future__ import annotations

import base64
import concurrent.futures
import shutil
import subprocess
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import (
    API_KEY,
    AUTH,
    TEST_NEURON_CORES,
    TinyReference,
    assert_error,
    cosine,
    embeddings_of,
    jpeg_bytes,
    png_file,
)

TIMEOUT = 60.0


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height but that holds almost no data (a bomb's shape)."""
    return png_file(width, height, 8, 2, zlib.compress(b"\x00" * 16))


@pytest.fixture(scope="module")
def client(main_app: str) -> httpx.Client:
    with httpx.Client(base_url=main_app, headers=AUTH, timeout=TIMEOUT) as c:
        yield c


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["replicas"] == TEST_NEURON_CORES


def test_raw_image_matches_in_process_model(client: httpx.Client, photo_jpegs: list[bytes],
                                            tiny_reference: TinyReference) -> None:
    response = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
    got = embeddings_of(response)
    assert got.shape == (1, 64)
    assert abs(np.linalg.norm(got[0]) - 1.0) < 1e-5
    assert cosine(got[0], tiny_reference.embed(photo_jpegs[0])) >= 0.9999
    assert response.headers["x-request-id"]
    tagged = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"X-Request-ID": "client-id-42"})
    assert tagged.headers["x-request-id"] == "client-id-42"


def test_the_ingress_calls_its_encoders_over_grpc(client: httpx.Client) -> None:
    # The tests' app is built in a process without Serve's throughput mode in its environment, so its
    # handles would call by reference (Ray tasks) had the ingress not chosen gRPC itself. Only this app's
    # ingress logs count: other modules' apps may turn the mode off (`throughput_optimized: false`).
    import ray

    assert client.get("/readyz").status_code == 200
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    texts = (path.read_text(errors="replace") for path in logs.glob("worker-*.err"))
    said = "".join(text for text in texts if ":actor_name:ServeReplica:main:Ingress" in text)
    assert "encoder calls (gRPC)" in said
    assert "encoder calls (Ray actor tasks)" not in said


def test_curl_command_from_the_contract_works(main_app: str, photo_jpegs: list[bytes], tmp_path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is needed for this test (apt-get install curl)")
    path = tmp_path / "cat.jpg"
    path.write_bytes(photo_jpegs[1])
    out = subprocess.run(
        ["curl", "-sS", "-X", "POST", "--data-binary", f"@{path}", "-H", "Content-Type: image/jpeg",
         "-H", f"Authorization: Bearer {API_KEY}", f"{main_app}/v1/embeddings/image"],
        capture_output=True, check=True, timeout=TIMEOUT,
    )
    import json

    body = json.loads(out.stdout)
    assert len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 64


def test_json_inputs_data_uri_bare_base64_and_list_order(client: httpx.Client, photo_jpegs: list[bytes],
                                                        tiny_reference: TinyReference) -> None:
    items = [
        "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[0]).decode(),
        base64.b64encode(photo_jpegs[1]).decode(),
        base64.b64encode(photo_jpegs[2]).decode(),
    ]
    got = embeddings_of(client.post("/v1/embeddings", json={"input": items, "model": "tiny-siglip"}))
    assert got.shape == (3, 64)
    for row, jpeg in zip(got, photo_jpegs[:3], strict=True):
        assert cosine(row, tiny_reference.embed(jpeg)) >= 0.9999
    single = embeddings_of(client.post("/v1/embeddings", json={"input": items[0]}))
    assert single.shape == (1, 64) and cosine(single[0], got[0]) >= 0.99999


def test_base64_encoding_format_is_little_endian_float32(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    item = base64.b64encode(photo_jpegs[3]).decode()
    as_float = embeddings_of(client.post("/v1/embeddings", json={"input": [item]}))
    response = client.post("/v1/embeddings", json={"input": [item], "encoding_format": "base64"})
    assert response.status_code == 200
    encoded = response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    np.testing.assert_allclose(decoded, as_float[0], rtol=0, atol=1e-7)


def test_multipart_files_in_order(client: httpx.Client, photo_jpegs: list[bytes],
                                  tiny_reference: TinyReference) -> None:
    files = [("files", (f"p{i}.jpg", photo_jpegs[i], "image/jpeg")) for i in (2, 0, 1)]
    got = embeddings_of(client.post("/v1/embeddings/image", files=files))
    assert got.shape == (3, 64)
    for row, i in zip(got, (2, 0, 1), strict=True):
        assert cosine(row, tiny_reference.embed(photo_jpegs[i])) >= 0.9999


def test_models_lists_every_replica_on_its_own_core(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    (model,) = body["data"]
    assert model["id"] == "tiny-siglip" and model["embedding_dim"] == 64 and model["image_size"] == [64, 64]
    assert model["backend"] == "cpu" and model["buckets"] == [1, 2, 4, 8]
    cores = [r["neuron_rt_visible_cores"] for r in model["replicas"]]
    assert len(cores) == TEST_NEURON_CORES
    assert sorted(cores) == sorted({str(i) for i in range(TEST_NEURON_CORES)})


@pytest.mark.parametrize(
    "kwargs, status, error_type",
    [
        ({"content": b"", "headers": {"Content-Type": "image/jpeg"}}, 400, "empty_body"),
        ({"content": b"\x00\x01garbage" * 50, "headers": {"Content-Type": "image/jpeg"}}, 400, "invalid_image"),
        ({"content": b"hello", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type"),
        ({"content": b"<svg xmlns='http://www.w3.org/2000/svg'/>", "headers": {"Content-Type": "image/svg+xml"}},
         415, "unsupported_media_type"),
        ({"content": png_header_only(10000, 10000), "headers": {"Content-Type": "image/png"}}, 413, "image_too_large"),
    ],
    ids=["empty", "corrupt", "text", "svg", "pixel-bomb"],
)
def test_raw_endpoint_errors(client: httpx.Client, kwargs: dict, status: int, error_type: str) -> None:
    assert_error(client.post("/v1/embeddings/image", **kwargs), status, error_type)


def test_truncated_jpeg_is_400(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    half = photo_jpegs[0][: len(photo_jpegs[0]) // 2]
    assert_error(client.post("/v1/embeddings/image", content=half, headers={"Content-Type": "image/jpeg"}),
                 400, "invalid_image")


def test_body_over_byte_limit_is_413(client: httpx.Client) -> None:
    big = b"\xff" * (20 * 1024 * 1024 + 1)
    assert_error(client.post("/v1/embeddings/image", content=big, headers={"Content-Type": "image/jpeg"}),
                 413, "payload_too_large")


def test_json_errors_name_the_item(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    good = base64.b64encode(photo_jpegs[0]).decode()
    error = assert_error(client.post("/v1/embeddings", json={"input": [good, "data:image/jpeg;base64,not base64!!"]}),
                         400, "invalid_base64")
    assert "input[1]" in error["message"]
    bad_image = base64.b64encode(b"\x00" * 100).decode()  # valid base64 of no image format
    error = assert_error(client.post("/v1/embeddings", json={"input": [good, good, bad_image], "modality": "image"}),
                         400, "invalid_image")
    assert "input[2]" in error["message"]
    assert_error(client.post("/v1/embeddings", json={"input": 5}), 422, "invalid_request")
    int4 = client.post("/v1/embeddings", json={"input": [good], "encoding_format": "int4"})
    assert_error(int4, 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": []}), 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", content=b"{not json", headers={"Content-Type": "application/json"}),
                 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": [good], "model": "other"}), 404, "not_found")
    assert_error(client.post("/v1/embeddings", content=b""), 400, "empty_body")


def test_too_many_images_is_422(client: httpx.Client, photos: list[np.ndarray]) -> None:
    small = base64.b64encode(jpeg_bytes(photos[0][:32, :32])).decode()
    error = assert_error(client.post("/v1/embeddings", json={"input": [small] * 65}), 422, "too_many_images")
    assert "64" in error["message"]
    assert embeddings_of(client.post("/v1/embeddings", json={"input": [small] * 64})).shape == (64, 64)


def test_api_key_is_required(main_app: str, photo_jpegs: list[bytes]) -> None:
    with httpx.Client(base_url=main_app, timeout=TIMEOUT) as anonymous:
        assert_error(anonymous.post("/v1/embeddings/image", content=photo_jpegs[0]), 401, "unauthorized")
        assert_error(anonymous.post("/v1/embeddings/image", content=photo_jpegs[0],
                                    headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
        assert_error(anonymous.get("/v1/models"), 401, "unauthorized")
        assert anonymous.get("/healthz").status_code == 200


def test_unknown_path_is_contract_json(client: httpx.Client) -> None:
    assert_error(client.get("/v2/nothing"), 404, "not_found")
    assert_error(client.get("/v1/embeddings"), 405, "method_not_allowed")


def test_bad_image_in_a_batch_fails_alone(main_app: str, photo_jpegs: list[bytes],
                                          tiny_reference: TinyReference) -> None:
    corrupt = photo_jpegs[0][:200]

    def post(data: bytes) -> httpx.Response:
        with httpx.Client(base_url=main_app, headers=AUTH, timeout=TIMEOUT) as c:
            return c.post("/v1/embeddings/image", content=data, headers={"Content-Type": "image/jpeg"})

    payloads = [photo_jpegs[i % 5] for i in range(12)]
    payloads.insert(5, corrupt)
    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        responses = list(pool.map(post, payloads))
    for data, response in zip(payloads, responses, strict=True):
        if data is corrupt:
            assert_error(response, 400, "invalid_image")
        else:
            assert cosine(embeddings_of(response)[0], tiny_reference.embed(data)) >= 0.9999


def test_encoder_answers_a_malformed_chunk_alone(main_app: str) -> None:
    """Past the ingress: a chunk of the wrong shape batched with good ones fails only itself."""
    import time

    from ray import serve

    from siglip_serve.models.encoder import EncoderInputError

    handle = serve.get_deployment_handle("Encoder", app_name="main")
    deadline = time.time() + 60
    # Separate calls, as from separate ingress requests: the replica's batcher joins them.
    good = [handle.embed_chunks.remote([np.full((2, 3, 64, 64), i, dtype=np.uint8)], [deadline]) for i in range(6)]
    bad = handle.embed_chunks.remote([np.zeros((1, 3, 32, 32), dtype=np.uint8)], [deadline])
    for response in good:
        assert response.result(timeout_s=TIMEOUT)[0].shape == (2, 64)
    assert isinstance(bad.result(timeout_s=TIMEOUT)[0], EncoderInputError)


def test_sixteen_concurrent_clients_lose_and_mix_nothing(main_app: str, photos: list[np.ndarray],
                                                         tiny_reference: TinyReference) -> None:
    rng = np.random.default_rng(0)

    def client_run(index: int) -> list[float]:
        # Each client sends its own distinct images and checks it gets its own embeddings back.
        photo = photos[index % len(photos)]
        scores = []
        with httpx.Client(base_url=main_app, headers=AUTH, timeout=TIMEOUT) as c:
            for round_ in range(4):
                y, x = rng.integers(0, 100, size=2)
                data = jpeg_bytes(np.ascontiguousarray(photo[y: y + 300, x: x + 300]))
                count = 1 + (index + round_) % 3
                items = [base64.b64encode(data).decode()] * count
                got = embeddings_of(c.post("/v1/embeddings", json={"input": items}))
                assert got.shape == (count, 64)
                scores.extend(cosine(row, tiny_reference.embed(data)) for row in got)
        return scores

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(client_run, range(16)))
    flat = [s for scores in results for s in scores]
    assert len(flat) == sum(sum(1 + (i + r) % 3 for r in range(4)) for i in range(16))
    assert min(flat) >= 0.9999
