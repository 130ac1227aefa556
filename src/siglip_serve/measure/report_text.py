"""The instance report's words: the table, the metrics cross-check line and report.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from siglip_serve.measure.load_results import InstanceReport, LoadTestSummary, ReportContext, ReportRow, Step
from siglip_serve.measure.results import Bound


def _cell(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, float) else str(value)


def context_line(ctx: ReportContext) -> str:
    lnc = ctx.lnc if ctx.lnc is not None else "n/a"
    return f"{ctx.machine} | {ctx.backend} | {ctx.model} | LNC={lnc} | buckets {ctx.buckets}"


def table(report_rows: list[ReportRow]) -> list[str]:
    lines = ["| source | measurement | LNC | cores | img/s per core | img/s instance | latency ms |",
             "|---|---|---|---|---|---|---|"]
    for r in report_rows:
        lines.append(f"| {r.source} | {r.what} | {_cell(r.lnc)} | {_cell(r.cores)} | "
                     f"{_cell(r.per_core)} | {_cell(r.instance)} | {_cell(r.latency_ms)} |")
    return lines


def cross_check_line(served: LoadTestSummary | None) -> str:
    check = served.metrics_check if served else None
    if not check:
        return "Metrics cross-check: not run (no --metrics-url)."
    if check.agrees is None or check.server_images is None or check.difference_ratio is None:
        return f"Metrics cross-check: unavailable ({check.note})."
    return (f"Metrics cross-check: the load test counted {check.client_images} images, the server's "
            f"`{check.metric}` rose by {check.server_images:.0f} over the same window "
            f"({check.difference_ratio:.1%} apart; {'within' if check.agrees else 'OUTSIDE'} "
            f"the {check.tolerance:.0%} tolerance).")


def steps_table(steps: list[Step]) -> list[str]:
    lines = ["| users | img/s | p50 ms | p95 ms | p99 ms | fail ratio |", "|---|---|---|---|---|---|"]
    for s in steps:
        lat = s.latency_ms
        lines.append(f"| {s.users} | {s.images_per_second:.1f} | {_cell(lat.p50, '.0f')} | "
                     f"{_cell(lat.p95, '.0f')} | {_cell(lat.p99, '.0f')} | {s.fail_ratio:.3f} |")
    return lines


def bound_line(bound: Bound | None) -> str:
    if bound is None:
        return "host- or device-bound: not known (needs a bench JSON with a host ceiling: siglip-serve bench)"
    return f"{bound.verdict.upper()}: {bound.explanation}"


def markdown(report: InstanceReport, seed_comparable: bool) -> str:
    ctx, c, eff = report.context, report.served, report.serving_efficiency
    md = [f"# Instance throughput: {ctx.model} on {ctx.machine}", "",
          f"Machine: {ctx.machine} · backend: {ctx.backend} · model: {ctx.model} · "
          f"LNC: {_cell(ctx.lnc)} · buckets: {ctx.buckets}", "",
          *table(report.rows), "",
          f"Serving efficiency (c) ÷ (b): **{eff:.1%}**" if eff is not None
          else "Serving efficiency (c) ÷ (b): not available (needs both (b) and (c)).", "",
          bound_line(report.bound), "",
          cross_check_line(c), "",
          "Latency: seed, (a) and (b) = mean time of one batch-1 call; (c) = request p50 at saturation "
          "(queueing and batching included). Cores for (c) = encoder replicas.", ""]
    if not seed_comparable:
        md += [f"The seed rows are SigLIP-SO400M-14-384 on a trn2.3xlarge (Neuron); this run is {ctx.model} on "
               f"{ctx.backend}: shown for orientation only, not comparable.", ""]
    if report.missing:
        md += [f"Missing from this report: {', '.join(report.missing)}.", ""]
    if report.over_target:
        md += ["(c) is OVER the p99 target: no step kept p99 under it, so the row shows the best step as "
               "measured, not a saturation point, and no serving efficiency is computed from it.", ""]
    if c and c.steps:
        md += ["## Load steps", "", *steps_table(c.steps), ""]
    md += ["## Figures", ""] + [f"![{name}]({Path(path).name})" for name, path in report.figures.items() if path]
    md += ["", "## Inputs", ""]
    md += [f"- {name}: `{path}`" if path else f"- {name}: none" for name, path in report.inputs.items()]
    md += ["", "Seed 000 rows: trn2.3xlarge, SigLIP-SO400M-14-384, batch 1. LNC=2 is the `--auto-cast matmult` "
           "compile, LNC=1 the un-cast fp32 compile. Their instance figures are per-core x cores, each core "
           "measured alone (141.1 from 35.43 per core, 115.0 from 14.38), not all cores at once as (b) runs."]
    return "\n".join(md) + "\n"
