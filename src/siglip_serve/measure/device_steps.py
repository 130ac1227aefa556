"""The step runner of `siglip-serve device-check` (measure/device_check.py): each step a subprocess in its own
session, bounded by its timeout and by what is left of the whole run's budget, its output in one log.

Standard library only, like the rest of the check's own code: on a fresh accelerator machine the check must
run, and record why, before this project's dependencies are installed or when they cannot be.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Below this many seconds left in the budget a step is not started: it could not finish anything.
MIN_STEP_S = 5.0


@dataclass
class StepResult:
    name: str
    title: str
    status: str  # passed | failed | timeout | skipped
    seconds: float = 0.0
    returncode: int | None = None
    error: str | None = None
    log: str | None = None
    # What the summary shows of the step: images/s, latency, CPU-ms per image, per-bucket figures.
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    name: str
    title: str
    command: Callable[[Path], list[str]]
    timeout_s: float
    # Called after a zero exit with the run's folder: the step's figures, or a string that fails the step.
    after: Callable[[Path], dict[str, Any] | str] = lambda out: {}
    # Called with the run's folder when the step's turn comes (an earlier step's output may decide): why it is
    # skipped, or None.
    skip_if: Callable[[Path], str | None] = lambda out: None


def run_step(step: Step, out: Path, deadline: float, skip: frozenset[str], env: dict[str, str],
             echo: Callable[[str], None] = print) -> StepResult:
    """Run `step` (or skip it, saying why) with min(its timeout, what is left before `deadline`)."""
    left = deadline - time.monotonic()
    reason = ("skipped by --skip" if step.name in skip else step.skip_if(out) or
              (f"only {max(left, 0):.0f} s of the run's budget left" if left < MIN_STEP_S else None))
    if reason:
        echo(f"- {step.title}: skipped ({reason})")
        return StepResult(step.name, step.title, "skipped", error=reason)
    timeout = min(step.timeout_s, left)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{step.name}.log"
    try:
        command = step.command(out)
    except (OSError, ValueError, KeyError) as exc:  # an input an earlier step should have written
        echo(f"- {step.title}: failed ({exc})")
        return StepResult(step.name, step.title, "failed", error=f"{type(exc).__name__}: {exc}")
    echo(f"- {step.title} (timeout {timeout:.0f} s)")
    began = time.monotonic()
    with open(log, "w") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        try:
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=out,
                                    env={**os.environ, **env}, start_new_session=True)
        except OSError as exc:
            return StepResult(step.name, step.title, "failed", error=f"could not start: {exc}",
                              log=str(log.relative_to(out)))
        code = wait(proc, timeout)
        end_session(proc.pid)
    seconds = round(time.monotonic() - began, 1)
    result = StepResult(step.name, step.title, "passed", seconds, code, log=str(log.relative_to(out)))
    if code is None:
        result.status, result.error = "timeout", f"no result within {timeout:.0f} s; stopped"
    elif code != 0:
        result.status, result.error = "failed", f"exit code {code}: {tail(log)}"
    else:
        try:
            found = step.after(out)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found = f"its output is unreadable: {type(exc).__name__}: {exc}"
        if isinstance(found, str):
            result.status, result.error = "failed", found
        else:
            result.figures = found
    echo(f"  {result.status} in {seconds:.1f} s" + (f": {result.error}" if result.error else ""))
    return result


def wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, or None once `timeout_s` passed and the step's whole session (a local Ray's processes
    included) was stopped."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for signal, grace in ((15, 20.0), (9, None)):
            try:
                os.killpg(proc.pid, signal)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return None


def session_members(session: int) -> list[int]:
    """Every process of `session` (Linux: /proc/PID/stat, whose fields after the name are state, ppid,
    process group, session)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == session:
            members.append(int(entry))
    return members


def end_session(session: int) -> None:
    """Kill what a finished or stopped step left in its session. Killing the step's process group is not
    enough: Ray's process reaper makes a group of its own (ray/_private/services.py, os.setpgrp), so Ray's
    daemons, and the HAProxy that Serve's HAProxyManager starts, would outlive the step."""
    for pid in session_members(session):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def tail(log: Path, lines: int = 4) -> str:
    """The last lines of a log (its command line left out): the error a failed step ends on."""
    text = [line for line in log.read_text(errors="replace").splitlines()[1:] if line.strip()]
    return " | ".join(text[-lines:])[-600:] or "(no output)"
