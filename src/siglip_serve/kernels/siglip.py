"""SigLIP-SO400M/14-384 kernels: inputs, validation, golden references, trn2 rooflines, benchmark.

The kernels (:mod:`siglip_serve.kernels.nki_siglip`) are the three blocks a SigLIP engineer looks at:
LayerNorm over width 1152, the MLP (1152 -> 4304 -> 1152, bias, tanh-GELU; 4304 is not a
multiple of 128) and the attention softmax over 729 keys (27 x 27 patches at 384 px, 16 heads).
Each run carries its NumPy golden (:mod:`siglip_serve.kernels.references`). On a NeuronCore the benchmark
times each kernel through torch-xla at the runtime's LNC (``timing:
wall_clock_including_dispatch``) and compares it with the trn2 roofline of
:func:`siglip_serve.kernels.tiling.workload_roofline`; ``kernels profile-neff`` gives the device time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from siglip_serve.kernels import references
from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.hardware import GEMM_MOVING_FMAX, PMAX, ROOFLINE_SOURCE, check_sbuf_budget, sbuf_budget_source
from siglip_serve.kernels.nki_launch import KernelRun, launchable, time_kernel
from siglip_serve.kernels.tiling import DTYPE_BYTES, workload_roofline

MODULE = "siglip_serve.kernels.nki_siglip"
# open_clip ViT-SO400M-14-SigLIP-384: width 1152, MLP 4304, 16 heads of 72, 384/14 = 27 -> 729 tokens.
WIDTH, INTER, HEADS, HEAD_DIM, TOKENS, LN_EPS = 1152, 4304, 16, 72, 729, 1e-6


def validate_layer_norm(tokens: int, width: int, itemsize: int) -> None:
    if tokens < 1 or width < 1:
        raise KernelInputError(f"layer_norm: empty input {tokens}x{width}")
    # gamma/beta broadcast, xc, sq, y in fp32; x and the result in the input dtype.
    check_sbuf_budget(5 * width * 4 + 2 * width * itemsize, "layer_norm row tiles")


def mlp_sbuf_bytes(width: int, inter: int, itemsize: int) -> int:
    """SBUF bytes per partition the MLP kernel keeps live: SO400M in bf16 needs 201,036, which leaves
    11,692 of the 212,728 a kernel can use (kernels/hardware.py sbuf_budget)."""
    n_d, n_i, t_tile = width // PMAX, -(-inter // PMAX), GEMM_MOVING_FMAX
    return (
        (n_d * inter + n_i * width) * itemsize  # resident w1 and w2 tiles
        + (n_d + n_i) * 4  # bias tiles (fp32; each loaded in its own dtype, then widened)
        + (n_d + n_i + 1) * t_tile * itemsize  # x tiles, h tiles, one output tile
    )


def validate_mlp(width: int, inter: int, itemsize: int) -> None:
    if width % PMAX:
        raise KernelInputError(f"mlp_gelu: width {width} must be a multiple of {PMAX}")
    check_sbuf_budget(mlp_sbuf_bytes(width, inter, itemsize), "mlp_gelu resident weights")


def validate_softmax(keys: int, itemsize: int) -> None:
    if keys < 1:
        raise KernelInputError("softmax: no keys")
    check_sbuf_budget(keys * (2 * itemsize + 4), "softmax row tiles")


# ``dtype`` below is the dtype the kernel will run in (inputs are float32 NumPy either way);
# it decides the SBUF budget the shapes are validated against.

def prepare_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, lnc: int,
                       eps: float = LN_EPS, dtype: str = "float32") -> KernelRun:
    validate_layer_norm(x.shape[0], x.shape[1], DTYPE_BYTES[dtype])
    return KernelRun("siglip_layer_norm", "layer_norm", (x, gamma.reshape(1, -1), beta.reshape(1, -1), eps),
                     references.layer_norm(x, gamma, beta, eps), lambda out: np.asarray(out), lnc=lnc, module=MODULE)


def prepare_mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
                lnc: int, dtype: str = "float32") -> KernelRun:
    validate_mlp(x.shape[1], w1.shape[1], DTYPE_BYTES[dtype])
    return KernelRun("siglip_mlp_gelu", "mlp_gelu_t",
                     (np.ascontiguousarray(x.T), w1, b1.reshape(-1, 1), w2, b2.reshape(-1, 1)),
                     references.mlp_gelu(x, w1, b1, w2, b2), lambda out: np.asarray(out).T, lnc=lnc, module=MODULE)


def prepare_softmax(scores: np.ndarray, scale: float, lnc: int, dtype: str = "float32") -> KernelRun:
    validate_softmax(scores.shape[1], DTYPE_BYTES[dtype])
    return KernelRun("siglip_attention_softmax", "softmax_rows", (scores, scale),
                     references.softmax(scores, scale), lambda out: np.asarray(out), lnc=lnc, module=MODULE)


def make_runs(lnc: int, images: int = 1, seed: int = 0, width: int = WIDTH, inter: int = INTER,
              tokens: int = TOKENS, heads: int = HEADS, dtype: str = "float32") -> list[KernelRun]:
    """One run per kernel for ``images`` images; weights fan-in scaled so outputs are O(1)."""
    rng = np.random.default_rng(seed)
    t = images * tokens

    def rand(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return [
        prepare_layer_norm(rand(t, width), 1.0 + rand(width, scale=0.1), rand(width, scale=0.1), lnc,
                           dtype=dtype),
        prepare_mlp(rand(t, width), rand(width, inter, scale=width ** -0.5), rand(inter, scale=0.1),
                    rand(inter, width, scale=inter ** -0.5), rand(width, scale=0.1), lnc, dtype=dtype),
        prepare_softmax(rand(images * heads * tokens, tokens, scale=3.0), HEAD_DIM ** -0.5, lnc, dtype=dtype),
    ]


def small_runs(lnc: int, seed: int = 0) -> list[KernelRun]:
    """The same kernels on small shapes with SigLIP's raggedness: an 89-row token tile, an
    intermediate 80 past a multiple of 128, 729 keys. Quick enough for the simulator."""
    ln, mlp, _ = make_runs(lnc, seed=seed, width=256, inter=336, tokens=217, heads=1)
    scores = (np.random.default_rng(seed + 1).standard_normal((200, TOKENS)) * 3.0).astype(np.float32)
    return [ln, mlp, prepare_softmax(scores, HEAD_DIM ** -0.5, lnc)]


def workload(run: KernelRun, dtype: str) -> tuple[float, float]:
    """(FLOPs, least HBM bytes) of one run, for the roofline."""
    size = DTYPE_BYTES[dtype]
    if run.kernel == "layer_norm":
        t, d = run.args[0].shape
        return 8.0 * t * d, (2 * t * d + 2 * d) * size
    if run.kernel == "mlp_gelu_t":
        d, t = run.args[0].shape
        i = run.args[1].shape[1]
        return 4.0 * t * d * i, (2 * t * d + 2 * d * i + i + d) * size
    rows, keys = run.args[0].shape
    return 5.0 * rows * keys, 2 * rows * keys * size


@dataclass(frozen=True)
class SiglipResult:
    kernel: str
    shape: str
    dtype: str
    lnc: int
    latency_p50_us: float
    latency_p99_us: float
    trn2_roofline_us: float
    bound: str
    pct_trn2_roofline_at_p50: float
    achieved_tflops: float
    achieved_gbytes_per_s: float
    iterations: int
    timing: str


# Output tolerance per kernel for bf16 inputs (fp32 accumulation): LN and softmax outputs are
# O(1) and <= 1; the MLP sums 4304 bf16 products.
BF16_ATOL = {"layer_norm": 5e-2, "mlp_gelu_t": 1e-1, "softmax_rows": 1e-2}


def benchmark(runs: list[KernelRun], device: Any, dtype: str, warmup: int, iterations: int) -> list[SiglipResult]:
    results = []
    for run in runs:
        atol = BF16_ATOL[run.kernel] if dtype == "bfloat16" else 2e-3
        _, timing = time_kernel(run, launchable(run), device, warmup, iterations, rtol=atol, atol=atol, dtype=dtype)
        flops, nbytes = workload(run, dtype)
        roof = workload_roofline(flops, nbytes, dtype, run.lnc)
        p50_s = timing.latency_p50_us / 1e6
        results.append(SiglipResult(
            kernel=run.name, shape="x".join(str(v) for v in run.args[0].shape), dtype=dtype, lnc=run.lnc,
            latency_p50_us=timing.latency_p50_us, latency_p99_us=timing.latency_p99_us,
            trn2_roofline_us=roof.time_s * 1e6, bound=roof.bound,
            pct_trn2_roofline_at_p50=100.0 * roof.time_s / p50_s, achieved_tflops=flops / p50_s / 1e12,
            achieved_gbytes_per_s=nbytes / p50_s / 1e9, iterations=timing.iterations, timing=timing.timing))
    return results


def format_table(results: list[SiglipResult]) -> str:
    header = (f"{'kernel':<26} {'input':>11} {'dtype':>8} {'LNC':>3} {'p50 us':>9} {'p99 us':>9} "
              f"{'roof us':>8} {'bound':>7} {'%roof':>6} {'TFLOP/s':>8} {'GB/s':>7}  timing")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.kernel:<26} {r.shape:>11} {r.dtype:>8} {r.lnc:>3} {r.latency_p50_us:>9.1f} "
                     f"{r.latency_p99_us:>9.1f} {r.trn2_roofline_us:>8.1f} {r.bound:>7} "
                     f"{r.pct_trn2_roofline_at_p50:>6.2f} {r.achieved_tflops:>8.3f} "
                     f"{r.achieved_gbytes_per_s:>7.1f}  {r.timing}")
    return "\n".join(lines)


def as_json(results: list[SiglipResult], device: Any) -> dict:
    itemsize = DTYPE_BYTES[results[0].dtype] if results else DTYPE_BYTES["bfloat16"]
    budget, source = sbuf_budget_source()
    return {"benchmark": "siglip-kernels", "device": device.kind, "device_description": device.description,
            "timing": device.timing, "roofline_source": ROOFLINE_SOURCE,
            "sbuf_budget_bytes_per_partition": budget, "sbuf_budget_source": source,
            "mlp_sbuf_bytes_per_partition": mlp_sbuf_bytes(WIDTH, INTER, itemsize),
            "results": [asdict(r) for r in results]}
