"""`siglip-serve determinism`: the comparisons (determinism/comparisons.py) with the model as configured
and with `deterministic: true`, and with `--cost-rounds N` what the second costs (determinism/cost.py);
a table on stdout and, with `--json`, every figure.

    siglip-serve determinism --model tiny-siglip --json determinism.json
    siglip-serve determinism --model ViT-B-16-SigLIP --random-weights --skip compare --cost-rounds 3

Exit 1 with `--require-bit-equal` where a deterministic comparison is not bit-equal (the CPU guarantee,
docs/reproducibility.md), else 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from siglip_serve.core.cli import add_log_level, run_main, setup_logging
from siglip_serve.core.host import usable_cpus
from siglip_serve.models.cli_args import add_model_arguments, settings_from_args, validate_settings
from siglip_serve.models.settings import ModelSettings

log = logging.getLogger("siglip_serve.determinism")

CONFIGURED, DETERMINISTIC = "configured", "deterministic"
PARTS = ("compare", "replica", "text", "cost")


def configurations(settings: ModelSettings) -> dict[str, ModelSettings]:
    """The model as given, and the same with `deterministic: true` (its one thread included)."""
    fixed = {**settings.model_dump(), "deterministic": True, "torch_threads": None}
    return {CONFIGURED: settings, DETERMINISTIC: validate_settings(fixed)}


def run(settings: ModelSettings, skip: Sequence[str] = (), cost_rounds: int = 0,
        only: Sequence[str] = (CONFIGURED, DETERMINISTIC)) -> dict[str, Any]:
    """Every comparison per configuration (those in `only`) and, with `cost_rounds`, the cost; the JSON the
    command writes."""
    from siglip_serve.determinism.comparisons import alone, compare_all, pixels, sample_files
    from siglip_serve.determinism.cost import measure_cost
    from siglip_serve.models.backends.implementation import create_encoder

    configs = {name: config for name, config in configurations(settings).items() if name in only}
    encoders = {name: create_encoder(config) for name, config in configs.items()}
    first = next(iter(encoders.values()))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
        "machine": f"{platform.machine()}, {usable_cpus()} usable core(s) of {os.cpu_count()}",
        "model": first.info.name, "weights": first.info.weights, "backend": settings.backend,
        "buckets": list(first.buckets),
        "configurations": {name: {"deterministic": c.deterministic, "torch_threads": encoders[name].describe().get(
            "torch_threads")} for name, c in configs.items()},
        "comparisons": {}, "cost": []}
    if "compare" not in skip:
        for name, config in configs.items():
            log.info("comparisons, %s", name)
            result["comparisons"][name] = compare_all(config, encoders[name], first.info.name,
                                                      "text" not in skip, "replica" not in skip)
    if cost_rounds and "cost" not in skip:
        images = pixels(first, list(sample_files().values()))
        alone(first, images[:1])
        result["cost"] = measure_cost(encoders, images, cost_rounds)
    return result


def _cell(entry: dict[str, Any]) -> str:
    return "bit-equal" if entry["bit_equal"] else f"max {entry['max_abs_diff']:.3g}"


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{result['model']} ({result['weights']}), {result['backend']}, buckets {result['buckets']}; "
             f"{result['machine']}; {result['date']}"]
    names = list(result["comparisons"])
    if names:
        rows: dict[str, dict[str, Any]] = {entry["comparison"]: {} for name in names
                                           for entry in result["comparisons"][name]}
        for name in names:
            for entry in result["comparisons"][name]:
                rows[entry["comparison"]][name] = entry
        width = max(map(len, rows))
        lines.append(f"{'comparison':<{width}}  " + "  ".join(f"{n:<14}" for n in names) + "  detail")
        for comparison, cells in rows.items():
            detail = next(iter(cells.values()))["detail"]
            lines.append(f"{comparison:<{width}}  " + "  ".join(f"{_cell(cells[n]) if n in cells else '-':<14}"
                                                              for n in names) + f"  {detail}")
    for cost in result["cost"]:
        lines.append(f"cost {cost['configuration']:<14} {cost['workload']:<12} threads {cost['torch_threads']}: "
                     f"{cost['img_per_s_median']:8.2f} img/s, {cost['cpu_ms_per_image_median']:8.2f} CPU-ms/img "
                     f"(rounds: {cost['img_per_s']})")
    return "\n".join(lines)


def not_bit_equal(result: dict[str, Any]) -> list[str]:
    """The deterministic configuration's comparisons that differ."""
    return [entry["comparison"] for entry in result["comparisons"].get(DETERMINISTIC, []) if not entry["bit_equal"]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve determinism", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(PARTS)}")
    parser.add_argument("--configurations", default=f"{CONFIGURED},{DETERMINISTIC}",
                        help=f"which to run: {CONFIGURED} (the settings as given), {DETERMINISTIC} (the same with "
                             "deterministic: true), or both")
    parser.add_argument("--cost-rounds", type=int, default=0,
                        help="time both configurations this many rounds, alternating (0: no timing)")
    parser.add_argument("--require-bit-equal", action="store_true",
                        help="exit 1 where a deterministic comparison is not bit-equal")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the results here")
    add_log_level(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return run_main(lambda: _main(args), log)


def _main(args: argparse.Namespace) -> int:
    skip = [part for part in args.skip.replace(" ", "").split(",") if part]
    unknown = sorted(set(skip) - set(PARTS))
    if unknown:
        raise SystemExit(f"--skip: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    only = [name for name in args.configurations.replace(" ", "").split(",") if name]
    if not only or set(only) - {CONFIGURED, DETERMINISTIC}:
        raise SystemExit(f"--configurations: choose from {CONFIGURED}, {DETERMINISTIC}")
    result = run(settings_from_args(args), skip, args.cost_rounds, only)
    print(format_table(result))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    differing = not_bit_equal(result)
    if args.require_bit_equal and differing:
        log.error("deterministic: not bit-equal: %s", ", ".join(differing))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
