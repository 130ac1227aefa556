"""Trainium2 (NeuronCore-v3) limits and peak figures used across the kernels package.

Every number here is quoted from the AWS Neuron documentation; the page is named
next to it so the figure can be re-checked when a new SDK or chip appears.

Peak compute is per *physical* NeuronCore. On trn2 the default Logical
NeuronCore configuration (LNC) is 2, i.e. one logical core that the framework
sees is two physical cores, so compute rooflines take an ``lnc`` multiplier; HBM
bandwidth does not (Neuron Explorer's MBU uses one stack's figure at both LNCs).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from siglip_serve.core.constants import DMA_TRANSPOSE_AS_PE_ENV
from siglip_serve.core.constants import TRN2_DEFAULT_LNC as TRN2_DEFAULT_LNC  # the trn2 default LNC, declared there
from siglip_serve.kernels.errors import KernelInputError

# --- Tile-size limits (nki.language.tile_size) --------------------------------
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.tile_size.html
# pmax: partition dimension of any SBUF/PSUM tile; also the matmul contraction (K) tile.
PMAX = 128
# gemm_stationary_fmax: free dim of the stationary matmul operand (the PE array is 128x128).
GEMM_STATIONARY_FMAX = 128
# gemm_moving_fmax: free dim of the moving matmul operand (streams through the array).
GEMM_MOVING_FMAX = 512
# psum_fmax: free dim of one PSUM tile in fp32 (2 KiB per partition = one PSUM bank).
PSUM_FMAX = 512

# NeuronCore-v3 SBUF is 28 MiB = 128 partitions x 224 KiB (trainium2_nki_arch page).
SBUF_BYTES_PER_PARTITION = 224 * 1024
# What a kernel can really allocate per partition: the runtime and compiler keep the rest. NKI gives it
# as nl.tile_size.sbuf_fmax_bytes ("per-partition usable SBUF free dimension in bytes", NKI 0.4+), earlier as
# total_available_sbuf_size (deprecated since NKI 0.4: "Use ... sbuf_fmax_bytes for the usable per-partition
# size"); without a real nki, nki-library's own budget: MAX_AVAILABLE_SBUF_SIZE = 224 * 1024 - 16384
# (dynamic DMA scratch) - 8 (reserved) - 256 (transpose identity) = 212,728 bytes
# (src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_constants.py).
SBUF_USABLE_BYTES_PER_PARTITION = SBUF_BYTES_PER_PARTITION - 16384 - 8 - 256
SBUF_ATTRIBUTES = ("sbuf_fmax_bytes", "total_available_sbuf_size")
NKI_LIBRARY_BUDGET = "nki-library's MAX_AVAILABLE_SBUF_SIZE (no nki.language.tile_size figure here)"
# NeuronCore-v3 PSUM: 16 KiB per partition = 8 banks of 2 KiB (trainium2_nki_arch page).
PSUM_BANKS = 8


def _tile_size() -> Any:
    try:
        import nki.language as nl  # the Neuron SDK; absent on CPU-only machines

        return nl.tile_size
    except Exception:  # no nki, or PyPI's placeholder: no tile_size to ask
        return None


def sbuf_budget_source() -> tuple[int, str]:
    """(usable SBUF bytes per partition, where the figure came from): sbuf_fmax_bytes first, then the
    deprecated total_available_sbuf_size, then nki-library's constant."""
    tile_size = _tile_size()
    for name in SBUF_ATTRIBUTES:
        value = getattr(tile_size, name, None)
        if isinstance(value, int) and value > 0:
            return value, f"nl.tile_size.{name}"
    return SBUF_USABLE_BYTES_PER_PARTITION, NKI_LIBRARY_BUDGET


def sbuf_budget() -> int:
    """Usable SBUF bytes per partition: the real nki's figure where it is installed, else nki-library's."""
    return sbuf_budget_source()[0]


