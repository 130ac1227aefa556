"""Matmul latency profiler: shape suites, timing on neuron/cuda/cpu, CSV/JSON/table output.

Each shape is compiled once (the warm-up's first call) and then timed; on Neuron the
torch-xla compile counter is read around the timed loop so a recompiling shape fails
loudly instead of reporting compile time as latency.
"""
from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from siglip_serve.kernels.device import Device, LatencyStats, RecompileError, ResultMismatch, torch_dtype
from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.hardware import ROOFLINE_SOURCE
from siglip_serve.kernels.lnc import runtime_kernel_lnc
from siglip_serve.kernels.tiling import MatmulConfig, achieved_tflops, percent_of_roofline, roofline

log = logging.getLogger(__name__)

MODES = ("llm", "tiling", "sweep")

# The seed's columns first, in its order, so old CSV readers keep working.
SEED_COLUMNS = ("M", "K", "N", "latency_ms", "num_tiles_M", "num_tiles_K", "num_tiles_N", "total_tiles")
CSV_COLUMNS = SEED_COLUMNS + (
    "device",
    "dtype",
    "latency_p50_ms",
    "latency_p99_ms",
    "tflops_at_p50",
    "trn2_roofline_ms",
    "pct_trn2_roofline_at_p50",
    "tile_utilization",
    "first_call_ms",
    "iterations",
    "scenario",
    "timing",
)


@dataclass(frozen=True)
class Shape:
    config: MatmulConfig
    scenario: str


def llm_shapes(hidden: int = 4096, ffn_mult: int = 4) -> list[Shape]:
    """Prefill (M = batch*seq), decode (M = batch) and FFN up/down projections, plus SigLIP's FFN."""
    shapes = [Shape(MatmulConfig(seq, hidden, hidden), f"prefill b=1 s={seq}") for seq in (128, 512, 2048)]
    shapes += [Shape(MatmulConfig(batch, hidden, hidden), f"decode b={batch}") for batch in (1, 8, 32, 64)]
    inter = hidden * ffn_mult
    for m, label in ((512, "prefill s=512"), (8, "decode b=8")):
        shapes.append(Shape(MatmulConfig(m, hidden, inter), f"ffn up {label}"))
        shapes.append(Shape(MatmulConfig(m, inter, hidden), f"ffn down {label}"))
    # SigLIP-SO400M/14 at 384px: 729 patch tokens, width 1152, MLP 4304.
    shapes.append(Shape(MatmulConfig(729, 1152, 4304), "siglip-so400m ffn up (1 image)"))
    shapes.append(Shape(MatmulConfig(729, 4304, 1152), "siglip-so400m ffn down (1 image)"))
    return shapes


def tiling_shapes() -> list[Shape]:
    """One dimension walks across a tile boundary while the others sit on exact multiples."""
    shapes = [Shape(MatmulConfig(m, 512, 512), f"M boundary {m}") for m in (127, 128, 129, 255, 256, 257)]
    shapes += [Shape(MatmulConfig(128, k, 512), f"K boundary {k}") for k in (127, 128, 129, 255, 256, 257)]
    shapes += [Shape(MatmulConfig(128, 128, n), f"N boundary {n}") for n in (511, 512, 513, 1023, 1024, 1025)]
    return shapes


def sweep_shapes() -> list[Shape]:
    return [
        Shape(MatmulConfig(m, k, n), "sweep")
        for m in (1, 16, 128, 512, 2048)
        for k in (256, 1024, 4096)
        for n in (256, 1024, 4096)
    ]


def shapes_for_mode(mode: str) -> list[Shape]:
    builders: dict[str, Callable[[], list[Shape]]] = {"llm": llm_shapes, "tiling": tiling_shapes, "sweep": sweep_shapes}
    if mode not in builders:
        raise KernelInputError(f"mode must be one of {MODES}, got {mode!r}")
    return builders[mode]()


