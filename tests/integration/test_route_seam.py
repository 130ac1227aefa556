"""A route written only in this file, on the one scheduling call (serve/ingress/schedule.py), registered on the real
application (tiny-siglip, the session's local Ray) through `build_app_with_routes(args, routes)`: it gets the API key,
its place among the requests the ingress works on, the request's deadline, the drain and the metrics without
writing any of them, and it scores pairs as /v1/classify does (what /v1/rerank will be)."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import sys
import time

import httpx
import pytest
import ray.cloudpickle
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from siglip_serve.core.poll import poll
from siglip_serve.serve.http.embed_request import Item
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import SCORE, Scheduled, Work
from siglip_serve.serve.shared import registry
from tests.bounds import SETTLE_S, scaled
from tests.helpers import API_KEY, AUTH, ServeCluster, assert_error, deploy

# The route travels to the ingress replica pickled by value: this test module is not importable there.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

APP = "route-seam"
TIMEOUT = 60.0
# The app's one deadline: every answer before the deadline's own check must come within it on a machine the
# rest of the suite loads (a stall there is not this route's fault); that check waits it out once.
DEADLINE_S = 8.0


async def similarity(ingress: Ingress, request: Request, deadline: float) -> Response:
    """{"image": base64, "text": "...", "hold_s": s} -> SigLIP's probability that the text describes the image.
    `hold_s`: seconds of the route's own work before it schedules (a fetch, say)."""
    asked = json.loads(await request.body())
    await asyncio.sleep(float(asked.get("hold_s", 0)))
    items = [Item("image", asked["image"], "image"), Item("text", asked["text"], "text")]

    def render(done: Scheduled) -> Response:
        return JSONResponse({"score": float(done.scores(done.rows[:1], done.rows[1:])[0, 0])})

    return await ingress.serving(None).scheduler.answer(Work("similarity", items, score=True), deadline, render)


SIMILARITY = Route("POST", "/v1/test-similarity", similarity, needs=(SCORE,))


@pytest.fixture(scope="module")
def seam_app(serve_cluster: ServeCluster) -> str:
    """One image and one text replica; the ingress works on one request at a time and one may wait."""
    deploy(APP, f"/{APP}", routes=(SIMILARITY,), api_key=API_KEY, text_replicas=1, encoder_num_cpus=0.5,
           text_num_cpus=0.5, torch_threads=1, ingress_max_ongoing_requests=1, max_queued_requests=1,
           request_timeout_s=DEADLINE_S)
    return f"{serve_cluster.base_url}/{APP}"


def ask(url: str, image: str, text: str = "a photo of a cat", hold_s: float = 0.0,
        headers: dict[str, str] = AUTH) -> httpx.Response:
    body = {"image": image, "text": text, "hold_s": hold_s}
    return httpx.post(f"{url}/v1/test-similarity", json=body, headers=headers, timeout=TIMEOUT)


def series(metrics_port: int) -> dict[str, float]:
    """This app's siglip samples on Ray's Prometheus endpoint, as 'name{label=value,...}' -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name.startswith("ray_siglip_") and labels.get("application") == APP:
                keys = ",".join(f"{k}={labels[k]}" for k in ("endpoint", "status", "reason") if k in labels)
                name = f"{sample.name}{{{keys}}}"
                found[name] = found.get(name, 0.0) + sample.value
    return found


def test_a_route_written_here_gets_the_front_door_and_the_scheduling_call(
        seam_app: str, serve_cluster: ServeCluster, photo_jpegs: list[bytes]) -> None:
    image = base64.b64encode(photo_jpegs[1]).decode()
    answered = ask(seam_app, image)
    assert answered.status_code == 200, answered.text
    # The same pair through /v1/classify: the same call, the same score.
    classified = httpx.post(f"{seam_app}/v1/classify", json={"input": image, "labels": ["a photo of a cat"]},
                            headers=AUTH, timeout=TIMEOUT)
    assert classified.status_code == 200, classified.text
    assert answered.json()["score"] == pytest.approx(classified.json()["data"][0]["labels"][0]["score"], rel=1e-6)

    # The API key.
    assert_error(ask(seam_app, image, headers={}), 401, "unauthorized")
    # Its place: one at work (holding 1.5 s), one waiting, the third refused at once.
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(ask, seam_app, image, hold_s=1.5)
        time.sleep(0.4)
        second = pool.submit(ask, seam_app, image)
        time.sleep(0.4)
        began = time.monotonic()
        third = ask(seam_app, image)
        refused_after = time.monotonic() - began
        assert first.result().status_code == 200 and second.result().status_code == 200, second.result().text
    assert_error(third, 503, "overloaded")
    assert refused_after < scaled(1.0), refused_after
    # Its deadline: the route's own work past it is answered 504 at the deadline.
    began = time.monotonic()
    late = assert_error(ask(seam_app, image, hold_s=DEADLINE_S + 2), 504, "deadline_exceeded")
    assert DEADLINE_S - 0.5 < time.monotonic() - began < DEADLINE_S + scaled(1.5)
    assert f"{DEADLINE_S:g} s" in late["message"]

    # The metrics: its answers and its refusals, under its own endpoint label (Ray pushes every second).
    want = {"ray_siglip_request_seconds_count{endpoint=similarity,status=200}": 3.0,
            "ray_siglip_images_embedded_total{endpoint=similarity}": 3.0,
            "ray_siglip_texts_embedded_total{endpoint=similarity}": 3.0,
            "ray_siglip_requests_rejected_total{reason=unauthorized}": 1.0,
            "ray_siglip_requests_rejected_total{reason=deadline_exceeded}": 1.0}
    got, _, _ = poll(lambda: series(serve_cluster.metrics_port),
                     lambda found: all(found.get(name) == value for name, value in want.items()), SETTLE_S,
                     interval_s=0.5)
    assert {name: got.get(name) for name in want} == want

    # The drain (last: an ingress that saw the mark stays draining): refused like every other route.
    registry.set_draining(APP)
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            poll(lambda: client.get(f"{seam_app}/readyz").status_code, lambda code: code == 503, SETTLE_S,
                 interval_s=0.1)
        refused = assert_error(ask(seam_app, image), 503, "not_ready")
        assert "shutting down" in refused["message"]
    finally:
        registry.clear_draining(APP)