def psum_banks_source(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(PSUM banks a kernel can use per partition, why): nl.tile_size.psum_num_banks where nki has it; else 7
    with NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true (bank 7 kept for nc_transpose), otherwise 8."""
    value = getattr(_tile_size(), "psum_num_banks", None)
    if isinstance(value, int) and value > 0:
        return value, "nl.tile_size.psum_num_banks"
    env = os.environ if env is None else env
    if (env.get(DMA_TRANSPOSE_AS_PE_ENV) or "").strip().lower() == "true":
        return PSUM_BANKS - 1, f"{DMA_TRANSPOSE_AS_PE_ENV}=true keeps bank 7 for nc_transpose"
    return PSUM_BANKS, "NeuronCore-v3: 8 banks of 2 KiB"


NEURON_DOC_PAGES = {
    "neuroncore_v3": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/neuron-core-v3.html",
    "trainium2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html",
    "trainium2_nki_arch": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html",
    "tile_size": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.tile_size.html",
    "explorer_summary": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-explorer/"
                        "profile-schema-reference.html#summary",
}


@dataclass(frozen=True)
class PeakFigures:
    """Dense (non-sparse) peaks of one physical NeuronCore-v3."""

    bf16_tflops: float
    fp32_tflops: float
    hbm_gbytes_per_s: float

    def tflops(self, dtype: str) -> float:
        """Peak for a matmul input dtype; fp16/bf16/tf32 share the same Tensor Engine rate."""
        if dtype in ("bfloat16", "bf16", "float16", "fp16", "tf32"):
            return self.bf16_tflops
        if dtype in ("float32", "fp32"):
            return self.fp32_tflops
        raise KernelInputError(f"no trn2 peak figure for dtype {dtype!r}")


# Two AWS pages disagree on a core's peak; a roofline is a bound, so it takes the higher:
# - Trainium2 page: the chip's eight NeuronCore-v3 "collectively deliver 667 BF16/FP16/TF32 TFLOPS ...
#   181 FP32 TFLOPS" = 83.4 and 22.6 per core;
# - NKI Trainium2 arch guide: "a NeuronCore-v3 Tensor Engine delivers ... 79 BF16/FP16/TF32 and 20 FP32
#   dense TFLOPS".
# HBM: the chip has 2.9 TB/s (Trainium2 page) over 4 HBM stacks (arch guide). Neuron Explorer's MBU divides
# by "the maximum HBM bandwidth of a HBM stack. For LNC1 and LNC2, the hbm_max_bandwidth is the same"
# (profile schema, Summary.mbu_estimated_percent): 2.9 TB/s / 4 = 725 GB/s per core at either LNC, so
# %roof here and Explorer's MBU use the same denominator.
TRN2_CORE = PeakFigures(bf16_tflops=667.0 / 8, fp32_tflops=181.0 / 8, hbm_gbytes_per_s=2900.0 / 4)
ARCH_GUIDE_CORE = PeakFigures(bf16_tflops=79.0, fp32_tflops=20.0, hbm_gbytes_per_s=2900.0 / 4)
# Named in every result that uses TRN2_CORE, so a reader can tell which figures a %roof is against.
ROOFLINE_SOURCE = {
    "tflops": "Trainium2 page, 667 BF16 / 181 FP32 dense TFLOPS per chip / 8 cores (higher than the NKI "
              "arch guide's 79 / 20 per core)",
    "hbm": "2.9 TB/s per chip / 4 HBM stacks = 725 GB/s per core at LNC=1 and LNC=2 (Neuron Explorer's MBU)",
    "pages": [NEURON_DOC_PAGES["trainium2"], NEURON_DOC_PAGES["trainium2_nki_arch"],
              NEURON_DOC_PAGES["explorer_summary"]],
}



class TileSizeError(KernelInputError):
    """A tile exceeds a NeuronCore limit; raised before anything is compiled."""


def check_partitions(n: int, what: str) -> None:
    """Reject a partition dimension over PMAX with the compiler's own wording."""
    if n < 1:
        raise TileSizeError(f"{what}: number of partitions must be >= 1, got {n}")
    if n > PMAX:
        raise TileSizeError(
            f"{what}: number of partitions {n} exceed architecture limitation of {PMAX}"
        )


def check_free(n: int, limit: int, what: str) -> None:
    """Reject a free dimension over an engine limit (e.g. the 512-wide moving operand)."""
    if n < 1:
        raise TileSizeError(f"{what}: free dimension must be >= 1, got {n}")
    if n > limit:
        raise TileSizeError(f"{what}: free dimension {n} exceeds architecture limitation of {limit}")


def check_sbuf_budget(bytes_per_partition: int, what: str) -> int:
    """Reject a kernel whose live SBUF tiles cannot fit one partition; return the bytes to spare."""
    budget = sbuf_budget()
    if bytes_per_partition > budget:
        raise TileSizeError(
            f"{what}: needs {bytes_per_partition} bytes per SBUF partition, "
            f"more than the {budget} a kernel can use (of {SBUF_BYTES_PER_PARTITION}; the rest is reserved)"
        )
    return budget - bytes_per_partition


def check_psum_banks(banks: int, what: str) -> None:
    """Reject a kernel that keeps more PSUM banks (2 KiB per partition each) live than it may use."""
    budget, why = psum_banks_source()
    if banks > budget:
        raise TileSizeError(f"{what}: needs {banks} PSUM banks per partition live, more than the {budget} a "
                            f"kernel can use ({why})")
