"""The figures of `siglip-serve device-check`'s steps (measure/device_check.py), read from the files each step
writes; what is derived from them (the verdict, served / bare, the price); and summary.md's table.

Standard library only, like the rest of the check's own code (measure/device_steps.py says why); the verdict
imports measure/bound.py (pydantic) when it is computed, and says so where it cannot.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from siglip_serve.measure.device_steps import StepResult
from siglip_serve.measure.prices import FILL_HINT, Price, bare_price, dollars, usd_per_million

COLUMNS = ("step", "status", "seconds", "img/s", "p50 ms", "p99 ms", "CPU-ms/img", "$/1M img", "client CPU", "detail")
# The steps whose img/s is a service's, priced per million images where a price is given.
SERVED_STEPS = ("served", "served-nvjpeg", "served-best-bucket", "served-ingress-1")
# The figures the detail column shows, where a step has no detail of its own.
DETAIL_KEYS = ("by_bucket", "by_concurrency", "buckets", "replicas", "ingress_replicas", "failures", "gpu", "gpus",
               "torch", "usable_cpus", "passed", "skipped")
After = Callable[[Path], dict[str, Any] | str]


def read(out: Path, name: str) -> dict[str, Any]:
    data = json.loads((out / name).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{name} holds no JSON object")
    return data


def served_encoder(graphs_setting: str | None) -> str:
    """The encoder step whose figures are the served default's bare encoder: with CUDA graphs where the backend
    captures them (the served default on cuda), else without."""
    return "encoder-graphs" if graphs_setting else "encoder"


def best_encoder_row(out: Path, name: str) -> tuple[int, list[int]]:
    """The best bucket of an encoder step's JSON, and every bucket it ran."""
    rows = read(out, name).get("encoder") or []
    if not rows:
        raise ValueError(f"{name} has no encoder rows")
    best = max(rows, key=lambda r: r["images_per_second"])
    return int(best["bucket"]), sorted(int(r["bucket"]) for r in rows)


def encoder_figures(name: str) -> After:
    def after(out: Path) -> dict[str, Any] | str:
        rows = read(out, name).get("encoder") or []
        if not rows:
            return f"{name} has no encoder rows"
        best = max(rows, key=lambda r: r["images_per_second"])
        return {"images_per_second": best["images_per_second"], "latency_p50_ms": best["latency_p50_ms"],
                "latency_p99_ms": best["latency_p99_ms"], "best_bucket": best["bucket"],
                "by_bucket": {str(r["bucket"]): round(r["images_per_second"], 1) for r in rows}}
    return after


def served_figures(name: str) -> After:
    """The best img/s over the levels; latency and server CPU at the highest concurrency (the loaded one)."""
    def after(out: Path) -> dict[str, Any] | str:
        data = read(out, name)
        rows = data.get("served") or []
        if not rows or max(r["images_per_second"] for r in rows) <= 0:
            return f"{name}: no request was answered ({sum(r['failures'] for r in rows)} failed)"
        loaded = max(rows, key=lambda r: r["concurrency"])
        best = max(rows, key=lambda r: r["images_per_second"])
        cpu = loaded.get("server_cpu") or {}
        client = loaded.get("client_cpu") or {}
        return {"images_per_second": best["images_per_second"], "best_concurrency": best["concurrency"],
                "latency_p50_ms": loaded["latency_p50_ms"], "latency_p99_ms": loaded["latency_p99_ms"],
                "cpu_ms_per_image": cpu.get("ms_per_image"), "concurrency": loaded["concurrency"],
                "failures": sum(r["failures"] for r in rows), "replicas": data.get("replicas"),
                "ingress_replicas": data.get("ingress_replicas"), "buckets": data.get("buckets"),
                "client_processes": client.get("client_processes"),
                "client_busiest_core_fraction": client.get("busiest_process_core_fraction"),
                "by_concurrency": {str(r["concurrency"]): round(r["images_per_second"], 1) for r in rows}}
    return after


def lanes_figures(name: str) -> After:
    """A lanes step (measure/lanes_service.py): the backfill alone as its img/s (one image a request), the
    interactive stream's p50/p99 beside it, the ratios, and the backfill's share of the served step's best img/s."""
    def after(out: Path) -> dict[str, Any] | str:
        data = read(out, name)
        windows = data.get("windows") or {}

        def stream(window: str, stream_name: str) -> dict[str, Any]:
            return next((r for r in windows.get(window, []) if r["name"] == stream_name), {})

        bulk, interactive = stream("bulk-alone", "bulk"), stream("mixed", "interactive")
        if not bulk.get("answered"):
            return f"{name}: the backfill alone got no answer ({bulk.get('failures', 'no')} failed)"
        ratios = data.get("ratios") or {}
        backfill = bulk["requests_per_second"]
        share = None
        if (out / "served.json").exists() and (served := served_figures("served.json")(out)) and not isinstance(
                served, str):
            share = round(backfill / served["images_per_second"], 2)
        cpu = (data.get("server_cpu") or {}).get("bulk-alone") or {}
        words = {"interactive_p99_beside_bulk_over_alone": "interactive p99 beside/alone",
                 "bulk_kept_of_alone_minus_interactive": "backfill kept",
                 "small_tenant_p99_beside_large_over_alone": "small tenant p99 beside/alone"}
        detail = "; ".join(f"{words[k]} {ratios[k]}" for k in words if ratios.get(k) is not None)
        detail += (f"; backfill {data.get('bulk_clients')} clients x {data.get('client_processes')} proc"
                   + (f", {share} of served's img/s" if share is not None else ""))
        return {"images_per_second": backfill, "latency_p50_ms": interactive.get("p50_ms"),
                "latency_p99_ms": interactive.get("p99_ms"), "cpu_ms_per_image": cpu.get("ms_per_image"),
                "failures": sum(r["failures"] for rows in windows.values() for r in rows),
                "backfill_of_served": share, "bulk_clients": data.get("bulk_clients"),
                "client_processes": data.get("client_processes"),
                "interactive_encoder": data.get("interactive_encoder"), **ratios, "detail": detail}
    return after


