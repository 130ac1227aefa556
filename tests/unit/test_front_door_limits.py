"""The front door's parts on their own: the limits HAProxy and the ingress share (core/front_door.py), the
ingress's places and deadline (serve/ingress/front_door.py), and the body that stops arriving. The running
front end (HAProxy's queue, its 503s, the stamp) is tested on the real service in
tests/integration/test_front_door.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from siglip_serve.core.front_door import (
    CLOCK_SKEW_LIMIT_S,
    FrontDoorLimits,
    haproxy_backend_name,
    read_limits,
    waited_seconds,
    write_limits,
)
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.http.http_body import read_body
from siglip_serve.serve.ingress.front_door import Deadline, RequestSlots
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.planner import front_door_limits, ingress_max_ongoing, plan_service


@pytest.mark.parametrize("app", ["siglip", "main", "My App#2/x", "front"])
def test_the_backend_name_is_the_one_ray_gives_the_app(app: str) -> None:
    from ray.serve._private.haproxy import HAProxyManager

    assert haproxy_backend_name(app) == HAProxyManager.get_safe_name(f"http-{app}")


def test_limits_are_written_per_backend_and_read_back(tmp_path: Path) -> None:
    limits = FrontDoorLimits(max_ongoing_requests=36, max_queued_requests=256, request_timeout_s=0.5, retry_after_s=2)
    path = write_limits(limits, "siglip", str(tmp_path))
    assert path == tmp_path / "http-siglip.json"
    assert read_limits(tmp_path, "http-siglip") == limits
    assert read_limits(tmp_path, "http-other") is None  # not written: Ray's settings stay
    (tmp_path / "http-bad.json").write_text("{not json")
    assert read_limits(tmp_path, "http-bad") is None
    assert write_limits(limits, "siglip", "") is None  # no directory named: nothing written


def test_the_wait_is_counted_from_the_stamp_and_a_client_can_only_shorten_it() -> None:
    now = 1_800_000_000.0
    assert waited_seconds(f"t={int((now - 2.5) * 1000)}", now, 30.0) == pytest.approx(2.5)
    assert waited_seconds(str(int((now - 1) * 1000)), now, 30.0) == pytest.approx(1.0)  # without "t="
    assert waited_seconds(f"t={int((now + 60) * 1000)}", now, 30.0) == 0.0  # the future counts as now
    assert waited_seconds(None, now, 30.0) == 0.0
    assert waited_seconds("t=soon", now, 30.0) == 0.0
    # Older than the deadline plus the skew limit: a clock that disagrees, not a wait.
    assert waited_seconds(f"t={int((now - 30 - CLOCK_SKEW_LIMIT_S - 1) * 1000)}", now, 30.0) is None


def test_a_deadline_begins_at_the_stamp() -> None:
    stamp = f"t={int((time.time() - 2.0) * 1000)}"
    deadline = Deadline(stamp, 30.0)
    assert deadline.waited_s == pytest.approx(2.0, abs=0.2)
    assert deadline.remaining() == pytest.approx(28.0, abs=0.2)
    assert Deadline(None, 30.0).remaining() == pytest.approx(30.0, abs=0.2)
    skewed = Deadline(f"t={int((time.time() - 3600) * 1000)}", 30.0)
    assert skewed.waited_s == 0.0 and skewed.remaining() == pytest.approx(30.0, abs=0.2)


def config(**args: object) -> ServiceConfig:
    return ServiceConfig.from_args({"model": "tiny-siglip", "ingress_replicas": 1, **args})


def test_an_ingress_works_on_twice_what_its_encoder_calls_carry_plus_its_decode_threads() -> None:
    # cpu: one call per encoder replica; 2 replicas x 8 images, twice, + 4 decode threads.
    assert ingress_max_ongoing(config(), 2, 1) == 2 * 2 * 8 + 4
    # An accelerator: two calls per replica, shared by 3 ingress replicas (trn2.3xlarge, LNC=2).
    assert ingress_max_ongoing(config(backend="neuron", ingress_replicas=3, replicas=4), 4, 3) == 2 * 3 * 8 + 4
    assert ingress_max_ongoing(config(ingress_max_ongoing_requests=5), 2, 1) == 5
    limits = front_door_limits(config(max_queued_requests=7, request_timeout_s=2.5, retry_after_s=3), 1, 1)
    # The plan carries the same limits to the ingress and HAProxy.
    assert plan_service(config(replicas=2)).ingress.limits.max_ongoing_requests == ingress_max_ongoing(config(), 2, 1)
    # No cap by default (1); with a share, one tenant's lane holds that share of the requests at work beside others.
    assert limits == FrontDoorLimits(max_ongoing_requests=2 * 1 * 8 + 4, max_queued_requests=7,
                                     request_timeout_s=2.5, retry_after_s=3, ongoing_beside_others=None)
    assert front_door_limits(config(share_beside_others=1 / 3), 1, 1).ongoing_beside_others == 7
    assert front_door_limits(config(share_beside_others=0.5), 1, 1).ongoing_beside_others == 10
    assert front_door_limits(config(share_beside_others=0.01), 1, 1).ongoing_beside_others == 1


def test_interactive_ingress_adds_a_replica_the_limits_do_not_count_and_marks_it_for_haproxy() -> None:
    kept = plan_service(config(replicas=2, interactive_ingress=True, api_keys_file="keys.toml")).ingress
    plain = plan_service(config(replicas=2)).ingress
    assert (kept.replicas, kept.deployment.num_replicas, plain.replicas) == (2, 2, 1)
    assert (kept.sharing_replicas, plain.sharing_replicas) == (1, 1)  # what each sizes its share of calls and rates by
    # The replicas that share the traffic work on what one would without it; HAProxy learns to keep one apart.
    assert kept.limits == FrontDoorLimits(**{**vars(plain.limits), "interactive_server": True})


def test_places_admit_ongoing_then_queue_then_refuse_at_once() -> None:
    async def scenario() -> tuple[list[str], float]:
        slots = RequestSlots(ongoing=2, queued=1, retry_after_s=4)
        release = asyncio.Event()
        order: list[str] = []

        async def request(name: str) -> None:
            async with slots.place():
                order.append(name)
                await release.wait()

        working = [asyncio.ensure_future(request(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0.01)
        assert (slots.working, slots.waiting) == (2, 1) and order == ["a", "b"]
        began = time.monotonic()
        with pytest.raises(ApiError) as refused:
            async with slots.place():
                pass
        seconds = time.monotonic() - began
        assert (refused.value.status, refused.value.error_type.value) == (503, "overloaded")
        assert refused.value.headers == {"Retry-After": "4"}
        release.set()
        await asyncio.gather(*working)
        assert (slots.working, slots.waiting) == (0, 0)
        return order, seconds

    order, seconds = asyncio.run(scenario())
    assert order == ["a", "b", "c"] and seconds < 0.05


def test_a_waiter_leaves_at_its_deadline_and_gives_its_place_in_line_back() -> None:
    async def scenario() -> None:
        slots = RequestSlots(ongoing=1, queued=1, retry_after_s=1)
        hold = asyncio.Event()

        async def holder() -> None:
            async with slots.place():
                await hold.wait()

        first = asyncio.ensure_future(holder())
        await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05), slots.place():
                pass
        assert slots.waiting == 0
        hold.set()
        await first
        async with slots.place():  # the place is free again
            assert slots.working == 1

    asyncio.run(scenario())


class StalledRequest:
    """What read_body reads of a Starlette request: a Content-Length header and a stream of chunks that
    stops after `chunks` (a client whose body is shorter than it said). Not a real connection."""

    def __init__(self, chunks: list[bytes], declared: int) -> None:
        self.headers = {"content-length": str(declared)}
        self._chunks = chunks

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        await asyncio.Event().wait()  # never ends


def test_a_body_that_stops_arriving_is_408_after_the_idle_timeout() -> None:
    request = StalledRequest([b"x" * 1000, b"y" * 500], declared=100_000)
    began = time.monotonic()
    with pytest.raises(ApiError) as error:
        asyncio.run(read_body(request, 1 << 20, idle_timeout_s=0.2))  # type: ignore[arg-type]
    assert 0.2 <= time.monotonic() - began < 1.0
    assert (error.value.status, error.value.error_type.value) == (408, "request_timeout")
    assert "1500 bytes of 100000" in error.value.message and error.value.headers == {"Connection": "close"}


def test_a_body_that_arrives_is_read_whole() -> None:
    class Whole(StalledRequest):
        async def stream(self) -> AsyncIterator[bytes]:
            for chunk in self._chunks:
                yield chunk

    assert asyncio.run(read_body(Whole([b"ab", b"cd"], 4), 10, idle_timeout_s=0.2)) == b"abcd"  # type: ignore[arg-type]
