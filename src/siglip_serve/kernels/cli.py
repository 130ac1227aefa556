"""``siglip-serve kernels ...`` or ``python -m siglip_serve.kernels ...``:
matmul, mlp, siglip, profile-json, profile-neff, check.

Heavy modules (torch, matplotlib) are imported inside each subcommand so that
``profile-json`` and ``--help`` work without them.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from siglip_serve.core.cli import run_main, setup_logging
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable

log = logging.getLogger("siglip_serve.kernels")


def _add_device_args(p: argparse.ArgumentParser, default_dtype: str) -> None:
    p.add_argument("--device", choices=("auto", "neuron", "cuda", "cpu"), default="auto",
                   help="auto tries neuron, then cuda, then cpu (cpu numbers are not NPU numbers)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help=f"default: {default_dtype} on neuron/cuda, float32 on cpu")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls; the first one compiles")
    p.add_argument("--iterations", type=int, default=20, help="timed calls")
    p.add_argument("--lnc", type=int, default=None,
                   help="physical NeuronCores per logical core; default and, on a NeuronCore, the only accepted "
                        "value: the runtime's (NEURON_LOGICAL_NC_CONFIG, else the trn2 default 2)")
    p.add_argument("--json", type=Path, help="write results as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve kernels", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    mm = sub.add_parser("matmul", help="matmul latency vs NeuronCore tiling (seed 001)")
    mm.add_argument("--mode", choices=("llm", "tiling", "sweep"), default="tiling")
    mm.add_argument("--shapes", help="custom MxKxN list, e.g. 128x256x512,1x4096x4096 (overrides --mode)")
    _add_device_args(mm, "bfloat16")
    mm.add_argument("--csv", type=Path, help="write the CSV here")
    mm.add_argument("--plot", type=Path, help="write a PNG plot here")

    mlp = sub.add_parser("mlp", help="gated-MLP benchmark: compiler path vs NKI kernel path (seed 002)")
    mlp.add_argument("--configs", default="1x128x1024x512,1x256x2048x1024",
                     help="comma-separated BxSxHxI (batch x seq x hidden x intermediate)")
    mlp.add_argument("--paths", default="compiler,nki", help="comma-separated: compiler,nki")
    _add_device_args(mlp, "bfloat16")

    sg = sub.add_parser("siglip", help="SigLIP-SO400M kernels (LayerNorm, MLP+GELU, softmax@729) vs trn2 roofline")
    _add_device_args(sg, "bfloat16")
    sg.add_argument("--images", type=int, default=1, help="images per call (tokens = 729 x images)")

    pj = sub.add_parser("profile-json", help="parse Neuron Explorer summaries (summary-json, or the legacy json) "
                                             "and compare kernels")
    pj.add_argument("paths", nargs="+", type=Path)
    pj.add_argument("--kernel", action="append", default=[],
                    help="kernel name per file, in order (default: file stem)")
    pj.add_argument("--config", action="append", default=[], help="config label per file, in order")
    pj.add_argument("--json", type=Path, help="write the parsed summaries and comparisons as JSON")

    pn = sub.add_parser("profile-neff", help="device time of saved NEFFs with neuron-explorer capture (trn2)")
    pn.add_argument("neffs", nargs="+", type=Path,
                    help="NEFF files, or directories a run saved them in (NEURON_FRAMEWORK_DEBUG=1 on the 2.31 trace "
                         "line; NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=1 "
                         "NEURON_RT_INSPECT_OUTPUT_DIR=neffs on TorchNeuron)")
    pn.add_argument("--nth-exec", type=int, default=2, help="execution to profile (2 skips warm-up effects)")
    pn.add_argument("--workdir", type=Path, default=Path("profiles"), help="where traces and JSON go")
    pn.add_argument("--json", type=Path, help="write the device times as JSON")

    ck = sub.add_parser("check", help="golden references vs torch; NKI kernels vs references where nki exists")
    ck.add_argument("--seed", type=int, default=0)
    ck.add_argument("--kernels-on", choices=("simulator", "neuron", "none"), default="simulator",
                    help="where to run the NKI kernels; 'none' checks the references only. Kernels asked "
                         "for but skipped (no real nki) fail the check with exit code 3")
    ck.add_argument("--json", type=Path)
    return parser


def _lnc(args: argparse.Namespace, device) -> int:
    from siglip_serve.kernels.lnc import resolve_lnc

    return resolve_lnc(args.lnc, on_neuron=device.is_npu)


def _dtype(args: argparse.Namespace, device, default: str) -> str:
    # CPUs without native bf16 matmul emulate it slowly; float32 keeps the CPU fallback meaningful.
    if args.dtype:
        return args.dtype
    return "float32" if device.kind == "cpu" else default


def _write_json(path: Path | None, doc: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        print(f"wrote {path}")


def cmd_matmul(args: argparse.Namespace) -> int:
    from siglip_serve.kernels import matmul_profiler as mp
    from siglip_serve.kernels.device import resolve_device

    shapes = mp.parse_shapes(args.shapes) if args.shapes else mp.shapes_for_mode(args.mode)
    device = resolve_device(args.device)
    dtype = _dtype(args, device, "bfloat16")
    lnc = _lnc(args, device)
    results = mp.profile_all(shapes, device, dtype=dtype, warmup=args.warmup, iterations=args.iterations, lnc=lnc)
    title = (f"matmul --mode {'custom' if args.shapes else args.mode} on {device.description}, {dtype}, "
             f"trn2 roofline at LNC={lnc}")
    if not device.is_npu:
        title += "\n(NOT NPU numbers: %trn2 roof compares this device's time with the trn2 lower bound)"
    print(mp.format_table(results, title))
    if args.csv:
        print(f"wrote {mp.write_csv(results, args.csv)}")
    if args.plot:
        from siglip_serve.kernels.plotting import plot_matmul

        print(f"wrote {plot_matmul(results, args.plot, title.splitlines()[0])}")
    if args.json:
        print(f"wrote {mp.write_json(results, args.json, device, args.mode if not args.shapes else 'custom', lnc)}")
    return 0


def cmd_mlp(args: argparse.Namespace) -> int:
    from siglip_serve.kernels import mlp
    from siglip_serve.kernels.device import resolve_device

    configs = [mlp.MLPConfig.parse(c) for c in args.configs.split(",") if c.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    device = resolve_device(args.device)
    dtype = _dtype(args, device, "bfloat16")
    lnc = _lnc(args, device)
    results, skipped = [], []
    for cfg in configs:
        for path in paths:
            reason = mlp.skip_reason(path, device)
            if reason:
                skipped.append((path, cfg.label, reason))
                continue
            results.append(mlp.benchmark_mlp(cfg, device, path, dtype, args.warmup, args.iterations, lnc))
    print(f"gated MLP on {device.description}, {dtype}, LNC={lnc}")
    print(mlp.format_mlp_table(results, skipped))
    _write_json(args.json, {"benchmark": "mlp", "device": device.kind, "device_description": device.description,
                            "npu_numbers": device.is_npu, "lnc": lnc, "timing": device.timing,
                            "results": [asdict(r) for r in results],
                            "skipped": [dict(zip(("path", "config", "reason"), s, strict=True)) for s in skipped]})
    return 0


def cmd_siglip(args: argparse.Namespace) -> int:
    from siglip_serve.kernels import siglip
    from siglip_serve.kernels.device import resolve_device
    from siglip_serve.kernels.nki_launch import nki_status

    device = resolve_device(args.device)
    if not device.is_npu:
        raise KernelUnavailable(f"the SigLIP kernel benchmark needs a NeuronCore (device is {device.kind}); "
                                "`kernels check` runs these kernels on the NKI simulator against their goldens")
    usable, reason = nki_status()
    if not usable:
        raise KernelUnavailable(f"the SigLIP kernel benchmark needs the Neuron SDK's nki: {reason}")
    if args.images < 1:
        raise KernelInputError("--images must be >= 1")
    dtype = _dtype(args, device, "bfloat16")
    runs = siglip.make_runs(_lnc(args, device), images=args.images, dtype=dtype)
    results = siglip.benchmark(runs, device, dtype, args.warmup, args.iterations)
    print(f"SigLIP-SO400M kernels on {device.description}, {args.images} image(s)")
    print(siglip.format_table(results))
    _write_json(args.json, siglip.as_json(results, device))
    return 0


def cmd_profile_json(args: argparse.Namespace) -> int:
    from siglip_serve.kernels.profile_json import comparison_rows, format_comparison, load_summary

    for flag, values in (("--kernel", args.kernel), ("--config", args.config)):
        if values and len(values) != len(args.paths):
            raise KernelInputError(f"{flag} given {len(values)} times for {len(args.paths)} files")
    summaries = [
        load_summary(path, args.kernel[i] if args.kernel else None, args.config[i] if args.config else "")
        for i, path in enumerate(args.paths)
    ]
    print(format_comparison(summaries))
    _write_json(args.json, {"summaries": [s.as_dict() for s in summaries],
                            "comparisons": comparison_rows(summaries)})
    return 0


def cmd_profile_neff(args: argparse.Namespace) -> int:
    from siglip_serve.kernels.device_timing import find_neffs, format_device_times, profile_neff

    neffs = [n for p in args.neffs for n in (find_neffs(p) if p.is_dir() else [p])]
    if not neffs:
        raise KernelInputError("no .neff files found; run the benchmark with NEURON_FRAMEWORK_DEBUG=1 (2.31 trace "
                               "line) or NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=1 "
                               "NEURON_RT_INSPECT_OUTPUT_DIR=neffs (TorchNeuron) first")
    times = []
    for i, neff in enumerate(neffs, 1):
        print(f"[{i}/{len(neffs)}] capturing {neff}", file=sys.stderr)
        times.append(profile_neff(neff, args.workdir, args.nth_exec))
    print(format_device_times(times))
    _write_json(args.json, {"timing": "device", "results": [t.as_dict() for t in times]})
    return 0


# check's exit codes: 0 passed, 1 a mismatch, 3 kernels asked for but skipped (2 is any usage error).
EXIT_KERNELS_SKIPPED = 3


def cmd_check(args: argparse.Namespace) -> int:
    from siglip_serve.kernels.check import run_checks

    report = run_checks(seed=args.seed, kernels_on=args.kernels_on)
    print(report.format())
    _write_json(args.json, report.as_dict())
    if report.mismatches:
        return 1
    return EXIT_KERNELS_SKIPPED if report.kernels_skipped_reason else 0


COMMANDS = {"matmul": cmd_matmul, "mlp": cmd_mlp, "siglip": cmd_siglip, "profile-json": cmd_profile_json,
            "profile-neff": cmd_profile_neff, "check": cmd_check}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(logging.INFO if args.verbose else logging.WARNING)
    # Bad shapes, tile-limit violations, missing devices (kernels/errors.py): one `error:` line, not a traceback.
    return run_main(lambda: COMMANDS[args.command](args))
