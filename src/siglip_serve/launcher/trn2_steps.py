"""The steps `siglip-serve trn2-check` runs (siglip_serve.launcher.trn2_check runs and reports them): what
each records for the steps after it, each Neuron line's compile/accuracy/serve/bench/report, and the NKI
kernels' check on the line this machine has.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from siglip_serve.core.constants import KERNEL_TARGET, PLATFORM_TARGET_ENV
from siglip_serve.models.neuron.env import (
    COMPILE_CACHE_URL_ENV,
    LOCAL_NEFF_CACHE_ENV,
    NEFF_CACHE_ENV,
    VISIBLE_CORES_ENV,
    artifact_environment,
)

MODEL = "tiny-siglip"
BACKEND_OF_LINE = {"trace": "neuron", "native": "neuron-native"}
# The kernel steps' own NEFF caches under DIR, one per cache variable of either line: they run last, and what
# they compile must neither land in the caches the compile and serve steps use nor be read from them.
KERNEL_CACHES_DIR = "kernel-caches"
KERNEL_CACHES = {COMPILE_CACHE_URL_ENV: "compile-cache", NEFF_CACHE_ENV: "neff", LOCAL_NEFF_CACHE_ENV: "local"}


@dataclass
class StepResult:
    name: str
    title: str
    status: str  # passed | failed | timeout | skipped
    seconds: float = 0.0
    returncode: int | None = None
    reason: str | None = None
    log: str | None = None
    outputs: list[str] = field(default_factory=list)
    # Wall-clock seconds (epoch) around the step's subprocess: the window the NEFF report counts files in.
    started_at: float | None = None
    finished_at: float | None = None


@dataclass
class Step:
    name: str
    title: str
    command: Callable[[Run], list[str]]
    timeout_s: float
    needs: tuple[str, ...] = ()
    skip_if: Callable[[Run], str | None] = lambda run: None
    env: dict[str, str] = field(default_factory=dict)
    # Environment known only once earlier steps ran (a native artifact's recipe): set in the child
    # before it starts, so before it imports torch (which loads TorchNeuron and reads it then).
    env_for: Callable[[Run], dict[str, str]] = lambda run: {}
    outputs: tuple[str, ...] = ()
    # Called after a zero exit: may record what later steps use; a returned string fails the step.
    after: Callable[[Run, Path], str | None] = lambda run, stdout: None


@dataclass
class Run:
    out: Path
    pythons: list[str]
    lnc: int | None = None
    cores: int | None = None
    lines: dict[str, str] = field(default_factory=dict)  # line -> the python that has it
    nki: dict[str, tuple[bool, str]] = field(default_factory=dict)  # python -> (usable nki, why / version)
    artifacts: dict[str, str] = field(default_factory=dict)  # line -> compiled artifact directory
    results: dict[str, StepResult] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()


def read_versions(name: str) -> Callable[[Run, Path], str | None]:
    def after(run: Run, _stdout: Path) -> str | None:
        info = json.loads((run.out / f"{name}.json").read_text())
        if info.get("line") and info["line"] not in run.lines:
            run.lines[info["line"]] = info["executable"]
        nki = info.get("nki") or {}
        run.nki[info["executable"]] = (bool(nki.get("usable")), str(nki.get("reason", "not probed")))
        if run.lnc is None and info.get("lnc"):
            run.lnc = int(info["lnc"])
        return info.get("lnc_error")
    return after


def neuron_ls_devices(data: Any) -> tuple[list[dict[str, Any]], str]:
    """The device entries of `neuron-ls --json-output` and the shape they came in. Ray's own reader
    (ray/_private/accelerators/neuron.py) takes a list of devices with `nc_count`; the Neuron docs show
    the table, not the JSON, so an object holding that list (or one device) is read too."""
    if isinstance(data, list):
        return [d for d in data if isinstance(d, dict)], "a list of devices"
    if isinstance(data, dict):
        if "nc_count" in data:
            return [data], "one device object"
        for key, value in data.items():
            if isinstance(value, list) and value and all(isinstance(d, dict) and "nc_count" in d for d in value):
                return value, f"an object with the devices under {key!r}"
        return [], f"an object with keys {sorted(data)[:8]} and no device list"
    return [], f"a {type(data).__name__}"


def count_cores(run: Run, _stdout: Path) -> str | None:
    """The logical NeuronCores neuron-ls counts (`nc_count` per device, at the node's LNC); a JSON with no
    countable device fails the step, and the multi-core bench then needs --cores, rather than a guess."""
    try:
        devices, shape = neuron_ls_devices(json.loads((run.out / "neuron-ls.json").read_text()))
        cores = sum(int(d.get("nc_count", 0)) for d in devices)
    except (OSError, ValueError, TypeError) as exc:
        return f"neuron-ls --json-output is unreadable ({exc})"
    if cores < 1:
        return f"neuron-ls --json-output gave no NeuronCore count ({shape}); pass --cores N"
    run.cores = cores
    return None


def cores_unknown(run: Run) -> str | None:
    return None if run.cores else "no NeuronCore count (neuron-ls gave none); pass --cores N"


def _record_artifact(line: str) -> Callable[[Run, Path], str | None]:
    def after(run: Run, stdout: Path) -> str | None:
        printed = [p for p in stdout.read_text().splitlines() if p.strip()]
        if not printed or not Path(run.out, printed[-1].strip()).is_dir():
            return "the compile printed no artifact directory"
        run.artifacts[line] = str(Path(run.out, printed[-1].strip()).resolve())
        return None
    return after


def _line_missing(line: str) -> Callable[[Run], str | None]:
    def skip(run: Run) -> str | None:
        if line not in run.lines:
            return (f"the {line} line (torch-neuronx {'2.9' if line == 'trace' else '2.13+'}) is not installed in "
                    f"{', '.join(run.pythons)}")
        if line == "native" and importlib.util.find_spec("siglip_serve.models.backends.neuron_native") is None:
            return "this checkout has no neuron-native backend (models/backends/neuron_native.py)"
        return None
    return skip


def accuracy_env(line: str) -> Callable[[Run], dict[str, str]]:
    """One core, and for a native artifact its whole recipe (LNC, NEURON_CC_FLAGS, opt level, NEFF
    cache): set after `import torch`, TorchNeuron may already have read them and would compile
    bucket 1 into its default cache, which the load then refuses."""
    def env(run: Run) -> dict[str, str]:
        recipe = artifact_environment(Path(run.artifacts[line])) if line == "native" else {}
        return {**recipe, VISIBLE_CORES_ENV: "0"}
    return env


def line_steps(line: str, timeout_scale: float, iterations: int) -> list[Step]:
    backend = BACKEND_OF_LINE[line]
    missing = _line_missing(line)
    lnc_env = lambda run: ["--lnc", str(run.lnc or 2)]  # noqa: E731

    def py(run: Run) -> str:
        return run.lines.get(line, sys.executable)

    return [
        Step(f"compile-{line}", f"compile {MODEL} ({line} line, buckets 1,2)",
             lambda run: [py(run), "-m", "siglip_serve", "compile",
                          *(["--backend", backend] if line == "native" else []), "--model", MODEL,
                          "--buckets", "1,2", *lnc_env(run), "--cache-root", f"artifacts-{line}"],
             1800 * timeout_scale, skip_if=missing, after=_record_artifact(line)),
        Step(f"accuracy-{line}", f"accuracy against the CPU ({line} line, bucket 1, core 0)",
             lambda run: [py(run), "-m", "siglip_serve", "accuracy", "--model", MODEL, "--a", "backend=cpu",
                          "--b", f"backend={backend},artifact_dir={run.artifacts[line]},buckets=1",
                          "--images", "images", "--json", f"accuracy-{line}.json"],
             900 * timeout_scale, needs=(f"compile-{line}",), env_for=accuracy_env(line),
             outputs=(f"accuracy-{line}.json",)),
        # The compiled buckets are static shapes: whether a photo's vector still depends on its batch, the cache,
        # bulk or the input form, as compiled and with deterministic: true (docs/reproducibility.md). On core 0 alone:
        # a second process cannot load a NeuronCore this one holds, so no replica comparison here.
        Step(f"determinism-{line}", f"determinism: each photo alone against each bucket, the cache, bulk and every "
                                    f"input form ({line} line, core 0)",
             lambda run: [py(run), "-m", "siglip_serve", "determinism", "--model", MODEL, "--backend", backend,
                          "--artifact-dir", run.artifacts[line], "--buckets", "1,2", "--skip", "replica,text",
                          "--json", f"determinism-{line}.json"],
             900 * timeout_scale, needs=(f"compile-{line}",), env_for=accuracy_env(line),
             outputs=(f"determinism-{line}.json",)),
        Step(f"serve-{line}", f"serve it and embed a photo ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve.launcher.trn2_probes", "serve", f"serve-{line}.json",
                          "--backend", backend, "--artifact-dir", run.artifacts[line],
                          "--ready-timeout", str(900 * timeout_scale)],
             1200 * timeout_scale, needs=(f"compile-{line}",), outputs=(f"serve-{line}.json",)),
        Step(f"multicore-{line}", f"multi-core bench, one worker per logical core ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve.measure.multicore", "--backend", backend, "--model", MODEL,
                          "--artifact-dir", run.artifacts[line], "--cores", str(run.cores),
                          "--bucket", "1", "--warmup", "5", "--iterations", str(iterations),
                          "--json", f"multicore-{line}.json"],
             1800 * timeout_scale, needs=(f"compile-{line}",), skip_if=cores_unknown,
             outputs=(f"multicore-{line}.json",)),
        Step(f"report-{line}", f"instance-throughput report ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve", "loadtest", "report", "--multicore-json",
                          f"multicore-{line}.json", *(["--lnc", str(run.lnc)] if run.lnc else []),
                          "--out", f"report-{line}"],
             300 * timeout_scale, needs=(f"multicore-{line}",), outputs=(f"report-{line}/report.md",)),
    ]


def kernel_python(run: Run, where: str) -> tuple[str | None, str]:
    """The python the NKI kernels' check runs in, or why none: on a NeuronCore the line found (TorchNeuron
    first, then the trace line), each only with a usable nki; on the simulator any checked python with one."""
    found = [run.lines[line] for line in ("native", "trace") if line in run.lines]
    candidates = found + ([p for p in run.pythons if p not in found] if where == "simulator" else [])
    for python in candidates:
        if run.nki.get(python, (False, ""))[0]:
            return python, ""
    if not candidates:
        return None, (f"no Neuron line in {', '.join(run.pythons)}: neither the 2.31 trace line (torch-neuronx 2.9 "
                      f"with torch-xla) nor TorchNeuron (torch-neuronx 2.13+) is installed")
    why = "; ".join(f"{p}: {run.nki.get(p, (False, 'not probed'))[1]}" for p in candidates)
    return None, f"no usable nki ({why}); docs/kernels.md"


def kernel_caches(out: Path, where: str) -> dict[str, str]:
    """Every NEFF cache variable pointed at the kernel step's own folder, DIR/kernel-caches/<where>/."""
    root = (out / KERNEL_CACHES_DIR / where).resolve()
    return {var: str(root / name) for var, name in KERNEL_CACHES.items()}