def determinism_figures(out: Path) -> dict[str, Any] | str:
    """`siglip-serve determinism`'s JSON: per configuration, how many comparisons were bit-equal and the largest
    difference; the comparisons that differ under `deterministic: true` named in the detail."""
    comparisons = read(out, "determinism.json").get("comparisons") or {}
    if not comparisons:
        return "determinism.json holds no comparisons"
    figures: dict[str, Any] = {}
    words = []
    for name, rows in comparisons.items():
        equal = sum(1 for r in rows if r["bit_equal"])
        figures[f"{name}_bit_equal"] = f"{equal}/{len(rows)}"
        figures[f"{name}_max_abs_diff"] = max((r["max_abs_diff"] for r in rows), default=0.0)
        differing = [r["comparison"] for r in rows if not r["bit_equal"]]
        words.append(f"{name}: {equal}/{len(rows)} bit-equal, max {figures[f'{name}_max_abs_diff']:.3g}"
                     + (f" ({', '.join(differing)})" if differing and name == "deterministic" else ""))
    return {**figures, "detail": "; ".join(words)}


def pytest_figures(must_pass: bool) -> After:
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
    keys = ("python", "cpus", "usable_cpus", "cuda_available", "gpus", "gpu", "gpu_memory_gib")
    return {k: info.get(k) for k in keys} | {"torch": info["modules"].get("torch")}


def why(result: StepResult | None) -> str:
    """A step that did not pass: its status and error, as the verdict names what it lacked."""
    if result is None:
        return "not run"
    return f"{result.status}: {result.error}" if result.error else result.status


def passed_figure(results: dict[str, StepResult], name: str, key: str = "images_per_second") -> Any:
    result = results.get(name)
    return result.figures.get(key) if result and result.status == "passed" else None


def derived(results: dict[str, StepResult], on_host_cores: bool) -> list[StepResult]:
    """The verdict and served / bare, from the steps' figures (skipped, saying which is missing)."""
    bare, served, host = (passed_figure(results, name) for name in ("encoder", "served", "host-ceiling"))
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


def priced(results: dict[str, StepResult], price: Price | None, bare_step: str) -> StepResult:
    """Each passed served step's dollars per million images (into its figures), and the `price` step: the
    served default's bare encoder (`bare_step`) at its best bucket for the whole instance, its accelerators'
    worth capped at the host ceiling where that step passed (measure/prices.py)."""
    step = StepResult("price", "$ per 1M images: the instance's price over its images", "skipped")
    if price is None:
        step.error = (f"no price: give --price-per-hour (and --accelerators), or --instance with a price table (the "
                      f"shipped one is empty: {FILL_HINT})")
        return step
    for name in SERVED_STEPS:
        if (ips := passed_figure(results, name)) is not None:
            results[name].figures["usd_per_million_images"] = usd_per_million(ips, price.usd_per_hour)
    bare, bucket = passed_figure(results, bare_step), passed_figure(results, bare_step, "best_bucket")
    if bare is None or bucket is None:
        step.error = f"served steps priced; the bare encoder needs {bare_step} ({why(results.get(bare_step))})"
        return step
    priced_bare = bare_price(price, int(bucket), bare, passed_figure(results, "host-ceiling"))
    step.status = "passed"
    step.figures = {"price": price.as_dict(), "bare": asdict(priced_bare),
                    "images_per_second": priced_bare.images_per_second,
                    "usd_per_million_images": priced_bare.usd_per_million_images,
                    "detail": f"{bare_step}, bucket {bucket}: {bare:.1f} img/s x {price.accelerators}"
                              + (", capped at the host ceiling's" if priced_bare.capped_by_host_ceiling else " =")
                              + f" {priced_bare.images_per_second:.1f} img/s at {price.label()}"}
    return step


def cell(value: Any, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec) if isinstance(value, float) else str(value)


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
        detail = r.error or f.get("detail") or "; ".join(f"{k} {v}" for k, v in f.items() if k in DETAIL_KEYS)
        row = [r.name, r.status.upper(), f"{r.seconds:.1f}", cell(f.get("images_per_second")),
               cell(f.get("latency_p50_ms")), cell(f.get("latency_p99_ms")), cell(f.get("cpu_ms_per_image")),
               dollars(f.get("usd_per_million_images"), ""), client_cell(f),
               str(detail).replace("|", "/").replace("\n", " ")]
        lines.append("| " + " | ".join(row) + " |")
    return lines
