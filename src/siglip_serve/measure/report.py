"""`siglip-serve report` (also `siglip-serve loadtest report`): how many images per second one instance
serves, beside seed 000.

Three measurements, each read from a recorded JSON or run here:
  (a) single core, bare encoder       --bench-json FILE      | --run-bench "ARGS for siglip-serve bench"
  (b) one worker per logical core     --multicore-json FILE  | --run-multicore cores=N KEY=VALUE ... (run_multicore)
  (c) served at saturation            --loadtest-summary FILE | --run-loadtest "ARGS for siglip-serve loadtest"
Serving efficiency = (c) / (b). Writes OUT/report.md, OUT/report.json and PNG figures. The files
read are the models of measure/results.py (BenchResult, MulticoreResult) and measure/load_results.py (LoadTestSummary).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from siglip_serve.core.backends import backend_record
from siglip_serve.core.cli import key_value, settings_values, setup_logging
from siglip_serve.core.errors import UserError
from siglip_serve.measure import plots
from siglip_serve.measure.bound import judge
from siglip_serve.measure.load_results import (
    InstanceReport,
    LoadTestSummary,
    OperatingPoint,
    ReportContext,
    ReportRow,
    SingleCore,
)
from siglip_serve.measure.report_text import bound_line, context_line, cross_check_line, markdown, table
from siglip_serve.measure.results import BenchResult, Bound, MulticoreResult, ResultFileError
from siglip_serve.measure.seed import SeedRow, measured_like_the_seed, multicore_seed_by_lnc

log = logging.getLogger("siglip_serve.report")

EXIT_ERROR = 2  # siglip-serve loadtest: the test could not run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    a = parser.add_mutually_exclusive_group()
    a.add_argument("--bench-json", help="(a) siglip-serve bench --json output")
    a.add_argument("--run-bench", metavar="ARGS", help="(a) run siglip-serve bench with these arguments")
    b = parser.add_mutually_exclusive_group()
    b.add_argument("--multicore-json", help="(b) python -m siglip_serve.measure.multicore --json output")
    b.add_argument("--run-multicore", metavar="KEY=VALUE", nargs="*", type=key_value,
                   help="(b) run measure.multicore.run_multicore: cores=N [bucket=1 warmup=10 iterations=50] "
                        "and model settings (backend=neuron artifact_dir=DIR ...); values parse as YAML scalars")
    c = parser.add_mutually_exclusive_group()
    c.add_argument("--loadtest-summary", help="(c) summary.json of siglip-serve loadtest")
    c.add_argument("--run-loadtest", metavar="ARGS", help="(c) run siglip-serve loadtest with these arguments")
    parser.add_argument("--machine", help="machine name for the figures, e.g. trn2.3xlarge (default: from the inputs)")
    parser.add_argument("--lnc", type=int, help="LNC of the measured runs (default: from the inputs)")
    parser.add_argument("--out", default="report", help="folder for report.md, report.json and the PNGs")
    return parser


# -- running the measurements --------------------------------------------------------------

def run_bench(arguments: str, out: Path) -> Path:
    """(a) in this process: `siglip-serve bench` is this package's own command."""
    from siglip_serve.measure import bench_cli

    path = out / "bench.json"
    argv = [*shlex.split(arguments), "--skip", "preprocess,served", "--json", str(path)]
    log.info("(a) running: siglip-serve bench %s", " ".join(argv))
    code = bench_cli.main(argv)
    if code != 0:
        raise SystemExit(f"the bench could not run (exit {code}); see its log")
    return path


MULTICORE_KEYS = ("cores", "bucket", "warmup", "iterations")


