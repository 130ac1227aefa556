"""Trainium2 (NeuronCore-v3) limits and peak figures used across the kernels package.

Every number here is quoted from the AWS Neuron documentation; the page is named
next to it so the figure can be re-checked when a new SDK or chip appears.

Peak throughput is per *physical* NeuronCore. On trn2 the default Logical
NeuronCore configuration (LNC) is 2, i.e. one logical core that the framework
sees is two physical cores, so rooflines take an ``lnc`` multiplier.
"""
from __future__ import annotations

from dataclasses import dataclass

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

NEURON_DOC_PAGES = {
    "neuroncore_v3": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/neuron-core-v3.html",
    "trainium2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html",
    "trainium2_nki_arch": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html",
    "tile_size": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.tile_size.html",
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


# "A NeuronCore-v3 Tensor Engine delivers 158 FP8, 79 BF16/FP16/TF32 and 20 FP32 dense
# TFLOPS" (trainium2_nki_arch page; the neuron_core_v3 page gives the same 79 BF16).
# HBM: 2.9 TB/s per Trainium2 device shared by its 8 NeuronCores => 362.5 GB/s per core
# (trainium2_nki_arch page, latest; the SDK 2.29 edition rounds it to 3 TB/s).
TRN2_CORE = PeakFigures(bf16_tflops=79.0, fp32_tflops=20.0, hbm_gbytes_per_s=2900.0 / 8)

# The trn2 default: one logical core = 2 physical cores (NEURON_LOGICAL_NC_CONFIG=2).
TRN2_DEFAULT_LNC = 2


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


def check_sbuf_budget(bytes_per_partition: int, what: str) -> None:
    """Reject a kernel whose live SBUF tiles cannot fit one partition."""
    if bytes_per_partition > SBUF_BYTES_PER_PARTITION:
        raise TileSizeError(
            f"{what}: needs {bytes_per_partition} bytes per SBUF partition, "
            f"more than the {SBUF_BYTES_PER_PARTITION} available"
        )
