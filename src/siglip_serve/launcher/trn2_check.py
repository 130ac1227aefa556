"""`siglip-serve trn2-check --out DIR`: the first command to run on a fresh trn2.

Each step is a subprocess with a timeout, its output in DIR/logs/: the versions and LNC this Python
sees (siglip_serve.launcher.trn2_probes), `neuron-ls`, then for each installed Neuron line (trace: torch-neuronx 2.9;
native: TorchNeuron) compile tiny-siglip, compare it with the CPU, serve it and embed a photo, run the
multi-core bench and the instance-throughput report. A step whose line or input is missing is
skipped with the reason; a failed step fails the steps that need it as skipped, not the run.
DIR/summary.md and DIR/summary.json say what passed, failed or was skipped, and what to send back.

    siglip-serve trn2-check --out trn2-check
    siglip-serve trn2-check --out trn2-check --python /opt/aws_neuronx_venv_torch_neuronx_2_14_0/bin/python
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from siglip_serve.core.errors import UserError
from siglip_serve.launcher import trn2_report
from siglip_serve.models.neuron.env import VISIBLE_CORES_ENV, artifact_environment

MODEL = "tiny-siglip"
NEURON_LS = "/opt/aws/neuron/bin/neuron-ls"
HEARTBEAT_S = 30.0
BACKEND_OF_LINE = {"trace": "neuron", "native": "neuron-native"}


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
    artifacts: dict[str, str] = field(default_factory=dict)  # line -> compiled artifact directory
    results: dict[str, StepResult] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()


def run_step(step: Step, run: Run, index: int, total: int, echo: Callable[[str], None] = print) -> StepResult:
    """Run one step (or skip it, saying why), with its timeout; output to DIR/logs/<name>.log."""
    missing = [n for n in step.needs if run.results.get(n) is None or run.results[n].status != "passed"]
    reason = ("skipped by --skip" if step.name in run.skip else
              f"needs {missing[0]}, which {_what_happened(run.results.get(missing[0]))}" if missing else
              step.skip_if(run))
    if reason:
        echo(f"[{index}/{total}] {step.title}: skipped ({reason})")
        return StepResult(step.name, step.title, "skipped", reason=reason)
    logs = run.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log, stdout = logs / f"{step.name}.log", logs / f"{step.name}.stdout"
    command = step.command(run)
    try:
        extra = {**step.env, **step.env_for(run)}
    except UserError as exc:
        echo(f"[{index}/{total}] {step.title}: failed ({exc})")
        return StepResult(step.name, step.title, "failed", reason=str(exc))
    echo(f"[{index}/{total}] {step.title} (timeout {step.timeout_s:.0f} s; log {log.relative_to(run.out)})")
    began = time.monotonic()
    with open(log, "w") as err, open(stdout, "w") as out:
        err.write("".join(f"# {k}={v}\n" for k, v in sorted(extra.items())) + f"$ {' '.join(command)}\n")
        err.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **extra}, cwd=run.out,
                                start_new_session=True)
        status, code = _wait(proc, step.timeout_s, began, echo)
    seconds = round(time.monotonic() - began, 1)
    reason = None
    if status == "timeout":
        reason = f"no result within {step.timeout_s:.0f} s; stopped"
    elif code != 0:
        status, reason = "failed", f"exit code {code}: {_tail(log)}"
    else:
        reason = step.after(run, stdout)
        status = "failed" if reason else "passed"
    outputs = [o for o in step.outputs if (run.out / o).exists()]
    echo(f"    {status} in {seconds:.1f} s" + (f": {reason}" if reason else ""))
    return StepResult(step.name, step.title, status, seconds, code, reason, str(log.relative_to(run.out)), outputs)


def _wait(proc: subprocess.Popen, timeout_s: float, began: float,
          echo: Callable[[str], None]) -> tuple[str, int | None]:
    next_beat = began + HEARTBEAT_S
    while True:
        try:
            until = min(began + timeout_s, next_beat)
            return "done", proc.wait(timeout=max(0.05, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if now - began >= timeout_s:
                os.killpg(proc.pid, 15)  # the step's own session: the step and what it started
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                return "timeout", None
            if now >= next_beat:
                echo(f"    ... still running ({now - began:.0f} s)")
                next_beat += HEARTBEAT_S


def _what_happened(result: StepResult | None) -> str:
    return "did not run" if result is None else {"skipped": "was skipped", "timeout": "timed out"}.get(
        result.status, "failed")


def _tail(log: Path, lines: int = 3) -> str:
    text = [line for line in log.read_text(errors="replace").splitlines()[1:] if line.strip()]
    return " | ".join(text[-lines:])[-400:] or "(no output)"


# -- the steps --------------------------------------------------------------------------------

def _read_versions(name: str) -> Callable[[Run, Path], str | None]:
    def after(run: Run, _stdout: Path) -> str | None:
        info = json.loads((run.out / f"{name}.json").read_text())
        if info.get("line") and info["line"] not in run.lines:
            run.lines[info["line"]] = info["executable"]
        if run.lnc is None and info.get("lnc"):
            run.lnc = int(info["lnc"])
        return info.get("lnc_error")
    return after


def _count_cores(run: Run, _stdout: Path) -> str | None:
    try:
        devices = json.loads((run.out / "neuron-ls.json").read_text())
        run.cores = sum(int(d.get("nc_count", 0)) for d in devices) or None
    except (ValueError, TypeError, AttributeError) as exc:
        return f"neuron-ls --json-output is not the expected list of devices ({exc})"
    return None


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
        Step(f"serve-{line}", f"serve it and embed a photo ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve.launcher.trn2_probes", "serve", f"serve-{line}.json",
                          "--backend", backend, "--artifact-dir", run.artifacts[line],
                          "--ready-timeout", str(900 * timeout_scale)],
             1200 * timeout_scale, needs=(f"compile-{line}",), outputs=(f"serve-{line}.json",)),
        Step(f"multicore-{line}", f"multi-core bench, one worker per logical core ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve.measure.multicore", "--backend", backend, "--model", MODEL,
                          "--artifact-dir", run.artifacts[line], "--cores", str(run.cores or 8 // (run.lnc or 2)),
                          "--bucket", "1", "--warmup", "5", "--iterations", str(iterations),
                          "--json", f"multicore-{line}.json"],
             1800 * timeout_scale, needs=(f"compile-{line}",), outputs=(f"multicore-{line}.json",)),
        Step(f"report-{line}", f"instance-throughput report ({line} line)",
             lambda run: [py(run), "-m", "siglip_serve", "loadtest", "report", "--multicore-json",
                          f"multicore-{line}.json", *(["--lnc", str(run.lnc)] if run.lnc else []),
                          "--out", f"report-{line}"],
             300 * timeout_scale, needs=(f"multicore-{line}",), outputs=(f"report-{line}/report.md",)),
    ]


def plan(run: Run, timeout_scale: float = 1.0, iterations: int = 100) -> list[Step]:
    def versions_command(python: str, i: int) -> Callable[[Run], list[str]]:
        return lambda run: [python, "-m", "siglip_serve.launcher.trn2_probes", "versions",
                            "versions.json" if i == 0 else f"versions-{i + 1}.json"]

    steps = [Step("versions" if i == 0 else f"versions-{i + 1}", f"versions and LNC ({python})",
                  versions_command(python, i),
                  120 * timeout_scale, outputs=("versions.json" if i == 0 else f"versions-{i + 1}.json",),
                  after=_read_versions("versions" if i == 0 else f"versions-{i + 1}"))
             for i, python in enumerate(run.pythons)]
    def freeze(python: str, i: int) -> Callable[[Run], list[str]]:
        return lambda run: ["sh", "-c", f"'{python}' -m pip freeze --all > pip-freeze-{i + 1}.txt"]

    steps += [Step(f"pip-freeze-{i + 1}", f"pip freeze ({python})", freeze(python, i), 120 * timeout_scale,
                   outputs=(f"pip-freeze-{i + 1}.txt",)) for i, python in enumerate(run.pythons)]
    no_tools = lambda run: None if os.path.exists(NEURON_LS) or shutil.which("neuron-ls") else (  # noqa: E731
        "neuron-ls is not installed (no Neuron tools: not a Neuron DLAMI)")
    neuron_ls = lambda: shutil.which("neuron-ls") or NEURON_LS  # noqa: E731
    steps += [Step("neuron-ls", "neuron-ls", lambda run: [neuron_ls()], 60 * timeout_scale, skip_if=no_tools),
              Step("neuron-ls-json", "neuron-ls --json-output",
                   lambda run: ["sh", "-c", f"'{neuron_ls()}' --json-output > neuron-ls.json"], 60 * timeout_scale,
                   skip_if=no_tools, outputs=("neuron-ls.json",), after=_count_cores)]
    no_nki = lambda run: None if importlib.util.find_spec("nki") else (  # noqa: E731
        f"nki is not installed for {sys.executable} (docs/kernels.md)")
    def kernels_check(where: str) -> Callable[[Run], list[str]]:
        return lambda run: [sys.executable, "-m", "siglip_serve", "kernels", "check", "--kernels-on", where]

    kernels = [Step(f"kernels-{where}", f"NKI kernels against the references ({where})", kernels_check(where),
                    900 * timeout_scale, skip_if=no_nki) for where in ("simulator", "neuron")]
    return (steps + line_steps("trace", timeout_scale, iterations) + line_steps("native", timeout_scale, iterations)
            + kernels)


# -- the summary ------------------------------------------------------------------------------

def send_back(out: Path) -> list[str]:
    """Every file but the compiled artifacts (large, rebuilt by any compile) and the test photos."""
    top = lambda p: p.relative_to(out).parts[0]  # noqa: E731
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and top(p) != "images" and not top(p).startswith("artifacts"))


def write_summary(run: Run, started: str) -> dict[str, Any]:
    results = list(run.results.values())
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "timeout", "skipped")}
    summary = {"started": started, "finished": datetime.now(UTC).isoformat(timespec="seconds"),
               "out": str(run.out.resolve()), "lnc": run.lnc, "logical_cores": run.cores,
               "lines": run.lines, "counts": counts, "ok": counts["failed"] == 0 and counts["timeout"] == 0,
               "steps": [r.__dict__ for r in results]}
    found = trn2_report.report(run.out, {r.name: r.status for r in results})
    summary["found"] = {k: found[k] for k in ("cosines", "warm_starts", "hardware_answers")}
    (run.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    files = sorted({*send_back(run.out), "summary.md"})
    md = ["# trn2-check", "", f"{counts['passed']} passed, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} skipped. LNC {run.lnc}, logical cores {run.cores}, lines installed: "
          f"{', '.join(sorted(run.lines)) or 'none'}.", "",
          "| step | status | seconds | detail | files |", "|---|---|---|---|---|"]
    for r in results:
        detail = (r.reason or "").replace("|", "/")
        md.append(f"| {r.title} | {r.status.upper()} | {r.seconds:.1f} | {detail} | "
                  f"{', '.join(f'`{f}`' for f in ([r.log] if r.log else []) + r.outputs)} |")
    md += trn2_report.markdown(found)
    md += ["", "## What to send back", "",
           f"The whole folder without the compiled artifacts: `tar czf trn2-check.tgz --exclude='artifacts*' "
           f"--exclude=images -C {run.out.resolve().parent} {run.out.resolve().name}`. It holds:", ""]
    md += [f"- `{f}`" for f in files]
    (run.out / "summary.md").write_text("\n".join(md) + "\n")
    return summary


def write_images(folder: Path) -> None:
    """Real photos (scikit-image's samples, as the tests use) for the accuracy step."""
    from PIL import Image
    from skimage import data

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        Image.fromarray(getattr(data, name)()).save(folder / f"{name}.jpg", quality=90)


def check(out: Path, pythons: Sequence[str], skip: Sequence[str] = (), cores: int | None = None,
          timeout_scale: float = 1.0, iterations: int = 100, echo: Callable[[str], None] = print) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    write_images(out / "images")
    run = Run(out, list(pythons), cores=cores, skip=frozenset(skip))
    steps = plan(run, timeout_scale, iterations)
    for i, step in enumerate(steps, start=1):
        run.results[step.name] = run_step(step, run, i, len(steps), echo)
        if step.name == "neuron-ls-json" and cores is not None:
            run.cores = cores  # --cores wins over what neuron-ls counted
    return write_summary(run, started)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve trn2-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for every result, log and the summary")
    parser.add_argument("--python", action="append", default=[], metavar="PYTHON",
                        help="also check the Neuron line installed for this interpreter (e.g. the other DLAMI "
                             "venv's bin/python), which must have this project installed too (refused otherwise); "
                             "repeatable. This interpreter is always checked")
    parser.add_argument("--skip", default="", help="comma list of step names to skip, e.g. serve-trace")
    parser.add_argument("--cores", type=int, help="workers for the multi-core bench (default: neuron-ls's count)")
    parser.add_argument("--iterations", type=int, default=100, help="timed calls per multi-core bench worker")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's timeout")
    return parser


def check_pythons(pythons: Sequence[str]) -> None:
    """Each --python runs this project's probes and commands, so the project must be installed there."""
    for python in pythons:
        try:
            found = subprocess.run([python, "-c", "import siglip_serve.launcher.trn2_probes"], capture_output=True,
                                   timeout=120).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            found = False
        if not found:
            raise UserError(f"--python {python}: siglip-serve is not importable there; install this checkout into "
                            f"that venv first ({python} -m pip install -e . with its constraints, docs/trn2.md)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pythons = [sys.executable] + [p for p in args.python if p != sys.executable]
    try:
        check_pythons(pythons[1:])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = check(args.out, pythons, [s.strip() for s in args.skip.split(",") if s.strip()], args.cores,
                    args.timeout_scale, args.iterations)
    c = summary["counts"]
    print(f"\n{c['passed']} passed, {c['failed']} failed, {c['timeout']} timed out, {c['skipped']} skipped; "
          f"summary: {args.out / 'summary.md'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
