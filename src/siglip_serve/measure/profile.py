"""`siglip-serve bench --profile DIR`: where the service's host CPU goes, one flame graph per process.

The CPU table says how many ms of host CPU each process kind spends per image; a flame graph says on
what. py-spy samples each Python process of the service (the ingress, the encoder replicas, Serve's
controller, Serve's proxy or HAProxy's manager) from outside, with no change to the service, while
the client drives it at the highest concurrency, after the measured rows (its sampling costs CPU,
so it never overlaps a measured window). One SVG per process: DIR/<kind>-<pid>.svg.

py-spy reads other processes' memory: it needs ptrace (root, or kernel.yama.ptrace_scope=0).
Threads waiting (a thread pool's idle workers, an event loop's select) still show as towers at their
wait when py-spy cannot tell they sleep; the work is what sits above Serve's and our frames.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from siglip_serve.core.errors import UserError
from siglip_serve.measure.results import ProfileFile
from siglip_serve.measure.server_cpu import ServerCpu

PROFILED_KINDS = ("ingress", "encoder", "proxy", "serve_controller")
SAMPLES_PER_SECOND = 100


class ProfileRefused(UserError, RuntimeError):
    """--profile was asked for and cannot run (no py-spy, or no served part to profile)."""


def py_spy() -> str:
    """py-spy beside this Python (a venv's bin) or on PATH; refused in one line otherwise."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise ProfileRefused("--profile needs py-spy: pip install py-spy (in the dev extra: pip install -e '.[dev]')")
    return found


@dataclass
class _Recording:
    kind: str
    pid: int
    path: Path
    process: subprocess.Popen[bytes]


def _is_python(pid: int) -> bool:
    """Ray's workers rename themselves (`ray::ServeReplica:...`); HAProxy itself is a C binary."""
    try:
        proc = psutil.Process(pid)
        return "python" in proc.exe().lower() or proc.name().startswith("ray::")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class Profiles:
    """py-spy recording every profiled process of `server` for `seconds`, started at once."""

    def __init__(self, server: ServerCpu, out_dir: Path, seconds: float, executable: str | None = None) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.recordings: list[_Recording] = []
        executable = executable or py_spy()
        for pid, (kind, _) in sorted(server.snapshot().items()):
            if kind not in PROFILED_KINDS or not _is_python(pid):
                continue
            path = out_dir / f"{kind}-{pid}.svg"
            command = [executable, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                       "--rate", str(SAMPLES_PER_SECOND), "--nonblocking", "--format", "flamegraph",
                       "--output", str(path)]
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.recordings.append(_Recording(kind, pid, path, process))

    def finish(self, timeout_s: float) -> list[ProfileFile]:
        """Wait for every recording; each file, or why it is missing (py-spy's own last line)."""
        files = []
        for rec in self.recordings:
            try:
                _, err = rec.process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                rec.process.kill()
                _, err = rec.process.communicate()
            ok = rec.process.returncode == 0 and rec.path.is_file() and rec.path.stat().st_size > 0
            lines = err.decode(errors="replace").strip().splitlines()
            files.append(ProfileFile(kind=rec.kind, pid=rec.pid, path=str(rec.path) if ok else None,
                                     error=None if ok else (lines[-1] if lines else f"exit {rec.process.returncode}")))
        return files
