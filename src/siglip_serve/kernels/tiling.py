"""Matmul tiling on the NeuronCore Tensor Engine, FLOPs, bytes and the trn2 roofline.

Mapping of ``C[M, N] = A[M, K] @ B[K, N]`` onto ``nisa.nc_matmul``, which computes
``dst[m, n] = stationary[k, m].T @ moving[k, n]``:

* **K** (contraction) sits on the SBUF partition axis of both operands and on the
  128 rows of the PE array, so it is cut into ``ceil(K / 128)`` tiles; the partial
  products of one output tile accumulate in PSUM.
* **M** is the free axis of the *stationary* operand (``A`` delivered transposed);
  it occupies the 128 columns of the PE array, so it is cut into ``ceil(M / 128)`` tiles.
* **N** is the free axis of the *moving* operand (``B``), which streams through the
  array up to 512 columns at a time (``gemm_moving_fmax``): ``ceil(N / 512)`` tiles.

``total_tiles = num_tiles_M * num_tiles_K * num_tiles_N`` is therefore the number of
``nc_matmul`` instructions (one 128x128 stationary load, one <=512-wide moving
stream each) a straightforward tiled kernel issues. A dimension one past a
boundary (129, 513) costs a whole extra tile that is almost empty, which is what the
``tiling`` profiling mode is built to show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.hardware import (
    GEMM_MOVING_FMAX,
    GEMM_STATIONARY_FMAX,
    PMAX,
    TRN2_CORE,
    TRN2_DEFAULT_LNC,
    PeakFigures,
)

TILE_K = PMAX
TILE_M = GEMM_STATIONARY_FMAX
TILE_N = GEMM_MOVING_FMAX

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise KernelInputError(f"unsupported dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class MatmulConfig:
    """``A[M, K] @ B[K, N]``: M rows of activations, K contraction, N output features."""

    M: int
    K: int
    N: int

    def __post_init__(self) -> None:
        for name in ("M", "K", "N"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KernelInputError(f"MatmulConfig.{name} must be a positive int, got {value!r}")

    @property
    def num_tiles_M(self) -> int:
        return math.ceil(self.M / TILE_M)

    @property
    def num_tiles_K(self) -> int:
        return math.ceil(self.K / TILE_K)

    @property
    def num_tiles_N(self) -> int:
        return math.ceil(self.N / TILE_N)

    @property
    def total_tiles(self) -> int:
        return self.num_tiles_M * self.num_tiles_K * self.num_tiles_N

    @property
    def flops(self) -> int:
        """One multiply and one add per MAC."""
        return 2 * self.M * self.K * self.N

    def min_bytes(self, dtype: str) -> int:
        """Read A and B once and write C once: the least HBM traffic any schedule needs."""
        return (self.M * self.K + self.K * self.N + self.M * self.N) * dtype_bytes(dtype)

    def arithmetic_intensity(self, dtype: str) -> float:
        """FLOPs per byte of minimum HBM traffic."""
        return self.flops / self.min_bytes(dtype)

    @property
    def tile_utilization(self) -> float:
        """Fraction of the issued tile work that is useful MACs (1.0 on exact multiples)."""
        issued = self.total_tiles * TILE_M * TILE_K * TILE_N
        return (self.M * self.K * self.N) / issued


@dataclass(frozen=True)
class Roofline:
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(
    config: MatmulConfig,
    dtype: str,
    lnc: int = TRN2_DEFAULT_LNC,
    peak: PeakFigures = TRN2_CORE,
) -> Roofline:
    """Lower bound on trn2 time: the slower of peak compute and minimum HBM traffic.

    ``lnc`` physical cores make one logical core (2 is the trn2 default): peak compute scales with
    it, the HBM bound does not (one stack's bandwidth at both LNCs, as Neuron Explorer's MBU counts it;
    kernels/hardware.py ROOFLINE_SOURCE).
    """
    return workload_roofline(config.flops, config.min_bytes(dtype), dtype, lnc, peak)


def workload_roofline(flops: float, min_bytes: float, dtype: str, lnc: int = TRN2_DEFAULT_LNC,
                      peak: PeakFigures = TRN2_CORE) -> Roofline:
    """The same lower bound for any kernel given its FLOPs and least HBM traffic.

    For element-wise and normalisation kernels the FLOPs run on the Vector/Scalar engines,
    not the Tensor Engine, but their HBM time is so much larger that the bound is memory.
    """
    if lnc < 1:
        raise KernelInputError(f"lnc must be >= 1, got {lnc}")
    compute_s = flops / (peak.tflops(dtype) * 1e12 * lnc)
    memory_s = min_bytes / (peak.hbm_gbytes_per_s * 1e9)
    return Roofline(compute_s=compute_s, memory_s=memory_s)


def achieved_tflops(config: MatmulConfig, latency_s: float) -> float:
    if latency_s <= 0:
        raise KernelInputError(f"latency must be positive, got {latency_s}")
    return config.flops / latency_s / 1e12


def percent_of_roofline(config: MatmulConfig, dtype: str, latency_s: float, lnc: int = TRN2_DEFAULT_LNC) -> float:
    """100 means the measured time equals the trn2 lower bound."""
    if latency_s <= 0:
        raise KernelInputError(f"latency must be positive, got {latency_s}")
    return 100.0 * roofline(config, dtype, lnc).time_s / latency_s