def kernel_steps(timeout_scale: float) -> list[Step]:
    """`kernels check` on the simulator (pinned to trn2 unless the user set a target) and on a NeuronCore,
    each in the python kernel_python picks and with its own NEFF caches (kernel_caches); the check itself
    takes the device of that python's line."""
    user_target = os.environ.get(PLATFORM_TARGET_ENV, "").strip()

    def step(where: str) -> Step:
        def command(run: Run) -> list[str]:
            return [str(kernel_python(run, where)[0]), "-m", "siglip_serve", "kernels", "check", "--kernels-on", where,
                    "--json", f"kernels-{where}.json"]

        def skip(run: Run) -> str | None:
            python, reason = kernel_python(run, where)
            return None if python else reason

        title = (f"NKI kernels against the references (simulator, target {user_target or KERNEL_TARGET})"
                 if where == "simulator" else "NKI kernels against the references (NeuronCore, the line found)")
        env = {PLATFORM_TARGET_ENV: KERNEL_TARGET} if where == "simulator" and not user_target else {}
        return Step(f"kernels-{where}", title, command, 900 * timeout_scale, skip_if=skip, env=env,
                    env_for=lambda run: kernel_caches(run.out, where), outputs=(f"kernels-{where}.json",))

    return [step("simulator"), step("neuron")]
