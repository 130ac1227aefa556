"""`siglip-serve run` with a local Ray: the service in a session of its own, so a signal sent to the
caller's whole process group reaches the service once, through this process, and never Ray directly.

Ray starts its GCS, raylet and workers in the process group of the process that calls `ray.init`, and
blocks only SIGINT in them (the `preexec_fn` of `start_ray_process`, ray/_private/services.py, Ray 2.60).
A supervisor that signals the group (`kill -TERM -- -PGID`) therefore ended Ray under the service: it
could not drain, waited 60 s for the GCS, exited 1, and HAProxy, started by a Ray worker, kept the port.

Here the command runs again as a child in a new session, and this process relays SIGTERM and SIGINT to
it: the child drains and stops its Ray as on a signal sent to it alone; and SIGHUP, on which it reads its
settings again. Whatever is left of its session
after Ray has stopped (multiprocessing's resource tracker, started in a replica; HAProxy, should its
manager die first) is killed, by the child and again by this process once the child has exited, so
the ports are free when this process exits with the child's code. Should this process die (SIGKILL), the
child gets SIGTERM and stops the same way on its own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

import psutil

from siglip_serve.core.constants import OWN_SESSION_ENV

log = logging.getLogger("siglip_serve")

# Set in the child's environment: it is the service, not another relay. The child removes it at once,
# so Ray's workers, which inherit its environment, do not carry it.
CHILD_ENV = OWN_SESSION_ENV
# SIGHUP too: the service reads its settings again (launcher/reload.py; systemd's ExecReload= signals this process).
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# How long the child's leftovers get to exit by themselves after the child has stopped Ray.
LEFTOVER_GRACE_S = 1.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def is_child() -> bool:
    """True in the service started by `run_in_own_session` (and only the first time it is asked)."""
    return os.environ.pop(CHILD_ENV, None) == "1"


def run_in_own_session(argv: list[str], program: list[str] | None = None) -> int:
    """Run `siglip-serve ARGV` (`program` instead of siglip-serve: tests) as a child in its own session,
    relaying SIGTERM and SIGINT to it; return its exit code (128 + N when signal N ended it) once
    nothing of its session is left."""
    child: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def relay(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            early.append(signum)
        else:
            _signal(child.pid, signum)

    for relayed in RELAYED:
        signal.signal(relayed, relay)
    child = subprocess.Popen([*(program or [sys.executable, "-m", "siglip_serve", "run"]), *argv],
                             env={**os.environ, CHILD_ENV: "1"}, start_new_session=True,
                             preexec_fn=_stop_with_parent(os.getpid()))
    # The service logs its pid itself once its checks have passed: a refusal stays one line.
    log.debug("service: pid %d, in a session of its own", child.pid)
    for signum in early:
        _signal(child.pid, signum)
    # Not reaped yet: the child's pid, which is also its session's id, cannot be reused meanwhile.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    end_leftovers(child.pid)
    code = child.wait()
    return code if code >= 0 else 128 - code


def _signal(pid: int, signum: int) -> None:
    # os.kill, not Popen.send_signal: that would reap the child before its session is swept.
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _stop_with_parent(parent: int) -> Callable[[], None] | None:
    """preexec_fn: SIGTERM to the child when this process dies (SIGKILL, OOM), so the service drains
    and stops its Ray instead of living on, unseen, in its own session. Linux only."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the forked child

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def session_processes(session: int) -> list[psutil.Process]:
    """Live processes of `session` other than its leader (zombies hold no port and are not ours to reap)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != session and os.getsid(proc.pid) == session and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to look at
            continue
    return found


def end_leftovers(session: int, grace_s: float = LEFTOVER_GRACE_S) -> None:
    """Kill what is left of `session` after `grace_s`: only that session, never every Ray on the host."""
    deadline = time.monotonic() + grace_s
    left = session_processes(session)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = session_processes(session)
    if not left:
        return
    log.info("killing %d process(es) the service left behind: %s", len(left),
             ", ".join(sorted({_name(proc) for proc in left})))
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=5)


def _name(proc: psutil.Process) -> str:
    """'haproxy', 'ray::ServeReplica...', or what a Python process runs: `-m MODULE`, a script, `-c CODE`
    (multiprocessing's resource tracker, which a replica's libraries start and which outlives it)."""
    try:
        words = proc.cmdline()
        if not words or not os.path.basename(words[0]).startswith("python"):
            return proc.name()
        for index, word in enumerate(words[1:], start=1):
            if word in ("-m", "-c"):
                return " ".join([word, *words[index + 1:index + 2]])[:60]
            if not word.startswith("-"):
                return os.path.basename(word)
        return proc.name()
    except psutil.Error:
        return str(proc.pid)
