"""`siglip-serve loadtest report`: how many images per second one instance serves, beside seed 000.

Three measurements, each read from a recorded JSON or run here:
  (a) single core, bare encoder       --bench-json FILE      | --run-bench "ARGS for siglip-serve bench"
  (b) one worker per logical core     --multicore-json FILE  | --run-multicore cores=N KEY=VALUE ... (run_multicore)
  (c) served at saturation            --loadtest-summary FILE | --run-loadtest "ARGS for siglip-serve loadtest"
Serving efficiency = (c) / (b). Writes OUT/report.md, OUT/report.json and PNG figures; the JSON
shapes read are documented in loadtest/inputs.py and docs/loadtest.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtest import inputs, plots
from models.cli_args import UserError, key_value, settings_values, setup_logging

log = logging.getLogger("siglip_loadtest.report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve loadtest report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    a = parser.add_mutually_exclusive_group()
    a.add_argument("--bench-json", help="(a) siglip-serve bench --json output")
    a.add_argument("--run-bench", metavar="ARGS", help="(a) run siglip-serve bench with these arguments")
    b = parser.add_mutually_exclusive_group()
    b.add_argument("--multicore-json", help="(b) models.multicore_bench result")
    b.add_argument("--run-multicore", metavar="KEY=VALUE", nargs="*", type=key_value,
                   help="(b) run models.multicore_bench.run_multicore: cores=N [bucket=1 warmup=10 iterations=50] "
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
    path = out / "bench.json"
    cmd = [sys.executable, "-m", "serve.cli", "bench", *shlex.split(arguments), "--skip", "preprocess,served",
           "--json", str(path)]
    log.info("(a) running: %s", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)
    return path


MULTICORE_KEYS = ("cores", "bucket", "warmup", "iterations")


def run_multicore(pairs: list[tuple[str, str]], out: Path) -> Path:
    """(b) by models.multicore_bench.run_multicore: `cores`, `bucket`, `warmup`, `iterations` go to
    the function, every other KEY=VALUE is a model setting (backend=neuron, artifact_dir=DIR, ...)."""
    from models.multicore_bench import SEED_REFERENCE
    from models.multicore_bench import run_multicore as run

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
    path.write_text(json.dumps({**result, "seed_reference": list(SEED_REFERENCE)}, indent=2, default=str))
    return path


def run_loadtest(arguments: str, out: Path) -> Path:
    from loadtest import cli

    folder = out / "loadtest"
    log.info("(c) running: siglip-serve loadtest %s --out %s", arguments, folder)
    code = cli.main([*shlex.split(arguments), "--out", str(folder)])
    if code == cli.EXIT_ERROR:
        raise SystemExit(f"the load test could not run (exit {code}); see its log")
    return folder / "summary.json"


# -- the numbers ---------------------------------------------------------------------------

def _machine_label(machine: Any) -> str | None:
    if isinstance(machine, str):
        return machine
    if isinstance(machine, dict):
        parts = [machine.get(k) for k in ("instance_type", "host", "cpu") if machine.get(k)]
        if machine.get("cpus"):
            parts.append(f"{machine['cpus']} CPUs")
        return ", ".join(str(p) for p in parts) or None
    return None


def _as_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def context(a: dict | None, b: dict | None, c: dict | None, machine: str | None, lnc: int | None) -> dict[str, Any]:
    server = (c or {}).get("server") or {}
    sources = [s for s in (b, a) if s]

    def pick(*values: Any) -> Any:
        return next((v for v in values if v not in (None, "", [])), None)

    return {
        "machine": pick(machine, *(_machine_label(s.get("machine")) for s in sources)) or "unknown (pass --machine)",
        "backend": pick(server.get("backend"), *(s.get("backend") for s in sources)) or "unknown",
        "model": pick(server.get("id"), *(s.get("model") for s in sources)) or "unknown",
        "lnc": _as_int(pick(lnc, server.get("lnc"), *(s.get("lnc") for s in sources))),
        "buckets": pick(server.get("buckets"), sorted((a or {}).get("buckets") or [])) or "unknown",
        "replicas": server.get("replicas"),
    }


def seed_comparable(ctx: dict[str, Any]) -> bool:
    return ctx["backend"] == "neuron" and "SO400M" in str(ctx["model"]) and "384" in str(ctx["model"])


def context_line(ctx: dict[str, Any]) -> str:
    lnc = ctx["lnc"] if ctx["lnc"] is not None else "n/a"
    return f"{ctx['machine']} | {ctx['backend']} | {ctx['model']} | LNC={lnc} | buckets {ctx['buckets']}"


def rows(a: dict | None, b: dict | None, c: dict | None, seed: dict[int, dict], ctx: dict) -> list[dict[str, Any]]:
    out = [{"source": f"seed 000, LNC={lnc}", "what": f"bare, batch 1, {_SEED_CAST.get(ref.get('auto_cast'), '?')}, "
            "per-core x cores (each core measured alone)",
            "lnc": lnc, "cores": ref.get("cores"), "per_core": ref.get("per_core"),
            "instance": ref.get("instance"), "latency_ms": ref.get("latency_ms")} for lnc, ref in sorted(seed.items(),
                                                                                                         reverse=True)]
    if a:
        out.append({"source": "(a) this run", "what": f"bare encoder, one core, batch 1 (best: bucket "
                    f"{a['best_bucket']}, {a['best_images_per_second']:.1f} img/s)", "lnc": ctx["lnc"], "cores": 1,
                    "per_core": a["batch1_images_per_second"], "instance": None, "latency_ms": a["batch1_latency_ms"]})
    if b:
        lat = [w["latency_ms"] for w in b["per_core"] if w.get("latency_ms") is not None]
        batch = f" (batch {b['bucket']:g})" if b.get("bucket") is not None else ""
        out.append({"source": "(b) this run", "what": f"one worker per logical core, summed{batch}",
                    "lnc": b["lnc"] if b.get("lnc") is not None else ctx["lnc"], "cores": b["cores"],
                    "per_core": b["images_per_second"] / b["cores"] if b.get("cores") else None,
                    "instance": b["images_per_second"], "latency_ms": sum(lat) / len(lat) if lat else None})
    if c and c.get("saturation"):
        sat = c["saturation"]
        replicas = ctx.get("replicas")
        out.append({"source": "(c) this run", "what": f"served over HTTP at saturation ({sat['users']} users, "
                    f"p99 <= {sat['p99_target_ms']:g} ms)", "lnc": ctx["lnc"], "cores": replicas,
                    "per_core": sat["images_per_second"] / replicas if replicas else None,
                    "instance": sat["images_per_second"], "latency_ms": sat["latency_ms"].get("p50")})
    elif c and c.get("over_target"):
        over = c["over_target"]
        replicas = ctx.get("replicas")
        p99, target = over["latency_ms"].get("p99"), over.get("p99_target_ms")
        out.append({"source": "(c) this run, OVER TARGET", "what": f"served over HTTP, best step ({over['users']} "
                    f"users), p99 {_cell(p99, '.0f')} ms > target {_cell(target, 'g')} ms: measured, not a saturation "
                    "point", "lnc": ctx["lnc"], "cores": replicas,
                    "per_core": over["images_per_second"] / replicas if replicas else None,
                    "instance": over["images_per_second"], "latency_ms": over["latency_ms"].get("p50")})
    return out


_SEED_CAST = {"matmult": "--auto-cast matmult", "none": "un-cast fp32"}


def efficiency(b: dict | None, c: dict | None) -> float | None:
    if not b or not c or not c.get("images_per_second") or not b.get("images_per_second"):
        return None
    return float(c["images_per_second"]) / float(b["images_per_second"])


def _cell(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, float) else str(value)


def table(report_rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| source | measurement | LNC | cores | img/s per core | img/s instance | latency ms |",
             "|---|---|---|---|---|---|---|"]
    for r in report_rows:
        lines.append(f"| {r['source']} | {r['what']} | {_cell(r['lnc'])} | {_cell(r['cores'])} | "
                     f"{_cell(r['per_core'])} | {_cell(r['instance'])} | {_cell(r['latency_ms'])} |")
    return lines


def cross_check_line(c: dict | None) -> str:
    check = (c or {}).get("metrics_check")
    if not check:
        return "Metrics cross-check: not run (no --metrics-url)."
    if check.get("agrees") is None:
        return f"Metrics cross-check: unavailable ({check.get('note')})."
    return (f"Metrics cross-check: the load test counted {check['client_images']} images, the server's "
            f"`{check['metric']}` rose by {check['server_images']:.0f} over the same window "
            f"({check['difference_ratio']:.1%} apart; {'within' if check['agrees'] else 'OUTSIDE'} "
            f"the {check['tolerance']:.0%} tolerance).")


def draw_figures(out: Path, a: dict | None, b: dict | None, c: dict | None, ref: dict | None,
                 line: str) -> dict[str, Path | None]:
    steps = (c or {}).get("steps") or []
    sat = (c or {}).get("saturation")
    target = (sat or {}).get("p99_target_ms") or ((c or {}).get("settings") or {}).get("p99_target_ms")
    return {
        "throughput_vs_users": plots.throughput_vs_users(steps, sat, (b or {}).get("images_per_second"),
                                                         (ref or {}).get("instance"), line,
                                                         out / "throughput_vs_users.png"),
        "latency_vs_users": plots.latency_vs_users(steps, target, line, out / "latency_vs_users.png"),
        "per_core": plots.per_core_bars((b or {}).get("per_core") or [], (a or {}).get("batch1_images_per_second"),
                                        (ref or {}).get("per_core"), line, out / "per_core.png"),
    }


def steps_table(steps: list[dict[str, Any]]) -> list[str]:
    lines = ["| users | img/s | p50 ms | p95 ms | p99 ms | fail ratio |", "|---|---|---|---|---|---|"]
    for s in steps:
        lat = s["latency_ms"]
        lines.append(f"| {s['users']} | {s['images_per_second']:.1f} | {_cell(lat.get('p50'), '.0f')} | "
                     f"{_cell(lat.get('p95'), '.0f')} | {_cell(lat.get('p99'), '.0f')} | {s['fail_ratio']:.3f} |")
    return lines


def markdown(ctx: dict[str, Any], report_rows: list[dict[str, Any]], eff: float | None, c: dict | None,
             missing: list[str], figures: dict[str, Path | None], sources: dict[str, str | None]) -> str:
    md = [f"# Instance throughput: {ctx['model']} on {ctx['machine']}", "",
          f"Machine: {ctx['machine']} · backend: {ctx['backend']} · model: {ctx['model']} · "
          f"LNC: {_cell(ctx['lnc'])} · buckets: {ctx['buckets']}", "",
          *table(report_rows), "",
          f"Serving efficiency (c) ÷ (b): **{eff:.1%}**" if eff is not None
          else "Serving efficiency (c) ÷ (b): not available (needs both (b) and (c)).", "",
          cross_check_line(c), "",
          "Latency: seed, (a) and (b) = mean time of one batch-1 call; (c) = request p50 at saturation "
          "(queueing and batching included). Cores for (c) = encoder replicas.", ""]
    if not seed_comparable(ctx):
        md += [f"The seed rows are SigLIP-SO400M-14-384 on a trn2.3xlarge (Neuron); this run is {ctx['model']} on "
               f"{ctx['backend']}: shown for orientation only, not comparable.", ""]
    if missing:
        md += [f"Missing from this report: {', '.join(missing)}.", ""]
    if c and not c.get("saturation") and c.get("over_target"):
        md += ["(c) is OVER the p99 target: no step kept p99 under it, so the row shows the best step as "
               "measured, not a saturation point, and no serving efficiency is computed from it.", ""]
    steps = (c or {}).get("steps") or []
    if steps:
        md += ["## Load steps", "", *steps_table(steps), ""]
    md += ["## Figures", ""] + [f"![{name}]({path.name})" for name, path in figures.items() if path] + [""]
    md += ["## Inputs", ""] + [f"- {name}: `{path}`" if path else f"- {name}: none" for name, path in sources.items()]
    md += ["", "Seed 000 rows: trn2.3xlarge, SigLIP-SO400M-14-384, batch 1. LNC=2 is the `--auto-cast matmult` "
           "compile, LNC=1 the un-cast fp32 compile. Their instance figures are per-core x cores, each core "
           "measured alone (141.1 from 35.43 per core, 115.0 from 14.38), not all cores at once as (b) runs."]
    return "\n".join(md) + "\n"


def write_report(out: Path, a: dict | None, b: dict | None, c: dict | None, seed: dict[int, dict],
                 ctx: dict[str, Any], sources: dict[str, str | None]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    # Seed lines on the figures only where the seed measured the same thing (SO400M on Neuron).
    ref = seed.get(ctx["lnc"]) if seed_comparable(ctx) and isinstance(ctx["lnc"], int) else None
    report_rows = rows(a, b, c, seed, ctx)
    eff = efficiency(b, c)
    figures = draw_figures(out, a, b, c, ref, context_line(ctx))
    missing = [name for name, part in (("(a) single-core bench", a), ("(b) multi-core bench", b),
                                       ("(c) served saturation", c and (c.get("images_per_second")
                                                                        or c.get("over_target")))) if not part]
    (out / "report.md").write_text(markdown(ctx, report_rows, eff, c, missing, figures, sources))
    result = {"context": ctx, "rows": report_rows, "serving_efficiency": eff, "single_core": a, "multi_core": b,
              "served": c, "seed_reference": {str(k): v for k, v in seed.items()},
              "figures": {k: str(v) if v else None for k, v in figures.items()}, "inputs": sources,
              "missing": missing}
    (out / "report.json").write_text(json.dumps(result, indent=2, default=str))
    return result


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
    a = inputs.single_core(inputs.read_json(bench_path))
    b = inputs.multi_core(inputs.read_json(multi_path))
    c = inputs.served(inputs.read_json(summary_path))
    if not (a or b or c):
        log.error("nothing to report: give at least one of --bench-json, --multicore-json, --loadtest-summary "
                  "(or their --run-* forms)")
        return 2
    seed = inputs.seed_reference()
    ctx = context(a, b, c, args.machine, args.lnc)
    result = write_report(out, a, b, c, seed, ctx,
                          {"bench": str(bench_path) if bench_path else None,
                           "multicore": str(multi_path) if multi_path else None,
                           "loadtest": str(summary_path) if summary_path else None})
    print(context_line(ctx))
    print("\n".join(table(result["rows"])))
    eff = result["serving_efficiency"]
    print(f"serving efficiency (c)/(b): {eff:.1%}" if eff is not None else "serving efficiency: n/a")
    print(cross_check_line(c))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
