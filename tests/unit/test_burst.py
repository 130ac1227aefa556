"""The slow-hour measurements' shared parts (measure/burst.py): a reply's status and a busy core that exists only
inside its block (the burst itself: tests/integration/test_front_door.py)."""

from __future__ import annotations

import psutil

from siglip_serve.measure.burst import busy_core, status_of


def _loops() -> set[int]:
    """Every busy shell loop on the machine (tools/busy_core.sh's too, where a suite runs beside one)."""
    return {p.pid for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[-1:] == ["while :; do :; done"]}


def test_a_reply_status_and_none_for_a_closed_connection() -> None:
    assert status_of(b"HTTP/1.1 503 Service Unavailable\r\n\r\n{}") == 503
    assert status_of(b"") == 0


def test_the_busy_core_runs_inside_its_block_only() -> None:
    before = _loops()
    with busy_core():
        started = _loops() - before
        assert len(started) == 1
        (pid,) = started
        assert psutil.Process(pid).is_running()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with busy_core(on=False):
        assert not _loops() - before
