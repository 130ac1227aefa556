"""The ingress's encoder calls (serve/ingress/tower_client.py): coalesced past the in-flight window, an interactive
chunk in a call of its own at once, each chunk answered on its own, a dead replica retried once."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from ray.exceptions import RayActorError
from ray.serve._private.handle_options import DynamicHandleOptions

from siglip_serve.core import lanes
from siglip_serve.core.errors import DeadlineExceeded
from siglip_serve.core.lanes import Lane, Ticket
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.tower_client import TowerClient, worth_coalescing
from siglip_serve.serve.plan.planner import calls_in_flight
from tests.helpers import ServeResponse as Response


class Replica:
    """The encoder deployment's handle: `embed_chunks(chunks, deadlines)`, each image embedding to [its first
    pixel], and Serve's own options (a handle built without Serve's throughput mode calls by reference)."""

    handle_options = DynamicHandleOptions(_by_reference=True)

    def __init__(self, seconds: float = 0.05, deaths: int = 0) -> None:
        self.seconds = seconds
        self.deaths = deaths
        self.calls: list[list[int]] = []  # images per chunk of each call
        self.firsts: list[list[int]] = []  # each call's chunks' first pixels, in the order the calls came
        self.lanes: list[list[int] | None] = []  # each call's chunks' lanes, where the ingress sent any

    async def run(self, chunks: list[np.ndarray], deadlines: list[float],
                  tickets: list[tuple[int, str, float]] | None = None) -> list[Any]:
        self.calls.append([len(chunk) for chunk in chunks])
        self.firsts.append([int(chunk[0, 0, 0, 0]) for chunk in chunks])
        self.lanes.append(None if tickets is None else [lane for lane, _, _ in tickets])
        await asyncio.sleep(self.seconds)
        if self.deaths:
            self.deaths -= 1
            raise RayActorError()
        return [DeadlineExceeded("late") if deadline < 0 else chunk[:, 0, 0, :1].astype(np.float32)
                for chunk, deadline in zip(chunks, deadlines, strict=True)]

    @property
    def embed_chunks(self) -> Any:
        replica = self

        class Method:
            @staticmethod
            def remote(chunks: list[np.ndarray], deadlines: list[float],
                       tickets: list[tuple[int, str, float]] | None = None) -> Response:
                return Response(replica.run(chunks, deadlines, tickets))

        return Method


def images(*values: int) -> np.ndarray:
    return np.array([np.full((3, 2, 2), v, dtype=np.uint8) for v in values])


def client(replica: Replica, max_images: int = 8, full_batch_seconds: float = 0.003) -> TowerClient:
    """One replica; the model as fast as tiny-siglip (a full batch in 3 ms): coalescing, two calls in flight."""
    encoder = TowerClient(replica, replicas=1, ingress_replicas=1, max_images=max_images,  # type: ignore[arg-type]
                            retry_after_s=1, max_in_flight=16)
    encoder.tune(full_batch_seconds)
    return encoder


def test_past_the_window_requests_coalesce_into_one_call_and_each_gets_its_own_rows() -> None:
    replica = Replica(seconds=0.3)

    async def main() -> list[np.ndarray]:
        encoder = client(replica)  # one replica: two calls in flight
        first = []
        for value in (1, 2):
            first.append(asyncio.ensure_future(encoder.embed(images(value), 1.0)))
            # Apart enough that the first call's slot frees well before the second's, however late the loop
            # wakes: the three queued then go as one call into that one slot, not split over two free ones.
            await asyncio.sleep(0.1)
        rest = [asyncio.ensure_future(encoder.embed(images(v), 1.0)) for v in (3, 4, 5)]
        return await asyncio.wait_for(asyncio.gather(*first, *rest), 2)

    results = asyncio.run(main())
    assert [r.ravel().tolist() for r in results] == [[1.0], [2.0], [3.0], [4.0], [5.0]]
    assert replica.calls == [[1], [1], [1, 1, 1]]


def test_an_interactive_chunk_goes_at_once_in_a_call_of_its_own_past_the_window() -> None:
    replica = Replica(seconds=0.1)

    async def interactive(value: int, encoder: TowerClient) -> np.ndarray:
        lanes.enter(Ticket("search", Lane.INTERACTIVE))  # this task's request's ticket, as the front door sets it
        return await encoder.embed(images(value), 1.0)

    async def main() -> list[np.ndarray]:
        encoder = client(replica)  # two calls in flight, both taken by the first two requests
        first = [asyncio.ensure_future(encoder.embed(images(v), 1.0)) for v in (1, 2)]
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(encoder.embed(images(3), 1.0))  # waits for one of them
        await asyncio.sleep(0.01)
        express = asyncio.ensure_future(interactive(4, encoder))
        await asyncio.sleep(0.03)
        assert not waiting.done() and len(replica.calls) == 3  # the interactive call is out, the other waits
        return await asyncio.wait_for(asyncio.gather(*first, waiting, express), 2)

    results = asyncio.run(main())
    assert [r.ravel().tolist() for r in results] == [[1.0], [2.0], [3.0], [4.0]]
    assert replica.firsts == [[1], [2], [4], [3]]
    assert replica.lanes == [None, None, [int(Lane.INTERACTIVE)], None]


def test_past_the_window_interactive_requests_coalesce_first_in_the_queue() -> None:
    """A busy interactive lane (a flooding tenant whose default lane it is) gets at most the window's worth of
    calls of its own; the rest coalesce like the others' chunks, ahead of them."""
    replica = Replica(seconds=0.1)

    async def interactive(value: int, encoder: TowerClient) -> np.ndarray:
        lanes.enter(Ticket("search", Lane.INTERACTIVE))
        return await encoder.embed(images(value), 1.0)

    async def main() -> list[np.ndarray]:
        encoder = client(replica)  # a window of two calls
        first = [asyncio.ensure_future(encoder.embed(images(v), 1.0)) for v in (1, 2)]
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(encoder.embed(images(3), 1.0))
        await asyncio.sleep(0.01)
        express = [asyncio.ensure_future(interactive(v, encoder)) for v in (4, 5, 6, 7)]
        await asyncio.sleep(0.03)
        assert len(replica.calls) == 4 and encoder.express_in_flight == 2  # two of the four went at once
        return await asyncio.wait_for(asyncio.gather(*first, waiting, *express), 2)

    results = asyncio.run(main())
    assert [r.ravel().tolist() for r in results] == [[float(v)] for v in range(1, 8)]
    assert replica.firsts[:4] == [[1], [2], [4], [5]]
    # Then what queued, coalesced (one call, or two where both slots freed at once): the interactive chunks first.
    assert [first for call in replica.firsts[4:] for first in call] == [6, 7, 3] and len(replica.firsts) <= 6