def parse_shapes(text: str) -> list[Shape]:
    """``"128x256x512,1x4096x4096"`` -> shapes labelled ``custom``."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            m, k, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise KernelInputError(f"shape {item!r} is not MxKxN") from None
        shapes.append(Shape(MatmulConfig(m, k, n), "custom"))
    if not shapes:
        raise KernelInputError("no shapes given")
    return shapes


@dataclass(frozen=True)
class MatmulResult:
    M: int
    K: int
    N: int
    latency_ms: float  # mean of the timed iterations (the seed's column)
    num_tiles_M: int
    num_tiles_K: int
    num_tiles_N: int
    total_tiles: int
    device: str
    dtype: str
    latency_p50_ms: float
    latency_p99_ms: float
    tflops_at_p50: float
    trn2_roofline_ms: float
    pct_trn2_roofline_at_p50: float
    tile_utilization: float
    first_call_ms: float  # first call incl. any compilation
    iterations: int
    scenario: str
    timing: str  # device.WALL_CLOCK_TIMING or device.DEVICE_TIMING

    def row(self) -> dict:
        return {column: getattr(self, column) for column in CSV_COLUMNS}


def profile_matmul(
    shape: Shape,
    device: Device,
    dtype: str = "bfloat16",
    warmup: int = 3,
    iterations: int = 20,
    lnc: int | None = None,
    seed: int = 0,
) -> MatmulResult:
    """Time ``A @ B`` for one shape; the first warm-up call absorbs the compile.

    ``lnc`` (default: the Neuron runtime's) picks the trn2 roofline the time is compared with.
    """
    import torch

    lnc = runtime_kernel_lnc() if lnc is None else lnc

    if warmup < 1:
        raise KernelInputError("warmup must be >= 1: the first call compiles and must not be timed")
    cfg = shape.config
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(cfg.M, cfg.K, generator=gen).to(torch_dtype(dtype)).to(device.torch_device)
    b = torch.randn(cfg.K, cfg.N, generator=gen).to(torch_dtype(dtype)).to(device.torch_device)
    device.synchronize()

    def call():
        return torch.matmul(a, b)

    start = time.perf_counter()
    device.run_synced(call)
    first_call_ms = (time.perf_counter() - start) * 1e3
    for _ in range(warmup - 1):
        device.run_synced(call)

    compiles_before = device.compile_count()
    samples = device.time_calls(call, iterations, check=_matmul_check(a, b, cfg))
    compiles_after = device.compile_count()
    if compiles_before is not None and compiles_after is not None and compiles_after != compiles_before:
        raise RecompileError(
            f"{cfg}: {compiles_after - compiles_before} compilation(s) during the timed loop"
        )

    stats = LatencyStats.from_seconds(samples)
    p50_s = stats.latency_p50_ms / 1e3
    return MatmulResult(
        M=cfg.M,
        K=cfg.K,
        N=cfg.N,
        latency_ms=stats.latency_mean_ms,
        num_tiles_M=cfg.num_tiles_M,
        num_tiles_K=cfg.num_tiles_K,
        num_tiles_N=cfg.num_tiles_N,
        total_tiles=cfg.total_tiles,
        device=device.kind,
        dtype=dtype,
        latency_p50_ms=stats.latency_p50_ms,
        latency_p99_ms=stats.latency_p99_ms,
        tflops_at_p50=achieved_tflops(cfg, p50_s),
        trn2_roofline_ms=roofline(cfg, dtype, lnc).time_s * 1e3,
        pct_trn2_roofline_at_p50=percent_of_roofline(cfg, dtype, p50_s, lnc),
        tile_utilization=cfg.tile_utilization,
        first_call_ms=first_call_ms,
        iterations=stats.iterations,
        scenario=shape.scenario,
        timing=device.timing,
    )


def _matmul_check(a, b, cfg: MatmulConfig):
    """Once per shape: the timed result has C's shape and its first row matches a float64 host
    product (a row keeps the check cheap for the large shapes)."""
    import torch

    a0 = a[0:1].double().cpu()
    b_host = b.double().cpu()
    # Relative to the row's largest value: a bf16/fp16 result is rounded to 8/11 mantissa bits.
    tol = 1e-4 if a.dtype == torch.float32 else 2e-2

    def check(out) -> None:
        if tuple(out.shape) != (cfg.M, cfg.N):
            raise ResultMismatch(f"{cfg}: timed call returned shape {tuple(out.shape)}")
        expected = a0 @ b_host
        err = float((out[0:1].double().cpu() - expected).abs().max())
        if not err <= tol * max(1.0, float(expected.abs().max())):
            raise ResultMismatch(f"{cfg}: timed matmul's first row is off by {err:.3g} (tolerance {tol:.3g})")

    return check


def profile_all(shapes: Iterable[Shape], device: Device, **kwargs) -> list[MatmulResult]:
    results = []
    for shape in shapes:
        log.info("profiling %s (%s) on %s", shape.config, shape.scenario, device.kind)
        results.append(profile_matmul(shape, device, **kwargs))
    return results


def write_csv(results: list[MatmulResult], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for result in results:
            writer.writerow(result.row())
    return path


def write_json(results: list[MatmulResult], path: str | Path, device: Device, mode: str,
               lnc: int | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "matmul",
        "mode": mode,
        "lnc": runtime_kernel_lnc() if lnc is None else lnc,
        "device": device.kind,
        "device_description": device.description,
        "npu_numbers": device.is_npu,
        "timing": device.timing,
        "roofline_source": ROOFLINE_SOURCE,
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


def format_table(results: list[MatmulResult], title: str = "") -> str:
    header = (
        f"{'M':>6} {'K':>6} {'N':>6} {'tiles M/K/N':>12} {'total':>6} {'util':>5} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'TFLOP/s':>8} {'%trn2 roof':>10}  scenario"
    )
    lines = [title] if title else []
    timings = sorted({r.timing for r in results})
    if timings:
        lines.append(f"timing: {', '.join(timings)}")
    lines += [header, "-" * len(header)]
    for r in results:
        tiles = f"{r.num_tiles_M}/{r.num_tiles_K}/{r.num_tiles_N}"
        lines.append(
            f"{r.M:>6} {r.K:>6} {r.N:>6} {tiles:>12} {r.total_tiles:>6} {r.tile_utilization:>5.2f} "
            f"{r.latency_p50_ms:>9.4f} {r.latency_p99_ms:>9.4f} {r.tflops_at_p50:>8.3f} "
            f"{r.pct_trn2_roofline_at_p50:>10.2f}  {r.scenario}"
        )
    return "\n".join(lines)
