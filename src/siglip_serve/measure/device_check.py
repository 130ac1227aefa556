"""`siglip-serve device-check --out DIR` (tools/device_check.sh): every accelerator figure in one bounded run.

In order, each step a subprocess bounded by its timeout and by the run's budget (measure/device_steps.py),
a failed step recorded with its error and the next one still run:
  install         carried wheels (--wheels; parts joined, measure/device_wheels.py) and this checkout,
                  offline: pip --no-index --no-deps
  probe           interpreter, cores, torch and its accelerator, every module the served path imports
  pytest-cuda     pytest -m cuda tests/device
  encoder         bare encoder per bucket (`siglip-serve bench`), CUDA graphs off
  encoder-graphs  the same with CUDA graphs on (the served default)
  served          served img/s, p50/p99, host CPU-ms per image, the client's CPU: the defaults (ingress
                  replicas auto), --client-processes client processes (auto: bench's rule)
  served-ingress-1  the same with one ingress replica
  served-nvjpeg   the same with nvJPEG decode in the encoder replica (device_jpeg_decode)
  host-ceiling    the served path with no model (zeros-no-model), the served step's replica counts
  verdict         host-, device- or client-bound (measure/bound.py), from the steps above
  ratio           served / bare: the best served img/s over the encoder's best bucket
DIR/summary.json lists every step's status, error, seconds and figures; DIR/summary.md is the table.
The defaults are the GPU run (ViT-B-16-SigLIP, random weights: no hub there); `--backend cpu --model
tiny-siglip` is its CPU rehearsal (tests/integration/test_device_check_rehearsal.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from siglip_serve.measure.device_steps import Step, StepResult, run_step
from siglip_serve.measure.device_wheels import assemble

ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/siglip_serve/measure/ is three below it
MODEL = "ViT-B-16-SigLIP"
BUDGET_S = 480.0
COLUMNS = ("step", "status", "seconds", "img/s", "p50 ms", "p99 ms", "CPU-ms/img", "client CPU", "detail")


def read(out: Path, name: str) -> dict[str, Any]:
    data = json.loads((out / name).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{name} holds no JSON object")
    return data


def encoder_figures(name: str) -> Any:
    def after(out: Path) -> dict[str, Any] | str:
        rows = read(out, name).get("encoder") or []
        if not rows:
            return f"{name} has no encoder rows"
        best = max(rows, key=lambda r: r["images_per_second"])
        return {"images_per_second": best["images_per_second"], "latency_p50_ms": best["latency_p50_ms"],
                "latency_p99_ms": best["latency_p99_ms"], "best_bucket": best["bucket"],
                "by_bucket": {str(r["bucket"]): round(r["images_per_second"], 1) for r in rows}}
    return after


def served_figures(name: str) -> Any:
    """The best img/s over the levels; latency and server CPU at the highest concurrency (the loaded one)."""
    def after(out: Path) -> dict[str, Any] | str:
        data = read(out, name)
        rows = data.get("served") or []
        if not rows or max(r["images_per_second"] for r in rows) <= 0:
            return f"{name}: no request was answered ({sum(r['failures'] for r in rows)} failed)"
        loaded = max(rows, key=lambda r: r["concurrency"])
        cpu = loaded.get("server_cpu") or {}
        client = loaded.get("client_cpu") or {}
        return {"images_per_second": max(r["images_per_second"] for r in rows),
                "latency_p50_ms": loaded["latency_p50_ms"], "latency_p99_ms": loaded["latency_p99_ms"],
                "cpu_ms_per_image": cpu.get("ms_per_image"), "concurrency": loaded["concurrency"],
                "failures": sum(r["failures"] for r in rows), "replicas": data.get("replicas"),
                "ingress_replicas": data.get("ingress_replicas"),
                "client_processes": client.get("client_processes"),
                "client_busiest_core_fraction": client.get("busiest_process_core_fraction"),
                "by_concurrency": {str(r["concurrency"]): round(r["images_per_second"], 1) for r in rows}}
    return after


def pytest_figures(must_pass: bool) -> Any:
    def after(out: Path) -> dict[str, Any] | str:
        import xml.etree.ElementTree as ET

        suites = ET.parse(out / "pytest-cuda.xml").getroot()
        suite = suites if suites.tag == "testsuite" else suites[0]
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        if must_pass and counts["passed"] == 0:
            return f"no cuda test ran ({counts['skipped']} skipped): this interpreter's torch sees no GPU"
        return counts
    return after


def probe_figures(out: Path) -> dict[str, Any]:
    info = read(out, "probe.json")
    return {k: info.get(k) for k in ("python", "cpus", "usable_cpus", "cuda_available", "gpu", "gpu_memory_gib")} | {
        "torch": info["modules"].get("torch")}


def plan(args: argparse.Namespace) -> list[Step]:
    from siglip_serve.core.backends import BUILTIN, NO_MODEL_BACKEND

    record = {r.name: r for r in BUILTIN}[args.backend]
    py = sys.executable
    scale = args.timeout_scale
    bench = [py, "-m", "siglip_serve", "bench", "--model", args.model, "--backend", args.backend,
             *(["--buckets", args.buckets] if args.buckets else [])]
    weights = [] if args.model.startswith("tiny-") else ["--random-weights"]
    timed = ["--warmup", str(args.warmup), "--iterations", str(args.iterations)]
    levels = ["--concurrency", args.concurrency, "--requests", str(args.requests),
              "--client-processes", args.client_processes]
    only_served = ["--skip", "encoder,preprocess,host-ceiling"]
    folders = wheel_folders(args.wheels)
    carried = ", ".join(f.name for f in folders if f.is_dir())

    def ceiling(out: Path) -> list[str]:
        """The same deployment with the model taken out (bench's host ceiling): the served step's counts."""
        counts: list[str] = []
        if (out / "served.json").exists():
            served = read(out, "served.json")
            if served.get("replicas"):
                counts += ["--replicas", str(served["replicas"])]
            if served.get("ingress_replicas"):
                counts += ["--set", f"ingress_replicas={served['ingress_replicas']}"]
        top = str(max(int(c) for c in args.concurrency.split(",") if c.strip()))
        return [py, "-m", "siglip_serve", "bench", "--model", args.model, "--backend", NO_MODEL_BACKEND,
                "--skip", "encoder,preprocess,host-ceiling", "--concurrency", top, "--requests", str(args.requests),
                "--client-processes", args.client_processes, "--set", "text_replicas=0", *counts,
                "--json", "host-ceiling.json"]

    return [
        Step("install", f"install: the wheels carried in {carried or 'no folder'} and this checkout, offline",
             lambda out: install_command(py, folders), 120 * scale,
             skip_if=lambda: None if (ROOT / "pyproject.toml").exists() else f"{ROOT} is no checkout"),
        Step("probe", "probe: interpreter, cores, torch, accelerator, modules",
             lambda out: [py, "-m", "siglip_serve.measure.device_probe", "probe.json"], 90 * scale,
             after=probe_figures),
        Step("pytest-cuda", "pytest -m cuda tests/device",
             lambda out: [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "--junitxml",
                          str(out / "pytest-cuda.xml"), str(ROOT / "tests" / "device")], 120 * scale,
             after=pytest_figures(record.device == "cuda")),
        Step("encoder", f"bare encoder per bucket, {args.model} on {args.backend}, CUDA graphs off",
             lambda out: [*bench, *weights, *timed, "--skip", "preprocess,served", "--set", "cuda_graphs=false",
                          "--json", "encoder.json"], 90 * scale, after=encoder_figures("encoder.json")),
        Step("encoder-graphs", "the same, CUDA graphs on",
             lambda out: [*bench, *weights, *timed, "--skip", "preprocess,served", "--set",
                          f"{record.graphs_setting}=true", "--json", "encoder-graphs.json"], 90 * scale,
             after=encoder_figures("encoder-graphs.json"),
             skip_if=lambda: None if record.graphs_setting else f"backend {args.backend} has no CUDA graphs"),
        Step("served", "served, the defaults (ingress replicas auto, host decode)",
             lambda out: [*bench, *weights, *levels, *only_served, "--json", "served.json"], 120 * scale,
             after=served_figures("served.json")),
        Step("served-ingress-1", "served, one ingress replica",
             lambda out: [*bench, *weights, *levels, *only_served, "--set", "ingress_replicas=1",
                          "--json", "served-ingress-1.json"], 120 * scale,
             after=served_figures("served-ingress-1.json")),
        Step("served-nvjpeg", "served, nvJPEG decode in the encoder replica",
             lambda out: [*bench, *weights, *levels, *only_served, "--set", "device_jpeg_decode=true",
                          "--json", "served-nvjpeg.json"], 120 * scale, after=served_figures("served-nvjpeg.json"),
             skip_if=lambda: None if record.device_decode else f"backend {args.backend} decodes on the host only"),
        Step("host-ceiling", f"host ceiling: the served path with no model ({NO_MODEL_BACKEND})", ceiling,
             90 * scale, after=served_figures("host-ceiling.json")),
    ]


def wheel_folders(given: list[str] | None) -> list[Path]:
    """--wheels as given, else the checkout's .whl and every .whl-N (tools/device_wheels.sh's carry folders)."""
    return [Path(g) for g in given] if given else [ROOT / ".whl", *sorted(ROOT.glob(".whl-[0-9]*"))]


def install_command(py: str, folders: list[Path]) -> list[str]:
    """pip, offline and without resolving, over the carried wheels (parts joined: measure/device_wheels.py)
    and this checkout (editable, so the `siglip-serve-haproxy` script lands beside the interpreter)."""
    wheels = assemble(folders, Path(tempfile.gettempdir()) / "siglip-device-wheels")
    return [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "--no-compile",
            *map(str, wheels), "-e", str(ROOT)]


def why(result: StepResult | None) -> str:
    """A step that did not pass: its status and error, as the verdict names what it lacked."""
    if result is None:
        return "not run"
    return f"{result.status}: {result.error}" if result.error else result.status


def derived(results: dict[str, StepResult], on_host_cores: bool) -> list[StepResult]:
    """The verdict and served / bare, from the steps' figures (skipped, saying which is missing)."""
    def figure(name: str) -> float | None:
        result = results.get(name)
        return result.figures.get("images_per_second") if result and result.status == "passed" else None

    bare, served, host = figure("encoder"), figure("served"), figure("host-ceiling")
    missing = [n for n, v in (("encoder", bare), ("served", served), ("host-ceiling", host)) if v is None]
    verdict = StepResult("verdict", "host-, device- or client-bound (measure/bound.py)", "skipped")
    if missing:
        verdict.error = "needs " + ", ".join(f"{n} ({why(results.get(n))})" for n in missing)
    elif bare is not None and served is not None and host is not None:
        try:
            from siglip_serve.measure.bound import judge

            # Each replica has a device of its own on an accelerator; on cpu they share the one host (as bench).
            replicas = results["served"].figures.get("replicas") or 1
            busiest = [f for n in ("served", "host-ceiling")
                       if (f := results[n].figures.get("client_busiest_core_fraction")) is not None]
            bound = judge(host, bare * (1 if on_host_cores else replicas), served, max(busiest, default=None))
            verdict.status, verdict.figures = "passed", bound.model_dump()
            verdict.figures["detail"] = f"{bound.verdict}: {bound.explanation}"
        except (ImportError, ValueError) as exc:
            verdict.status, verdict.error = "failed", f"{type(exc).__name__}: {exc}"
    ratio = StepResult("ratio", "served / bare (best served img/s over the best bucket's)", "skipped")
    if bare is None or served is None:
        ratio.error = "needs encoder and served, which did not both pass"
    else:
        ratio.status = "passed"
        ratio.figures = {"served_over_bare": served / bare,
                         "detail": f"{served:.1f} / {bare:.1f} = {served / bare:.3f}"}
    return [verdict, ratio]