def test_behind_a_slow_model_or_before_tuning_each_request_goes_at_once() -> None:
    """ViT-B-16 on cpu: a batch of 8 takes 1.7 s; requests held back would miss the replica's next batch."""
    for tuned in (None, 1.7):
        replica = Replica(seconds=0.1)

        async def main(encoder: TowerClient) -> list[np.ndarray]:
            first = asyncio.ensure_future(encoder.embed(images(1), 1.0))
            await asyncio.sleep(0.01)
            rest = [asyncio.ensure_future(encoder.embed(images(v), 1.0)) for v in (2, 3, 4)]
            return await asyncio.wait_for(asyncio.gather(first, *rest), 2)

        encoder = client(replica, full_batch_seconds=tuned) if tuned else TowerClient(
            replica, replicas=1, ingress_replicas=1, max_images=8, retry_after_s=1, max_in_flight=16)  # type: ignore[arg-type]
        assert [r.ravel().tolist() for r in asyncio.run(main(encoder))] == [[1.0], [2.0], [3.0], [4.0]]
        assert replica.calls == [[1], [1], [1], [1]]  # with slots free, each its own call


def test_a_large_request_is_split_at_max_images_and_joined_in_order() -> None:
    replica = Replica(seconds=0.0)
    out = asyncio.run(client(replica, max_images=2).embed(images(1, 2, 3, 4, 5), 1.0))
    assert out.ravel().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert sorted(n for call in replica.calls for n in call) == [1, 2, 2]


def test_a_chunk_that_failed_alone_fails_only_its_request() -> None:
    replica = Replica(seconds=0.05)

    async def main() -> list[Any]:
        encoder = client(replica)
        blockers = [asyncio.ensure_future(encoder.embed(images(v), 1.0)) for v in (7, 8)]
        await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(encoder.embed(images(1), -1.0))  # its deadline has passed
        fine = asyncio.ensure_future(encoder.embed(images(2), 1.0))
        return await asyncio.gather(*blockers, late, fine, return_exceptions=True)

    *_, late, fine = asyncio.run(main())
    assert isinstance(late, DeadlineExceeded)
    assert fine.ravel().tolist() == [2.0]


def test_a_dead_replica_is_retried_once_then_every_caller_of_the_call_hears_503() -> None:
    once = Replica(seconds=0.0, deaths=1)
    assert asyncio.run(client(once).embed(images(3), 1.0)).ravel().tolist() == [3.0]
    assert len(once.calls) == 2

    twice = Replica(seconds=0.0, deaths=2)
    with pytest.raises(ApiError) as caught:
        asyncio.run(client(twice).embed(images(3), 1.0))
    assert caught.value.status == 503 and caught.value.error_type.value == "replica_unavailable"


def test_the_window_is_shared_between_ingress_replicas() -> None:
    assert calls_in_flight(replicas=4, ingress_replicas=1) == 8
    assert calls_in_flight(replicas=4, ingress_replicas=3) == 3
    assert calls_in_flight(replicas=1, ingress_replicas=6) == 2  # never below one running and one queued
    assert calls_in_flight(replicas=4, ingress_replicas=1, model_on_host_cores=True) == 4  # cpu: one per replica


def test_coalescing_pays_only_while_a_batch_is_cheaper_than_its_calls() -> None:
    assert worth_coalescing(0.003, 8)  # tiny-siglip on cpu, H100 ViT-B-16 (2.5 ms)
    assert not worth_coalescing(1.7, 8)  # ViT-B-16 on one cpu thread
