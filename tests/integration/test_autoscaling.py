"""Load raises the cpu encoder replica count, its end lowers it again, and every request gets its 200."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import ray
from ray import serve

from tests.helpers import deploy

# Small delays and a 0.5 s look-back so the test sees both moves within seconds.
SCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0.5,
           "downscale_delay_s": 2, "look_back_period_s": 1, "metrics_interval_s": 0.25}


def encoder_replicas(app: str) -> int:
    """Replicas Serve keeps (running or starting: on a busy 2-core runner a start alone takes seconds)."""
    states = serve.status().applications[app].deployments["Encoder"].replica_states
    return sum(count for state, count in states.items() if state in ("RUNNING", "STARTING"))


async def load(url: str, body: bytes, until: float) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        async def one_client() -> list[int]:
            codes = []
            while time.monotonic() < until:
                response = await client.post(url, content=body, headers={"Content-Type": "image/jpeg"})
                codes.append(response.status_code)
            return codes
        results = await asyncio.gather(*(one_client() for _ in range(8)))
    return [code for codes in results for code in codes]


def wait_for(app: str, count: int, timeout_s: float) -> float:
    began = time.monotonic()
    while encoder_replicas(app) != count:
        assert time.monotonic() - began < timeout_s, f"{encoder_replicas(app)} encoder replicas, not {count}"
        time.sleep(0.2)
    return time.monotonic() - began


def test_load_scales_the_encoder_up_and_its_end_down(serve_cluster: Any, photo_jpegs: list[bytes]) -> None:
    assert ray.is_initialized()
    deploy("scaling", "/scaling", replicas=None, autoscaling=SCALING, encoder_num_cpus=0.5, ingress_replicas=1,
           batch_wait_timeout_s=0.01, torch_threads=1)
    assert encoder_replicas("scaling") == 1
    url = f"{serve_cluster.base_url}/scaling/v1/embeddings/image"
    codes: list[int] = []
    began = time.monotonic()
    while encoder_replicas("scaling") < 2:
        assert time.monotonic() - began < 30, "load did not add a replica"
        codes += asyncio.run(load(url, photo_jpegs[0], time.monotonic() + 1.0))
    assert codes and set(codes) == {200}
    wait_for("scaling", 1, timeout_s=15)