def run_multicore(pairs: list[tuple[str, str]], out: Path) -> Path:
    """(b) by siglip_serve.measure.multicore.run_multicore: `cores`, `bucket`, `warmup`, `iterations` go to
    the function, every other KEY=VALUE is a model setting (backend=neuron, artifact_dir=DIR, ...)."""
    from siglip_serve.measure.multicore import run_multicore as run

    settings: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for key, value in settings_values(pairs).items():
        (options if key in MULTICORE_KEYS else settings)[key] = value
    if "cores" not in options:
        raise SystemExit("--run-multicore needs cores=N (trn2.3xlarge: 4 at LNC=2, 8 at LNC=1)")
    bucket = int(options.pop("bucket", 1))
    log.info("(b) running run_multicore(%s, bucket=%d, %s)", settings, bucket, options)
    try:
        result = run(settings, bucket=bucket, **{k: int(v) for k, v in options.items()})
    except (UserError, ValueError) as exc:  # ValueError: a KEY=VALUE option that is not an integer
        raise SystemExit(f"the multi-core bench could not run: {exc}") from None
    path = out / "multicore.json"
    result.write(path)
    return path


def run_loadtest(arguments: str, out: Path) -> Path:
    """(c) in a process of its own: Locust patches the interpreter (gevent) when it is imported, and the
    load-test package is a client of this one (it writes measure's LoadTestSummary)."""
    folder = out / "loadtest"
    cmd = [sys.executable, "-m", "siglip_serve", "loadtest", *shlex.split(arguments), "--out", str(folder)]
    log.info("(c) running: %s", " ".join(cmd[2:]))
    # Exit code 1 is a breached threshold: the run was measured, and the report shows it.
    code = subprocess.run(cmd, check=False).returncode
    if code == EXIT_ERROR:
        raise SystemExit(f"the load test could not run (exit {code}); see its log")
    return folder / "summary.json"


# -- the numbers ---------------------------------------------------------------------------

def single_core(bench: BenchResult | None) -> SingleCore | None:
    """(a): the bare encoder per bucket; batch 1 is the seed's per-core figure."""
    rows = (bench.encoder or []) if bench else []
    if not rows:
        return None
    best = max(rows, key=lambda r: r.images_per_second)
    batch1 = next((r for r in rows if r.bucket == 1), None)
    return SingleCore(images_per_second={r.bucket: r.images_per_second for r in rows},
                      latency_mean_ms={r.bucket: r.latency_mean_ms for r in rows},
                      batch1_images_per_second=batch1.images_per_second if batch1 else None,
                      batch1_latency_mean_ms=batch1.latency_mean_ms if batch1 else None,
                      best_bucket=best.bucket, best_images_per_second=best.images_per_second)


def over_target(summary: LoadTestSummary | None) -> OperatingPoint | None:
    """The step with the most img/s when none met the p99 target (or the whole run, if no steps)."""
    if summary is None or summary.saturation is not None:
        return None
    target = summary.settings.get("p99_target_ms")
    steps = [step for step in summary.steps if step.images]
    if steps:
        return OperatingPoint.of(max(steps, key=lambda step: step.images_per_second), target)
    if summary.images:
        return OperatingPoint(users=summary.settings.get("users"), images_per_second=summary.images_per_second,
                              latency_ms=summary.latency_ms, fail_ratio=summary.fail_ratio, p99_target_ms=target)
    return None


def _machine_label(bench: BenchResult | None, multi: MulticoreResult | None) -> str | None:
    for machine in (m.machine for m in (multi, bench) if m):
        parts = [p for p in (machine.host, machine.cpu) if p] + ([f"{machine.cpus} CPUs"] if machine.cpus else [])
        if parts:
            return ", ".join(parts)
    return None


def context(bench: BenchResult | None, multi: MulticoreResult | None, served: LoadTestSummary | None,
            machine: str | None, lnc: int | None) -> ReportContext:
    server = served.server if served and served.server else None

    def pick(*values: Any) -> Any:
        return next((v for v in values if v not in (None, "", [])), None)

    return ReportContext(
        machine=pick(machine, _machine_label(bench, multi)) or "unknown (pass --machine)",
        backend=pick(server and server.backend, multi and multi.backend, bench and bench.backend) or "unknown",
        model=pick(server and server.id, multi and multi.model, bench and bench.model) or "unknown",
        lnc=pick(lnc, server and server.lnc, multi and multi.lnc),
        buckets=pick(server and server.buckets, bench and sorted(r.bucket for r in bench.encoder or [])) or "unknown",
        replicas=server.replicas if server else None,
    )


