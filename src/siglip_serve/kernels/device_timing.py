"""Device-side kernel time from Neuron Explorer, the profiler that replaced neuron-profile.

Every timed loop in this package measures host wall clock around call + sync
(``timing: wall_clock_including_dispatch``; seed 002 saw ~1.4 ms of that per call for a
~40 us kernel). The current ``nki`` package has ``jit`` and ``simulate`` but no
``benchmark``, so the device's own time comes from the profiler, as the NKI guide
"Profile a NKI Kernel" (SDK 2.33) describes:

1. run the benchmark so each NEFF is saved: on the 2.31 trace line with ``NEURON_FRAMEWORK_DEBUG=1``
   (plus ``XLA_IR_DEBUG=1``, ``XLA_HLO_DEBUG=1``); on TorchNeuron (2.33, no torch-xla) through the
   runtime, which Neuron Explorer's environment-variable capture works with in "any framework":
   ``NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=1 NEURON_RT_INSPECT_OUTPUT_DIR=neffs``
   writes ``neff_<id>.neff`` (and the first execution's trace) under ``neffs/`` (Neuron Explorer
   "Environment Variables", SDK 2.33.1);
2. ``neuron-explorer capture -n X.neff -s profile.ntff --profile-nth-exec=2`` executes
   it on the device and records the 2nd execution (skipping warm-up effects) to
   ``profile_exec_2.ntff``;
3. ``neuron-explorer view -n X.neff -s profile_exec_2.ntff --output-format summary-json`` writes the
   summary that :mod:`siglip_serve.kernels.profile_json` reads (``total_time`` in seconds). The full
   ``--output-format json`` is legacy and ends with SDK 2.33; summary-json stays (Explorer FAQ).

Results carry ``timing: device``. Capturing needs the NeuronCore to itself (seed 002).
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from siglip_serve.kernels.device import DEVICE_TIMING
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable
from siglip_serve.kernels.profile_json import (
    FRAMEWORK_DEBUG_ENV,
    ProfileSummary,
    explorer_capture_command,
    load_summary,
)

EXPLORER = "neuron-explorer"
# How each Neuron line saves the NEFFs a benchmark runs, for profile-neff to capture again.
RUNTIME_CAPTURE_ENV = {"NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_DEVICE_PROFILE": "1",
                       "NEURON_RT_INSPECT_OUTPUT_DIR": "neffs"}
NEFF_SAVING_ENV = {"trace": FRAMEWORK_DEBUG_ENV, "native": RUNTIME_CAPTURE_ENV}


def _assignments(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


class DeviceTimingUnavailable(KernelUnavailable):
    """Neuron Explorer is missing or did not produce a profile."""


@dataclass(frozen=True)
class DeviceTime:
    neff: str
    summary: ProfileSummary
    nth_exec: int
    timing: str = DEVICE_TIMING

    @property
    def total_us(self) -> float:
        return self.summary.total_us

    def as_dict(self) -> dict[str, Any]:
        return {"neff": self.neff, "nth_exec": self.nth_exec, "timing": self.timing,
                "method": f"{EXPLORER} capture --profile-nth-exec={self.nth_exec}",
                "total_us": self.total_us, "summary": self.summary.as_dict()}


def explorer_view_json_command(neff: str | Path, session: str | Path) -> list[str]:
    """``neuron-explorer view`` printing the summary-json that profile_json reads (on stdout: the
    summary formats print rather than write a file)."""
    return [EXPLORER, "view", "-n", str(neff), "-s", str(session), "--output-format", "summary-json"]


def captured_session(session: Path, nth_exec: int) -> Path:
    """Where capture wrote the trace: ``<stem>_exec_<n>.ntff`` per the guide, else the name given."""
    numbered = session.with_name(f"{session.stem}_exec_{nth_exec}{session.suffix}")
    if numbered.exists():
        return numbered
    if session.exists():
        return session
    raise DeviceTimingUnavailable(f"{EXPLORER} capture wrote neither {numbered} nor {session}")


def find_neffs(directory: str | Path) -> list[Path]:
    """NEFFs a NEURON_FRAMEWORK_DEBUG=1 run left in ``directory``, oldest first."""
    return sorted(Path(directory).rglob("*.neff"), key=lambda p: p.stat().st_mtime)


def profile_neff(neff: str | Path, workdir: str | Path, nth_exec: int = 2,
                 run: Callable[..., Any] = subprocess.run,
                 which: Callable[[str], str | None] = shutil.which) -> DeviceTime:
    """Capture one NEFF on the device and return its device-side time."""
    if nth_exec < 1:
        raise KernelInputError(f"nth_exec must be >= 1, got {nth_exec}")
    if which(EXPLORER) is None:
        raise DeviceTimingUnavailable(
            f"{EXPLORER} is not on PATH; it ships with aws-neuronx-tools (preinstalled on the Neuron DLAMI)")
    neff = Path(neff)
    if not neff.is_file():
        raise DeviceTimingUnavailable(
            f"{neff}: no such NEFF; run the benchmark with {_assignments(FRAMEWORK_DEBUG_ENV)} on the 2.31 trace "
            f"line, or with {_assignments(RUNTIME_CAPTURE_ENV)} on TorchNeuron (2.33), then pass the NEFFs or their "
            f"folder")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    session = workdir / f"{neff.stem}.ntff"
    _run_tool(run, explorer_capture_command(neff, session, nth_exec))
    output = workdir / f"{neff.stem}.json"  # kept beside the trace: what a first trn2 run sends back
    printed = _run_tool(run, explorer_view_json_command(neff, captured_session(session, nth_exec)))
    output.write_text(printed, encoding="utf-8")
    return DeviceTime(str(neff), load_summary(output, neff.stem), nth_exec)


def _run_tool(run: Callable[..., Any], cmd: list[str]) -> str:
    proc = run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise DeviceTimingUnavailable(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}): {tail[0]}")
    return str(proc.stdout or "")


def format_device_times(times: list[DeviceTime]) -> str:
    header = f"{'NEFF':<40} {'device us':>10} {'tensor us':>10} {'DMA us':>9}  timing"
    lines = [header, "-" * len(header)]
    for t in times:
        tensor, dma = t.summary.engine_active_us("tensor"), t.summary.engine_active_us("dma")
        lines.append(f"{Path(t.neff).name:<40} {t.total_us:>10.2f} "
                     f"{tensor if tensor is not None else float('nan'):>10.2f} "
                     f"{dma if dma is not None else float('nan'):>9.2f}  {t.timing}")
    return "\n".join(lines)
