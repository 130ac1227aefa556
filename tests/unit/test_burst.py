"""The slow-hour measurements' shared parts (measure/burst.py): a reply's status, a busy core that exists only
inside its block, and a service stopped as Ctrl-C stops it (the burst itself: tests/integration/test_front_door.py)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from siglip_serve.measure.burst import busy_core, status_of, stop


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


def test_stop_interrupts_then_kills_what_ignores_it() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop(polite, timeout_s=30)
    assert polite.returncode != 0 and polite.returncode is not None
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"
    stop(deaf, timeout_s=0.5)
    assert deaf.returncode == -9
