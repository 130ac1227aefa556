"""Tracing against the real app (tiny-siglip under the test Ray): every stage's span, one trace from the
ingress process to the encoder replica's, the batch linked to each request in it (serve/shared/tracing.py). The
app's processes write their spans as JSON lines (SIGLIP_TRACES_FILE, handed to them by the builder)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import httpx

from siglip_serve.core.constants import TRACES_FILE_ENV
from siglip_serve.core.poll import poll
from tests.bounds import SETTLE_S
from tests.helpers import ServeCluster, deploy

STAGES = {"http.request", "decode", "encode", "render", "queue", "batch", "forward"}


def read_spans(path: Path, want: int) -> list[dict[str, Any]]:
    spans, _, _ = poll(lambda: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else [],
                       lambda spans: len(spans) >= want, SETTLE_S, interval_s=0.2)
    return spans


def test_a_request_is_one_trace_from_the_ingress_to_its_batch(serve_cluster: ServeCluster, tmp_path: Path,
                                                              photo_jpegs: list[bytes]) -> None:
    path = tmp_path / "spans.jsonl"
    os.environ[TRACES_FILE_ENV] = str(path)
    try:
        deploy("traced", "/traced", tracing=True, neuron_cores_per_replica=0, encoder_num_cpus=0.5, torch_threads=1)
    finally:
        del os.environ[TRACES_FILE_ENV]  # the app's processes got it from the builder; nobody else should
    client_trace = "ab" * 16
    with httpx.Client(base_url=serve_cluster.base_url + "/traced", timeout=60) as client:
        answer = client.post("/v1/embeddings", headers={"traceparent": f"00-{client_trace}-{'cd' * 8}-01",
                                                        "x-request-id": "req-42"},
                             json={"input": [base64.b64encode(j).decode() for j in photo_jpegs[:2]],
                                   "modality": "image"})
        assert answer.status_code == 200, answer.text
        assert client.post("/v1/embeddings/image", content=photo_jpegs[0],
                           headers={"Content-Type": "image/jpeg"}).status_code == 200
    spans = read_spans(path, want=2 * len(STAGES))
    mine = [s for s in spans if s["trace_id"] == client_trace]
    assert {s["name"] for s in mine} == STAGES - {"batch", "forward"}, sorted(s["name"] for s in spans)
    by_name = {s["name"]: s for s in mine}
    request = by_name["http.request"]
    assert request["parent_id"] == "cd" * 8 and request["process"] == "ingress"
    assert request["attributes"]["siglip.request_id"] == "req-42"
    assert request["attributes"]["http.response.status_code"] == 200
    for stage in ("decode", "encode", "render"):
        assert by_name[stage]["parent_id"] == request["span_id"] and by_name[stage]["process"] == "ingress"
    queue = by_name["queue"]  # written by the replica, in the request's trace
    assert queue["process"] == "image-encoder" and queue["parent_id"] == by_name["encode"]["span_id"]
    # The batch that served it, in the replica, linked back to the request (a batch serves many traces).
    (batch,) = [s for s in spans if s["name"] == "batch"
                and {"trace_id": client_trace, "span_id": by_name["encode"]["span_id"]} in s["links"]]
    assert batch["process"] == "image-encoder" and batch["attributes"]["size"] >= 2
    assert batch["attributes"]["bucket"] >= batch["attributes"]["size"] and batch["attributes"]["tower"] == "image"
    assert batch["start_ns"] >= queue["end_ns"] - 1_000_000
    forward = [s for s in spans if s["name"] == "forward" and s["parent_id"] == batch["span_id"]]
    assert len(forward) == 1
    # The raw request without a traceparent starts a trace of its own, with every stage.
    others = {s["trace_id"] for s in spans if s["name"] == "http.request"} - {client_trace}
    assert len(others) == 1