def cell(value: Any) -> str:
    return "" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def client_cell(figures: dict[str, Any]) -> str:
    """A served step's client at its top level: its processes and the busiest one's share of a core."""
    processes, busiest = figures.get("client_processes"), figures.get("client_busiest_core_fraction")
    if processes is None or busiest is None:
        return ""
    return f"{processes} proc, busiest {busiest:.2f} core"


def table(results: list[StepResult]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        f = r.figures
        detail = r.error or f.get("detail") or "; ".join(
            f"{k} {v}" for k, v in f.items() if k in ("by_bucket", "by_concurrency", "replicas", "ingress_replicas",
                                                      "failures", "gpu", "torch", "usable_cpus", "passed", "skipped"))
        row = [r.name, r.status.upper(), f"{r.seconds:.1f}", cell(f.get("images_per_second")),
               cell(f.get("latency_p50_ms")), cell(f.get("latency_p99_ms")), cell(f.get("cpu_ms_per_image")),
               client_cell(f), str(detail).replace("|", "/").replace("\n", " ")]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def check(args: argparse.Namespace, echo: Any = print) -> dict[str, Any]:
    from siglip_serve.core.backends import BUILTIN

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, began = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    deadline = began + args.budget_s
    skip = frozenset(s.strip() for s in args.skip.split(",") if s.strip())
    results: dict[str, StepResult] = {}
    for step in plan(args):
        results[step.name] = run_step(step, out, deadline, skip, {"PYTHONUNBUFFERED": "1"}, echo)
    on_host_cores = {r.name: r for r in BUILTIN}[args.backend].host_cores
    for result in derived(results, on_host_cores):
        results[result.name] = result
        echo(f"- {result.title}: {result.status}" + (f" ({result.error})" if result.error else ""))
    steps = list(results.values())
    counts = {s: sum(r.status == s for r in steps) for s in ("passed", "failed", "timeout", "skipped")}
    summary = {"started": started, "seconds": round(time.monotonic() - began, 1), "budget_s": args.budget_s,
               "backend": args.backend, "model": args.model, "counts": counts,
               "ok": counts["failed"] == 0 and counts["timeout"] == 0, "steps": [r.__dict__ for r in steps]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = [f"# device-check: {args.model} on {args.backend}", "",
          f"{counts['passed']} passed, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} skipped in {summary['seconds']:.0f} s (budget {args.budget_s:.0f} s).", "",
          *table(steps)]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    echo("\n" + "\n".join(md))
    if args.bundle:
        bundle(out, Path(args.bundle))
    return summary


def bundle(out: Path, dest: Path) -> None:
    """summary.json, summary.md and one archive of the whole folder: three files, for a machine that
    sends back only a few."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "summary.md"):
        shutil.copy(out / name, dest / name)
    with tarfile.open(dest / "device-check.tgz", "w:gz") as tar:
        tar.add(out, arcname="device-check")


def client_processes(text: str) -> str:
    """bench's `--client-processes`, checked here so that a typo fails before the first step, not in each."""
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"auto or a count of at least 1, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve device-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for every result, log and the summary")
    parser.add_argument("--bundle", help="also copy summary.json, summary.md and device-check.tgz (the whole "
                                         "folder) here")
    parser.add_argument("--backend", default="cuda", help="cuda (default) or cpu (the rehearsal)")
    parser.add_argument("--model", default=MODEL, help=f"open_clip model (default {MODEL}, random weights)")
    parser.add_argument("--buckets", help="encoder batch buckets, e.g. 1,8,32 (default: the model settings')")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per bucket")
    parser.add_argument("--concurrency", default="1,32", help="served client concurrency levels")
    parser.add_argument("--requests", type=int, default=500, help="served requests per concurrency level")
    parser.add_argument("--client-processes", default="auto", type=client_processes,
                        help="the served steps' and the host ceiling's client processes, passed to bench (auto: 1 "
                             "on up to 4 usable CPUs, else one per 4, at most 8)")
    parser.add_argument("--wheels", action="append", help="a folder of carried wheels or wheel parts, installed "
                        "first (offline); repeat for each (default: the checkout's .whl and every .whl-N)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's seconds, install included")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's timeout")
    parser.add_argument("--skip", default="", help="comma list of step names to skip, e.g. install,pytest-cuda")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from siglip_serve.core.backends import BACKENDS

    if args.backend not in BACKENDS:
        print(f"error: --backend {args.backend!r}: one of {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    return 0 if check(args)["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
