"""The suite's bounds (tests/bounds.py): one factor read from the environment, and a cluster-start lock that one
process holds at a time, re-entrant within it and released by its end."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.bounds import TIME_SCALE_ENV, cluster_start, read_time_scale

# Tries the lock without waiting: prints "got" or "held".
TRY = """
import fcntl, sys
with open(sys.argv[1], "a+") as lock:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("held")
    else:
        print("got")
"""


def _try(path: Path) -> str:
    return subprocess.run([sys.executable, "-c", TRY, str(path)], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_the_factor_is_one_unless_set_and_only_ever_raises_bounds() -> None:
    assert read_time_scale({}) == 1.0 and read_time_scale({TIME_SCALE_ENV: " "}) == 1.0
    assert read_time_scale({TIME_SCALE_ENV: "2.5"}) == 2.5
    for bad, says in (("0.5", "1 or more"), ("fast", "not a number"), ("nan", "1 or more")):
        with pytest.raises(ValueError, match=says):
            read_time_scale({TIME_SCALE_ENV: bad})


def test_the_lock_is_one_holder_at_a_time_re_entrant_and_released(tmp_path: Path) -> None:
    path = tmp_path / "start.lock"
    with cluster_start("a start", path):
        assert _try(path) == "held"
        with cluster_start("a start inside it", path):  # the same thread again: no wait for itself
            assert _try(path) == "held"
        assert _try(path) == "held"  # still held by the outer block
        assert "a start" in path.read_text()
    assert _try(path) == "got"


def test_a_second_holder_waits_for_the_first(tmp_path: Path) -> None:
    path = tmp_path / "start.lock"
    order: list[str] = []
    first_in, release = threading.Event(), threading.Event()

    def first() -> None:
        with cluster_start("first", path):
            order.append("first in")
            first_in.set()
            release.wait(60)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(60)
    # Another thread's flock, on a file it opened itself, waits as another process's would.
    waiter_done = threading.Event()

    def waiter() -> None:
        with cluster_start("second", path):
            order.append("second in")
        waiter_done.set()

    second = threading.Thread(target=waiter)
    second.start()
    assert not waiter_done.wait(0.5)
    release.set()
    thread.join(60)
    second.join(60)
    assert order == ["first in", "first out", "second in"]
