"""The multi-node check's worker start (tests/integration/multinode_check.py `_add_worker`): a node that overran
Ray's 30 s to register is started again, unless it registered late, and any other failure is not retried. A
stand-in cluster: what it does not prove is a real raylet's start (tests/integration/test_multinode.py runs one)."""

from __future__ import annotations

from typing import Any

import pytest

from siglip_serve.core.poll import poll
from tests.integration import multinode_check

TIMED_OUT = "The current node timed out during startup. This could happen because ..."


class Cluster:
    def __init__(self, failures: list[str]) -> None:
        self.failures, self.started = failures, 0

    def add_node(self, **_: Any) -> None:
        self.started += 1
        if self.failures:
            raise Exception(self.failures.pop(0))


def quick_poll(attempt: Any, done: Any, timeout_s: float, interval_s: float = 1.0) -> Any:
    return poll(attempt, done, min(timeout_s, 0.2), interval_s=0.01)


def test_a_node_that_overran_its_registration_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multinode_check, "_workers_alive", lambda ray: 0)  # the overrun node never registers
    cluster = Cluster([TIMED_OUT])
    multinode_check._add_worker(cluster, {}, quick_poll)
    assert cluster.started == 2


def test_a_node_that_registered_late_is_kept_and_no_other_started(monkeypatch: pytest.MonkeyPatch) -> None:
    alive = iter([0, 1])  # before the start, then the late registration
    monkeypatch.setattr(multinode_check, "_workers_alive", lambda ray: next(alive, 1))
    cluster = Cluster([TIMED_OUT])
    multinode_check._add_worker(cluster, {}, quick_poll)
    assert cluster.started == 1


def test_other_failures_and_the_last_overrun_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multinode_check, "_workers_alive", lambda ray: 0)
    with pytest.raises(Exception, match="port taken"):
        multinode_check._add_worker(Cluster(["port taken"]), {}, quick_poll)
    with pytest.raises(Exception, match="timed out during startup"):
        multinode_check._add_worker(Cluster([TIMED_OUT] * 3), {}, quick_poll)
