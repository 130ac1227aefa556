"""Load raises the cpu encoder and the ingress replica counts, its end lowers them again, and every request
gets its 200."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import ray
from ray import serve

from siglip_serve.core.poll import poll
from siglip_serve.serve.shared import registry
from tests.bounds import SETTLE_S
from tests.helpers import deploy

log = logging.getLogger(__name__)

# Small delays and a 0.5 s look-back so the test sees both moves within seconds.
SCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0.5,
           "downscale_delay_s": 2, "look_back_period_s": 1, "metrics_interval_s": 0.25}
# The ingress scales on the cores it keeps busy: idle it uses ~0.02 of a core here, under the test's
# load several tenths, so 0.1 a replica asks for the most under load and the least idle.
INGRESS_SCALING = {**{k: v for k, v in SCALING.items() if k != "target_ongoing_requests"}, "target_busy_cores": 0.1}


def replicas(app: str, deployment: str = "Encoder") -> int:
    """Replicas Serve keeps (running or starting: on a busy 2-core runner a start alone takes seconds)."""
    states = serve.status().applications[app].deployments[deployment].replica_states
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


def answering(app: str) -> list[dict[str, Any]]:
    """The registry records of the image replicas that have answered a batch."""
    return [record for record in registry.live_replicas(app, "image") if "first_answer_at" in record["start"]]


def wait_for(app: str, deployment: str, count: int, timeout_s: float = SETTLE_S) -> float:
    got, done, waited = poll(lambda: replicas(app, deployment), lambda got: got == count, timeout_s, interval_s=0.2)
    assert done, f"{got} {deployment} replicas, not {count}, after {waited:.0f} s"
    return waited


def test_load_scales_the_encoder_and_ingress_up_and_its_end_down(serve_cluster: Any,
                                                                 photo_jpegs: list[bytes]) -> None:
    assert ray.is_initialized()
    deploy("scaling", "/scaling", replicas=None, autoscaling=SCALING, ingress_autoscaling=INGRESS_SCALING,
           encoder_num_cpus=0.5, batch_wait_timeout_s=0.01, torch_threads=1)
    time.sleep(2.0)  # idle for twice the look-back: nothing scales out without load
    assert replicas("scaling") == 1 and replicas("scaling", "Ingress") == 1
    model = httpx.get(f"{serve_cluster.base_url}/scaling/v1/models", timeout=30).json()["data"][0]
    assert model["ingress_autoscaling"] == {"min_replicas": 1, "max_replicas": 2} and model["ingress_replicas"] == 1
    url = f"{serve_cluster.base_url}/scaling/v1/embeddings/image"
    codes: list[int] = []

    def a_second_of_load() -> tuple[int, int, int]:
        """One second of load, then (encoder replicas, ingress replicas, encoders that have answered)."""
        codes.extend(asyncio.run(load(url, photo_jpegs[0], time.monotonic() + 1.0)))
        return replicas("scaling"), replicas("scaling", "Ingress"), len(answering("scaling"))

    counts, scaled_up, _ = poll(a_second_of_load, lambda counts: min(counts) >= 2, SETTLE_S, interval_s=0)
    assert scaled_up, f"load left {counts[0]} encoder and {counts[1]} ingress replica(s), {counts[2]} answering"
    assert codes and set(codes) == {200}
    # The replica autoscaling added answers load once warm: its start, from its process's creation (Ray
    # placed it) to its first answer, is what a burst waits for (docs/dev/benchmark-log.md).
    added = max(answering("scaling"), key=lambda record: record["start"]["process_started"])["start"]
    assert added["process_started"] <= added["ready_at"] <= added["first_answer_at"]
    log.info("the added encoder replica: warm %.1f s and first answer %.1f s after its process started (%s)",
             added["ready_at"] - added["process_started"], added["first_answer_at"] - added["process_started"],
             ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in added["phases"]))
    wait_for("scaling", "Encoder", 1)
    wait_for("scaling", "Ingress", 1)
