"""`siglip-serve device-check --out DIR` (tools/device_check.sh): every accelerator figure in one bounded run.

In order, each step a subprocess bounded by its timeout and by the run's budget (measure/device_steps.py),
a failed step recorded with its error and the next one still run:
  install             carried wheels (--wheels; parts joined, measure/device_wheels.py) and this checkout,
                      offline: pip --no-index --no-deps
  probe               interpreter, cores, torch and its accelerators, every module the served path imports
  pytest-cuda         pytest -m cuda tests/device
  encoder             bare encoder per bucket (`siglip-serve bench`), CUDA graphs off; --buckets (cuda: 1,8,16,32)
  encoder-graphs      the same with CUDA graphs on (the served default)
  served              served img/s, p50/p99, host CPU-ms per image, the client's CPU: the defaults (the model's
                      buckets, ingress replicas auto), --client-processes client processes (auto: bench's rule)
  host-ceiling        the served path with no model (zeros-no-model), the served step's replica counts
  served-nvjpeg       served with nvJPEG decode in the encoder replica (device_jpeg_decode), CUDA graphs on
  served-best-bucket  served with the buckets up to the best one of the served default's encoder step
                      (encoder-graphs where the backend captures graphs, else encoder)
  lanes               measure/lanes_service.py: a `siglip-serve run` of two tenants it starts, and lanes_bench's
                      windows: interactive c=2 beside a backfill of the served step's best concurrency and client
                      processes, and a small tenant beside a large one
  lanes-interactive-encoder  the interactive windows again with `interactive_encoder` (two image replicas, one
                      kept for the interactive lane); skipped where the probe found fewer than 2 GPUs on cuda
  served-ingress-1    served with one ingress replica
  verdict             host-, device- or client-bound (measure/bound.py), from the steps above
  ratio               served / bare: the best served img/s over the encoder's best bucket
  price               with --price-per-hour or --instance (measure/prices.py): $ per 1M images of every served
                      step, and of the served default's bare encoder for the whole instance (its accelerators,
                      capped at the host ceiling)
DIR/summary.json lists every step's status, error, seconds and figures; DIR/summary.md is the table.
The defaults are the GPU run (ViT-B-16-SigLIP, random weights: no hub there); `--backend cpu --model
tiny-siglip` is its CPU rehearsal (tests/integration/test_device_check_rehearsal.py). The figures and the
table: measure/device_figures.py.
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

from siglip_serve.measure.device_figures import (
    best_encoder_row,
    derived,
    determinism_figures,
    encoder_figures,
    lanes_figures,
    priced,
    probe_figures,
    pytest_figures,
    read,
    served_encoder,
    served_figures,
    table,
)
from siglip_serve.measure.device_steps import Step, StepResult, run_step
from siglip_serve.measure.device_wheels import assemble
from siglip_serve.measure.prices import PriceError, add_price_arguments, price_from_args

ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/siglip_serve/measure/ is three below it
MODEL = "ViT-B-16-SigLIP"
BUDGET_S = 480.0
# The bare encoder's buckets on a GPU, where the model's default (up to 8) stops short of what a GPU batches best.
GPU_BUCKETS = "1,8,16,32"
# The steps computed from the others' figures, after them.
DERIVED = ("verdict", "ratio", "price")
# The interactive lane's windows (measure/lanes_bench.py): what `interactive_encoder` changes.
INTERACTIVE_WINDOWS = "interactive-alone,bulk-alone,mixed"


def plan(args: argparse.Namespace) -> list[Step]:
    from siglip_serve.core.backends import BUILTIN, NO_MODEL_BACKEND

    record = {r.name: r for r in BUILTIN}[args.backend]
    py = sys.executable
    scale = args.timeout_scale
    model = ["--model", args.model, "--backend", args.backend]
    bench = [py, "-m", "siglip_serve", "bench", *model]
    weights = [] if args.model.startswith("tiny-") else ["--random-weights"]
    encoder_buckets = args.buckets or (GPU_BUCKETS if record.device == "cuda" else None)
    timed = ["--warmup", str(args.warmup), "--iterations", str(args.iterations),
             *(["--buckets", encoder_buckets] if encoder_buckets else [])]
    levels = ["--concurrency", args.concurrency, "--requests", str(args.requests),
              "--client-processes", args.client_processes]
    served = [*bench, *weights, *levels, "--skip", "encoder,preprocess,host-ceiling"]
    # The served default captures CUDA graphs where the backend can; said on the command line where a step's
    # figure is read beside one with graphs.
    graphs = ["--set", f"{record.graphs_setting}=true"] if record.graphs_setting else []
    bare = served_encoder(record.graphs_setting)
    folders = wheel_folders(args.wheels)
    carried = ", ".join(f.name for f in folders if f.is_dir())

    def ceiling(out: Path) -> list[str]:
        """The same deployment with the model taken out (bench's host ceiling): the served step's counts."""
        counts: list[str] = []
        if (out / "served.json").exists():
            served_run = read(out, "served.json")
            if served_run.get("replicas"):
                counts += ["--replicas", str(served_run["replicas"])]
            if served_run.get("ingress_replicas"):
                counts += ["--set", f"ingress_replicas={served_run['ingress_replicas']}"]
        return [py, "-m", "siglip_serve", "bench", "--model", args.model, "--backend", NO_MODEL_BACKEND,
                "--skip", "encoder,preprocess,host-ceiling", "--concurrency", str(top_level(args.concurrency)),
                "--requests", str(args.requests), "--client-processes", args.client_processes,
                "--set", "text_replicas=0", *counts, "--json", "host-ceiling.json"]

    def best_bucket(out: Path) -> list[str]:
        """Served with every bucket the bare encoder ran up to its best one (`bare`'s JSON, this run's or a
        run's before into the same --out)."""
        if not (out / f"{bare}.json").exists():
            raise ValueError(f"needs {bare}.json, which the {bare} step writes (run it, or rerun into its --out)")
        best, ran = best_encoder_row(out, f"{bare}.json")
        buckets = ",".join(str(b) for b in ran if b <= best)
        return [*served, "--buckets", buckets, *graphs, "--json", "served-best-bucket.json"]

    def lanes(name: str, interactive_encoder: bool) -> Any:
        def command(out: Path) -> list[str]:
            clients, processes = backfill(out, args)
            return [py, "-m", "siglip_serve.measure.lanes_service", "--json", f"{name}.json", *model, *weights,
                    "--seconds", f"{args.lanes_seconds:g}", "--endpoint", "raw", "--bulk-clients", str(clients),
                    "--large-clients", str(clients), "--client-processes", processes,
                    *(["--interactive-encoder", "--windows", INTERACTIVE_WINDOWS] if interactive_encoder else [])]
        return command

    def two_devices(out: Path) -> str | None:
        """On a GPU each replica holds a whole one, so the kept replica and another need two."""
        if record.device != "cuda" or not (out / "probe.json").exists():
            return None
        found = read(out, "probe.json").get("gpus")
        return None if found is None or found >= 2 else (
            f"interactive_encoder keeps one of two image replicas, each holding a whole GPU; the probe found {found}")

    return [
        Step("install", f"install: the wheels carried in {carried or 'no folder'} and this checkout, offline",
             lambda out: install_command(py, folders), 120 * scale,
             skip_if=lambda out: None if (ROOT / "pyproject.toml").exists() else f"{ROOT} is no checkout"),
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
             lambda out: [*bench, *weights, *timed, "--skip", "preprocess,served", *graphs,
                          "--json", "encoder-graphs.json"], 90 * scale, after=encoder_figures("encoder-graphs.json"),
             skip_if=lambda out: None if record.graphs_setting else f"backend {args.backend} has no CUDA graphs"),
        # Bit-equality needs no load: the model's own buckets and settings, CUDA graphs on as served
        # (docs/reproducibility.md).
        Step("determinism", "determinism: each photo alone against every batch, replica, the cache, bulk, input form",
             lambda out: [py, "-m", "siglip_serve", "determinism", *model, *weights, "--json", "determinism.json"],
             240 * scale, after=determinism_figures),
        Step("served", "served, the defaults (the model's buckets, ingress replicas auto, host decode)",
             lambda out: [*served, "--json", "served.json"], 120 * scale, after=served_figures("served.json")),
        Step("host-ceiling", f"host ceiling: the served path with no model ({NO_MODEL_BACKEND})", ceiling,
             90 * scale, after=served_figures("host-ceiling.json")),
        Step("served-nvjpeg", "served, nvJPEG decode in the encoder replica, CUDA graphs on",
             lambda out: [*served, "--set", "device_jpeg_decode=true", *graphs, "--json", "served-nvjpeg.json"],
             120 * scale, after=served_figures("served-nvjpeg.json"),
             skip_if=lambda out: None if record.device_decode else f"backend {args.backend} decodes on the host only"),
        Step("served-best-bucket", f"served, the buckets up to {bare}'s best", best_bucket, 120 * scale,
             after=served_figures("served-best-bucket.json")),
        Step("lanes", "lanes: interactive and a small tenant beside a backfill at the served step's concurrency",
             lanes("lanes", False), 150 * scale, after=lanes_figures("lanes.json")),
        Step("lanes-interactive-encoder", "lanes: the interactive windows with interactive_encoder (1 of 2 kept)",
             lanes("lanes-interactive-encoder", True), 120 * scale,
             after=lanes_figures("lanes-interactive-encoder.json"), skip_if=two_devices),
        Step("served-ingress-1", "served, one ingress replica",
             lambda out: [*served, "--set", "ingress_replicas=1", "--json", "served-ingress-1.json"], 120 * scale,
             after=served_figures("served-ingress-1.json")),
    ]


def top_level(concurrency: str) -> int:
    return max(int(c) for c in concurrency.split(",") if c.strip())


def backfill(out: Path, args: argparse.Namespace) -> tuple[int, str]:
    """The lanes steps' backfill: the served step's clients and processes at its best img/s (served.json), so that
    it loads the service as the served step's best level did; else the top --concurrency and --client-processes."""
    if (out / "served.json").exists():
        rows = read(out, "served.json").get("served") or []
        if rows:
            best = max(rows, key=lambda r: r["images_per_second"])
            processes = (best.get("client_cpu") or {}).get("client_processes")
            return int(best["concurrency"]), str(processes or args.client_processes)
    return top_level(args.concurrency), args.client_processes


def wheel_folders(given: list[str] | None) -> list[Path]:
    """--wheels as given, else the checkout's .whl and every .whl-N (tools/device_wheels.sh's carry folders)."""
    return [Path(g) for g in given] if given else [ROOT / ".whl", *sorted(ROOT.glob(".whl-[0-9]*"))]


def install_command(py: str, folders: list[Path]) -> list[str]:
    """pip, offline and without resolving, over the carried wheels (parts joined: measure/device_wheels.py)
    and this checkout (editable, so the `siglip-serve-haproxy` script lands beside the interpreter)."""
    wheels = assemble(folders, Path(tempfile.gettempdir()) / "siglip-device-wheels")
    return [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "--no-compile",
            *map(str, wheels), "-e", str(ROOT)]


def check(args: argparse.Namespace, echo: Any = print) -> dict[str, Any]:
    from siglip_serve.core.backends import BUILTIN

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, began = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    deadline = began + args.budget_s
    skip = skipped(args.skip)
    record = {r.name: r for r in BUILTIN}[args.backend]
    price = price_from_args(args)
    steps = plan(args)
    timeouts = sum(step.timeout_s for step in steps if step.name not in skip)
    echo(f"device-check: the steps not skipped have {timeouts:.0f} s of timeouts; the budget is {args.budget_s:.0f} s")
    results: dict[str, StepResult] = {}
    for step in steps:
        results[step.name] = run_step(step, out, deadline, skip, {"PYTHONUNBUFFERED": "1"}, echo)
    for result in [*derived(results, record.host_cores),
                   priced(results, price, served_encoder(record.graphs_setting))]:
        results[result.name] = result
        echo(f"- {result.title}: {result.status}" + (f" ({result.error})" if result.error else ""))
    done = list(results.values())
    counts = {s: sum(r.status == s for r in done) for s in ("passed", "failed", "timeout", "skipped")}
    summary = {"started": started, "seconds": round(time.monotonic() - began, 1), "budget_s": args.budget_s,
               "timeouts_s": timeouts, "backend": args.backend, "model": args.model,
               "price": price.as_dict() if price else None, "counts": counts,
               "ok": counts["failed"] == 0 and counts["timeout"] == 0, "steps": [r.__dict__ for r in done]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = [f"# device-check: {args.model} on {args.backend}", "",
          f"{counts['passed']} passed, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} skipped in {summary['seconds']:.0f} s (budget {args.budget_s:.0f} s; the steps "
          f"run had {timeouts:.0f} s of timeouts).", "",
          *table(done)]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    echo("\n" + "\n".join(md))
    if args.bundle:
        bundle(out, Path(args.bundle))
    return summary


def step_names() -> list[str]:
    """Every step's name, the derived ones last (what --skip may name)."""
    args = build_parser().parse_args(["--out", ".", "--wheels", "."])
    return [step.name for step in plan(args)] + list(DERIVED)


def skipped(text: str) -> frozenset[str]:
    """--skip's names, each one a step's: a misspelt name would run the step it meant and spend the budget."""
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    if unknown := sorted(names - set(step_names())):
        raise argparse.ArgumentTypeError(f"--skip: no step {', '.join(unknown)}; the steps: {', '.join(step_names())}")
    return names


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
    parser.add_argument("--buckets", help=f"the encoder steps' batch buckets (default: {GPU_BUCKETS} on cuda, else the "
                                          "model settings'); the served steps serve the model's, served-best-bucket "
                                          "those up to the best")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per bucket")
    parser.add_argument("--concurrency", default="32,128",
                        help="served client concurrency levels (default 32,128: the H200 reached its host ceiling at "
                             "128); the host ceiling runs the top one")
    parser.add_argument("--requests", type=int, default=1000, help="served requests per concurrency level")
    parser.add_argument("--client-processes", default="auto", type=client_processes,
                        help="the served steps' and the host ceiling's client processes, passed to bench (auto: 1 "
                             "on up to 4 usable CPUs, else one per 4, at most 8)")
    parser.add_argument("--wheels", action="append", help="a folder of carried wheels or wheel parts, installed "
                        "first (offline); repeat for each (default: the checkout's .whl and every .whl-N)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's seconds, install included")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's timeout")
    parser.add_argument("--lanes-seconds", type=float, default=6.0, help="each lanes window's length")
    parser.add_argument("--skip", default="", help="comma list of step names to skip, e.g. install,pytest-cuda "
                                                   "(docs/dev/accelerator-check.md: what to skip to rerun one step)")
    add_price_arguments(parser.add_argument_group("price (dollars per million images)"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from siglip_serve.core.backends import BACKENDS

    if args.backend not in BACKENDS:
        print(f"error: --backend {args.backend!r}: one of {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    try:  # refused before the first step, not after minutes of measuring
        price_from_args(args)
        skipped(args.skip)
    except (PriceError, argparse.ArgumentTypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if check(args)["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
