"""Backpressure, deadlines and readiness on the real application (tiny-siglip, real local Ray)."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from siglip_serve.core.poll import poll
from tests.bounds import START_S
from tests.helpers import ServeCluster, TinyReference, assert_error, cosine, delete_apps, deploy, embeddings_of

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def strict_app(serve_cluster: ServeCluster) -> str:
    """One replica with a one-slot queue, a 1 s batch wait and a 0.3 s deadline."""
    deploy("strict", "/strict", replicas=1, neuron_cores_per_replica=0, encoder_num_cpus=0.5, buckets=[1, 2, 4, 8],
           batch_wait_timeout_s=1.0, request_timeout_s=0.3, max_queued_requests=1, retry_after_s=2, torch_threads=1)
    return serve_cluster.base_url + "/strict"


def post(url: str, data: bytes) -> httpx.Response:
    with httpx.Client(timeout=TIMEOUT) as client:
        return client.post(url + "/v1/embeddings/image", content=data, headers={"Content-Type": "image/jpeg"})


def test_a_lone_request_past_its_deadline_is_504(strict_app: str, photo_jpegs: list[bytes]) -> None:
    # Alone, the request waits the whole 1 s batch window, past its 0.3 s deadline.
    error = assert_error(post(strict_app, photo_jpegs[0]), 504, "deadline_exceeded")
    assert "0.3" in error["message"]


def test_full_queue_is_503_with_retry_after_and_nothing_is_lost(strict_app: str, photo_jpegs: list[bytes],
                                                                tiny_reference: TinyReference) -> None:
    payloads = [photo_jpegs[i % len(photo_jpegs)] for i in range(48)]
    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        responses = list(pool.map(lambda data: post(strict_app, data), payloads))
    statuses = [r.status_code for r in responses]
    # Every request ends with an embedding or a contract error: nothing hangs (pool.map would raise
    # the client's timeout), nothing is dropped.
    assert set(statuses) <= {200, 503, 504}, statuses
    refused = [r for r in responses if r.status_code == 503]
    # Shed on arrival: 503 overloaded with the configured Retry-After. On a busy machine a request admitted
    # to HAProxy's queue may also wait out its 0.3 s deadline there: 503 overloaded too (docs/http-api.md,
    # Deadline: HAProxy's `timeout queue`); before, 503 not_ready while the service was ready.
    kinds = [r.json()["error"]["type"] for r in refused]
    assert "overloaded" in kinds, statuses
    for response, kind in zip(refused, kinds, strict=True):
        assert_error(response, 503, kind)
        assert kind == "overloaded", kind
        assert response.headers["retry-after"] == "2"
    # Shed on arrival, not after a wait in the queue (whose message names the deadline).
    overloaded = [r for r in refused if "deadline" not in r.json()["error"]["message"]]
    # The queue sheds only when full: the ingress works on 2 x max_batch_size (8) + 4 decode threads
    # requests at once and one more may wait, so at least 17 requests were admitted before the first 503.
    admitted = len(payloads) - len(overloaded)
    assert admitted >= 2 * 8 + 1, statuses
    expected = [tiny_reference.embed(data) for data in photo_jpegs]
    for i, response in enumerate(responses):
        if response.status_code == 200:
            # Under overload each answer is still its own image's embedding, not a neighbour's.
            assert cosine(embeddings_of(response)[0], expected[i % len(photo_jpegs)]) >= 0.9999
        elif response.status_code == 504:
            assert_error(response, 504, "deadline_exceeded")
    # Shed and timed-out requests gave their queue places back: a request after the burst is admitted
    # again instead of 503 (alone it usually waits out its deadline, as in the test above).
    after = post(strict_app, photo_jpegs[0])
    assert after.status_code in (200, 504), after.text


def test_not_ready_until_every_replica_has_warmed_up(serve_cluster: ServeCluster, main_app: str,
                                                     photo_jpegs: list[bytes]) -> None:
    # main_app holds every declared neuron_core, so this app's encoder replica cannot be placed:
    # its ingress is up but no encoder has loaded its model.
    # A short request timeout: Serve gives the never-placed replica that long (graceful_shutdown_timeout_s,
    # serve/towers/tower_replica.py) when the module deletes the app; the default 30 s is only waiting.
    deploy("unready", "/unready", wait=False, replicas=1, neuron_cores_per_replica=1, request_timeout_s=2)
    url = serve_cluster.base_url + "/unready"
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            health = _wait_for_ingress(client, url)
            assert health.status_code == 200
            ready = client.get(url + "/readyz")
            error = assert_error(ready, 503, "not_ready")
            assert "0 of 1" in error["message"] and ready.headers["retry-after"]
            response = client.post(url + "/v1/embeddings/image", content=photo_jpegs[0],
                                   headers={"Content-Type": "image/jpeg"})
            assert_error(response, 503, "not_ready")
            assert response.headers["retry-after"]
    finally:
        delete_apps(["unready"])


def _wait_for_ingress(client: httpx.Client, url: str) -> httpx.Response:
    def health() -> httpx.Response | None:
        try:
            return client.get(url + "/healthz")
        except httpx.TransportError:
            return None

    response, up, _ = poll(health, lambda got: got is not None and got.status_code == 200, START_S, interval_s=0.5)
    assert up and response is not None, "the unready app's ingress never came up"
    return response
