"""`siglip-serve trn2-check --out DIR`: the first command to run on a fresh trn2.

Each step is a subprocess with a timeout, its output in DIR/logs/: the versions and LNC this Python
sees (siglip_serve.launcher.trn2_probes), `neuron-ls`, then for each installed Neuron line (trace: torch-neuronx 2.9;
native: TorchNeuron) compile tiny-siglip, compare it with the CPU, serve it and embed a photo, run the
multi-core bench and the instance-throughput report, then the NKI kernels' check on the simulator and on
a NeuronCore, in the venv of the line found (siglip_serve.launcher.trn2_steps). A step whose line or input is missing is
skipped with the reason; a failed step fails the steps that need it as skipped, not the run.
DIR/summary.md and DIR/summary.json say what passed, failed or was skipped, and what to send back.

    siglip-serve trn2-check --out trn2-check
    siglip-serve trn2-check --out trn2-check --python /opt/aws_neuronx_venv_torch_neuronx_2_14_0/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from siglip_serve.core.errors import UserError
from siglip_serve.core.sample_photos import photo_jpeg
from siglip_serve.launcher import trn2_report
from siglip_serve.launcher.trn2_steps import (
    KERNEL_CACHES_DIR,
    Run,
    Step,
    StepResult,
    count_cores,
    kernel_steps,
    line_steps,
    read_versions,
)

NEURON_LS = "/opt/aws/neuron/bin/neuron-ls"
HEARTBEAT_S = 30.0


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
    began, started_at = time.monotonic(), time.time()
    with open(log, "w") as err, open(stdout, "w") as out:
        err.write("".join(f"# {k}={v}\n" for k, v in sorted(extra.items())) + f"$ {' '.join(command)}\n")
        err.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **extra}, cwd=run.out,
                                start_new_session=True)
        status, code = _wait(proc, step.timeout_s, began, echo)
    finished_at = time.time()
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
    return StepResult(step.name, step.title, status, seconds, code, reason, str(log.relative_to(run.out)), outputs,
                      started_at, finished_at)


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

def plan(run: Run, timeout_scale: float = 1.0, iterations: int = 100) -> list[Step]:
    def versions_command(python: str, i: int) -> Callable[[Run], list[str]]:
        return lambda run: [python, "-m", "siglip_serve.launcher.trn2_probes", "versions",
                            "versions.json" if i == 0 else f"versions-{i + 1}.json"]

    steps = [Step("versions" if i == 0 else f"versions-{i + 1}", f"versions and LNC ({python})",
                  versions_command(python, i),
                  120 * timeout_scale, outputs=("versions.json" if i == 0 else f"versions-{i + 1}.json",),
                  after=read_versions("versions" if i == 0 else f"versions-{i + 1}"))
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
                   skip_if=no_tools, outputs=("neuron-ls.json",), after=count_cores)]
    return (steps + line_steps("trace", timeout_scale, iterations) + line_steps("native", timeout_scale, iterations)
            + kernel_steps(timeout_scale))


# -- the summary ------------------------------------------------------------------------------

def send_back(out: Path) -> list[str]:
    """Every file but the compiled artifacts and the kernel steps' NEFF caches (large, rebuilt by any
    compile) and the test photos."""
    top = lambda p: p.relative_to(out).parts[0]  # noqa: E731
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and top(p) not in ("images", KERNEL_CACHES_DIR) and not top(p).startswith("artifacts"))


def write_summary(run: Run, started: str) -> dict[str, Any]:
    results = list(run.results.values())
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "timeout", "skipped")}
    summary = {"started": started, "finished": datetime.now(UTC).isoformat(timespec="seconds"),
               "out": str(run.out.resolve()), "lnc": run.lnc, "logical_cores": run.cores,
               "lines": run.lines, "counts": counts, "ok": counts["failed"] == 0 and counts["timeout"] == 0,
               "steps": [r.__dict__ for r in results]}
    windows = {r.name: (r.started_at, r.finished_at) for r in results
               if r.started_at is not None and r.finished_at is not None}
    found = trn2_report.report(run.out, {r.name: r.status for r in results}, windows)
    summary["found"] = {k: found[k] for k in ("cosines", "warm_starts", "hardware_answers", "neuron_sdks")}
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
           f"--exclude={KERNEL_CACHES_DIR} --exclude=images -C {run.out.resolve().parent} "
           f"{run.out.resolve().name}`. It holds:", ""]
    md += [f"- `{f}`" for f in files]
    (run.out / "summary.md").write_text("\n".join(md) + "\n")
    return summary


def write_images(folder: Path) -> None:
    """Real photos (the sample photos the tests use too) for the accuracy step."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        (folder / f"{name}.jpg").write_bytes(photo_jpeg(name))


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