_SEED_CAST = {"matmult": "--auto-cast matmult", "none": "un-cast fp32"}


def rows(a: SingleCore | None, b: MulticoreResult | None, c: LoadTestSummary | None, over: OperatingPoint | None,
         seed: dict[int, SeedRow], ctx: ReportContext) -> list[ReportRow]:
    out = [ReportRow(source=f"seed 000, LNC={lnc}", what=f"bare, batch 1, {_SEED_CAST.get(ref.auto_cast, '?')}, "
                     "per-core x cores (each core measured alone)", lnc=lnc, cores=ref.cores,
                     per_core=ref.per_core_images_per_second, instance=ref.instance_images_per_second,
                     latency_ms=ref.latency_mean_ms) for lnc, ref in sorted(seed.items(), reverse=True)]
    if a:
        out.append(ReportRow(source="(a) this run", what=f"bare encoder, one core, batch 1 (best: bucket "
                             f"{a.best_bucket}, {a.best_images_per_second:.1f} img/s)", lnc=ctx.lnc, cores=1,
                             per_core=a.batch1_images_per_second, instance=None, latency_ms=a.batch1_latency_mean_ms))
    if b:
        out.append(ReportRow(source="(b) this run", what=f"one worker per logical core, summed (batch {b.bucket})",
                             lnc=b.lnc if b.lnc is not None else ctx.lnc, cores=b.cores,
                             per_core=b.instance_images_per_second / b.cores, instance=b.instance_images_per_second,
                             latency_ms=b.latency_mean_ms))
    replicas = ctx.replicas
    if c and c.saturation:
        sat = c.saturation
        out.append(ReportRow(source="(c) this run", what=f"served over HTTP at saturation ({sat.users} users, "
                             f"p99 <= {sat.p99_target_ms:g} ms)", lnc=ctx.lnc, cores=replicas,
                             per_core=sat.images_per_second / replicas if replicas else None,
                             instance=sat.images_per_second, latency_ms=sat.latency_ms.p50))
    elif over:
        p99, target = over.latency_ms.p99, over.p99_target_ms
        out.append(ReportRow(source="(c) this run, OVER TARGET", what=f"served over HTTP, best step ({over.users} "
                             f"users), p99 {_cell(p99, '.0f')} ms > target {_cell(target, 'g')} ms: measured, not a "
                             "saturation point", lnc=ctx.lnc, cores=replicas,
                             per_core=over.images_per_second / replicas if replicas else None,
                             instance=over.images_per_second, latency_ms=over.latency_ms.p50))
    return out


