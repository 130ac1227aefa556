"""launcher/session.py without Ray: a stand-in service that records the signals it gets and leaves a
process behind, as HAProxy is left behind by the Ray worker that starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from siglip_serve.core.poll import poll

SERVICE = '''
import os, signal, subprocess, sys, time
record = sys.argv[1]
left = subprocess.Popen(["sleep", "60"])
def stop(signum, _frame):
    with open(record, "a") as out:
        out.write(f"{signal.Signals(signum).name} {left.pid}\\n")
    os._exit(3)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
with open(record + ".ready", "w") as out:
    out.write(str(os.getsid(0)))
while True:
    time.sleep(0.1)
'''


def start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The relay in a session of its own (as a supervisor starts it), once the stand-in runs."""
    script, record = tmp_path / "service.py", tmp_path / "record"
    script.write_text(SERVICE)
    relay = (f"import sys; from siglip_serve.launcher.session import run_in_own_session; "
             f"sys.exit(run_in_own_session([{str(record)!r}], program=[sys.executable, {str(script)!r}]))")
    process = subprocess.Popen([sys.executable, "-c", relay], start_new_session=True)
    _, ready, _ = poll(lambda: Path(f"{record}.ready").is_file(), bool, 30, interval_s=0.05)
    assert ready
    return process, record


def signals_seen(record: Path) -> list[str]:
    return record.read_text().split() if record.is_file() else []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("to_group", [True, False], ids=["to-the-group", "to-the-main-process"])
def test_a_signal_reaches_the_service_once_and_nothing_is_left(tmp_path: Path, signum: signal.Signals,
                                                               to_group: bool) -> None:
    relay, record = start(tmp_path)
    assert int(Path(f"{record}.ready").read_text()) != os.getsid(relay.pid)  # a session of its own
    if to_group:
        os.killpg(relay.pid, signum)
    else:
        relay.send_signal(signum)
    assert relay.wait(30) == 3  # the service's own exit code
    name, left = signals_seen(record)
    assert name == signum.name  # once: relayed, not also sent to the service by the group signal
    assert not psutil.pid_exists(int(left)) or psutil.Process(int(left)).status() == psutil.STATUS_ZOMBIE


def test_the_service_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    relay, record = start(tmp_path)
    relay.kill()
    relay.wait(10)
    seen, _, _ = poll(lambda: signals_seen(record), bool, 10, interval_s=0.05)
    assert seen and seen[0] == "SIGTERM", seen  # not left running, unseen, in its own session
    os.kill(int(seen[1]), signal.SIGKILL)  # no relay is left to sweep the leftover
