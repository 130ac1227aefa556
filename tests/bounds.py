"""The suite's bounds on waiting, and its one lock on cluster starts: what keeps a verdict from depending on the hour.

A bound here is a ceiling on a wait, not a figure: every wait polls for what it waits for (core.poll) and ends
as soon as it is so, so a generous bound costs a quiet machine nothing and keeps a slow hour's verdict. Each bound
is set for a machine at least three times slower than the one docs/benchmarks.md's figures came from, and is
multiplied by one factor, SIGLIP_TEST_TIME_SCALE (read once, here; 1 unless set), for a machine slower still
(docs/dev/test-suite.md says when to set it).

The lock: a Ray starting (its GCS, raylet, agents, then Serve's controller and proxy, then replicas importing
torch) is the heaviest thing the suite does on two cores, and two at once can overrun Ray's own start bounds. Every
cluster the suite starts, in-process or as a subprocess service, starts under cluster_start(): one at a time on
the machine, whichever pytest worker or suite asks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from siglip_serve.core.poll import poll

TIME_SCALE_ENV = "SIGLIP_TEST_TIME_SCALE"


def read_time_scale(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """The factor every bound is multiplied by: SIGLIP_TEST_TIME_SCALE, 1 where unset; a number >= 1."""
    text = environ.get(TIME_SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"{TIME_SCALE_ENV}={text!r} is not a number (a factor such as 2 or 3)") from None
    if not scale >= 1.0:
        raise ValueError(f"{TIME_SCALE_ENV}={text!r}: the factor only raises bounds, so it is 1 or more")
    return scale


TIME_SCALE = read_time_scale()


def scaled(seconds: float) -> float:
    """`seconds` (a bound set for a machine three times slower than the Benchmarks page's) times TIME_SCALE."""
    return seconds * TIME_SCALE


# One service start: a `siglip-serve run` (its own Ray, Serve, the replicas' imports and warm-up) until /readyz
# answers 200 (the Benchmarks page's start figures, three times and more).
START_S = scaled(240)
# A change to a running service taking effect: an app deployed, replaced or deleted, a replica added or stopped,
# a setting in force.
SETTLE_S = scaled(120)
# A service or a subprocess stopping, drained, every process gone.
STOP_S = scaled(120)
# A whole run of a command that starts and stops its own cluster (bench, bulk, a rehearsal): START_S plus its work.
RUN_S = scaled(420)
# pytest-timeout's bound for one test (a test may wait for the start lock, then start one service and stop it), as
# pyproject.toml has it; a test that starts more sets its own with @pytest.mark.timeout(SECONDS). tests/conftest.py
# multiplies either by TIME_SCALE, once.
TEST_TIMEOUT_S = 480.0
# How long a start waits for the lock: the longest hold is one whole run (RUN_S).
LOCK_WAIT_S = scaled(900)

# Ray's own start bounds that it lets a caller raise, each by the environment variable it reads. Not among them:
# the 30 s a node waits for its raylet to register (ray/_private/node.py, `raylet_start_wait_time_s`, a literal)
# and Serve's 60 s for its proxies (ray/serve/_private/constants.py, HTTP_PROXY_TIMEOUT): those two are why
# starts take the lock.
RAY_START_ENV = {
    # The driver's GCS requests, node info among them (ray/_private/ray_constants.py, 60 s).
    "RAY_gcs_server_request_timeout_seconds": str(int(scaled(180))),
    # A worker process's registration with its raylet (RayConfig, src/ray/common/ray_config_def.h, 60 s).
    "RAY_worker_register_timeout_seconds": str(int(scaled(180))),
    # Serve's controller's checks of a starting and a running proxy (ray/serve/_private/constants.py, 5 s and 10 s):
    # one missed restarts the proxy, which starts the wait over.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(scaled(30)),
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": str(scaled(30)),
}

# The lock file is per machine, not per checkout: two suites on one machine share its cores.
LOCK_PATH = Path(tempfile.gettempdir()) / "siglip-serve-tests-cluster-start.lock"
_held = threading.local()


@contextlib.contextmanager
def cluster_start(what: str, path: Path = LOCK_PATH) -> Iterator[None]:
    """Hold the machine's cluster-start lock (`path`) while the block starts a cluster (`what` names it, for the
    message of a wait that runs out). Re-entrant within a thread; a process that dies releases it (flock)."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    with open(path, "a+") as lock:
        def attempt() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        _, got, waited = poll(attempt, bool, LOCK_WAIT_S, interval_s=0.2)
        if not got:
            lock.seek(0)
            raise AssertionError(f"{what}: the cluster-start lock ({path}) still held after {waited:.0f} s "
                                 f"by {lock.read().strip() or 'an unknown process'}")
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}: {what}, since {time.strftime('%H:%M:%S')}\n")
        lock.flush()
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(lock, fcntl.LOCK_UN)