def _cell(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def efficiency(b: MulticoreResult | None, c: LoadTestSummary | None) -> float | None:
    if not b or not c or not c.saturation or not b.instance_images_per_second:
        return None
    return c.saturation.images_per_second / b.instance_images_per_second


def on_host_cores(backend: str) -> bool:
    """Whether a result's backend ran the model on the host's cores, where its replicas share the one host
    instead of a device each; a name no registry knows (an old result, "unknown"): no."""
    try:
        return backend_record(backend).host_cores
    except ValueError:
        return False


def bound(bench: BenchResult | None, a: SingleCore | None, b: MulticoreResult | None,
          served: OperatingPoint | None, ctx: ReportContext) -> Bound | None:
    """Host- or device-bound, when the bench JSON holds a host ceiling: the device's rate is (b), all cores
    at once, else (a)'s best bucket times the replicas (each has a device of its own off cpu)."""
    if bench is None or bench.host_ceiling is None:
        return None
    if b is not None and b.instance_images_per_second:
        device = b.instance_images_per_second
    elif a is not None:
        device = a.best_images_per_second * (1 if on_host_cores(ctx.backend) else ctx.replicas or 1)
    else:
        return None
    # The load test's client is its own; the ceiling's is bench's, whose busyness may make the ceiling its limit.
    client = bench.host_ceiling.client_cpu
    return judge(bench.host_ceiling.images_per_second, device, served.images_per_second if served else None,
                 client.busiest_process_core_fraction if client else None)


def draw_figures(out: Path, a: SingleCore | None, b: MulticoreResult | None, c: LoadTestSummary | None,
                 ref: SeedRow | None, line: str) -> dict[str, str | None]:
    steps = c.steps if c else []
    sat = c.saturation if c else None
    target = (sat.p99_target_ms if sat else None) or (c.settings.get("p99_target_ms") if c else None)
    figures = {
        "throughput_vs_users": plots.throughput_vs_users(
            steps, sat, b.instance_images_per_second if b else None,
            ref.instance_images_per_second if ref else None, line, out / "throughput_vs_users.png"),
        "latency_vs_users": plots.latency_vs_users(steps, target, line, out / "latency_vs_users.png"),
        "per_core": plots.per_core_bars(b.workers if b else [], a.batch1_images_per_second if a else None,
                                        ref.per_core_images_per_second if ref else None, line, out / "per_core.png"),
    }
    return {name: str(path) if path else None for name, path in figures.items()}


def build_report(out: Path, bench: BenchResult | None, b: MulticoreResult | None, c: LoadTestSummary | None,
                 machine: str | None, lnc: int | None, sources: dict[str, str | None]) -> InstanceReport:
    a = single_core(bench)
    seed = multicore_seed_by_lnc()
    ctx = context(bench, b, c, machine, lnc)
    over = over_target(c)
    # Seed lines on the figures only where the seed measured the same thing (SO400M on Neuron).
    ref = seed.get(ctx.lnc) if seed_comparable(ctx) and ctx.lnc is not None else None
    verdict = bound(bench, a, b, (c.saturation if c else None) or over, ctx)
    missing = [name for name, part in (("(a) single-core bench", a), ("(b) multi-core bench", b),
                                       ("(c) served saturation", c and (c.saturation or over)),
                                       ("host ceiling (siglip-serve bench with its served part)",
                                        bench and bench.host_ceiling)) if not part]
    return InstanceReport(context=ctx, rows=rows(a, b, c, over, seed, ctx), serving_efficiency=efficiency(b, c),
                          single_core=a, multi_core=b, served=c, over_target=over, seed_reference=seed,
                          figures=draw_figures(out, a, b, c, ref, context_line(ctx)), inputs=sources,
                          missing=missing, bound=verdict)


def seed_comparable(ctx: ReportContext) -> bool:
    return measured_like_the_seed(ctx.backend, ctx.model)


def main(argv: list[str] | None = None) -> int:
    setup_logging("INFO")
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench_path = run_bench(args.run_bench, out) if args.run_bench else args.bench_json
    multi_path = run_multicore(args.run_multicore, out) if args.run_multicore is not None else args.multicore_json
    summary_path = run_loadtest(args.run_loadtest, out) if args.run_loadtest else args.loadtest_summary
    for name, path in (("--bench-json", bench_path), ("--multicore-json", multi_path),
                       ("--loadtest-summary", summary_path)):
        if path and not Path(path).exists():
            log.error("%s %s: no such file", name, path)
            return 2
    try:
        bench = BenchResult.read(bench_path) if bench_path else None
        multi = MulticoreResult.read(multi_path) if multi_path else None
        served = LoadTestSummary.read(summary_path) if summary_path else None
    except ResultFileError as exc:
        log.error("%s", exc)
        return 2
    if not (single_core(bench) or multi or served):
        log.error("nothing to report: give at least one of --bench-json, --multicore-json, --loadtest-summary "
                  "(or their --run-* forms)")
        return 2
    sources = {"bench": str(bench_path) if bench_path else None,
               "multicore": str(multi_path) if multi_path else None,
               "loadtest": str(summary_path) if summary_path else None}
    report = build_report(out, bench, multi, served, args.machine, args.lnc, sources)
    (out / "report.md").write_text(markdown(report, seed_comparable(report.context)))
    report.write(out / "report.json")
    print(context_line(report.context))
    print("\n".join(table(report.rows)))
    eff = report.serving_efficiency
    print(f"serving efficiency (c)/(b): {eff:.1%}" if eff is not None else "serving efficiency: n/a")
    print(bound_line(report.bound))
    print(cross_check_line(served))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
