"""The NKI kernels' runs before anything is compiled: shape and tile validation, the host-side layout each
kernel takes, its NumPy golden, and the default set of small problems.

Validation needs nothing but NumPy, so a tile that breaks a NeuronCore limit fails here with a clear
:class:`~siglip_serve.kernels.hardware.TileSizeError` (worded like the compiler's "number of partitions 256
exceed architecture limitation of 128") instead of deep inside a compile.
:mod:`siglip_serve.kernels.nki_launch` launches what is prepared here (and re-exports it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from siglip_serve.kernels import references
from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.hardware import (
    GEMM_MOVING_FMAX,
    PMAX,
    check_free,
    check_partitions,
    check_psum_banks,
    check_sbuf_budget,
)
from siglip_serve.kernels.lnc import runtime_kernel_lnc

# --- validation (before compile) -----------------------------------------------------------

def validate_vector_add_tiled(n: int, row_chunk: int) -> None:
    check_partitions(row_chunk, "vector_add_tiled ROW_CHUNK")
    if n % row_chunk:
        raise KernelInputError(f"vector_add_tiled: length {n} is not a multiple of ROW_CHUNK {row_chunk}")


def validate_vector_add_stream(n: int, free_dim: int, itemsize: int) -> None:
    if n % PMAX:
        raise KernelInputError(f"vector_add_stream: length {n} is not a multiple of {PMAX} partitions")
    if free_dim < 1 or free_dim > n // PMAX:
        raise KernelInputError(f"vector_add_stream: FREE_DIM {free_dim} not in 1..{n // PMAX} (columns per partition)")
    if (n // PMAX) % free_dim:
        raise KernelInputError(f"vector_add_stream: {n // PMAX} columns per partition not a multiple of "
                               f"FREE_DIM {free_dim}")
    check_sbuf_budget(3 * free_dim * itemsize, "vector_add_stream a/b/c tiles")


def validate_transpose2d(shape: tuple[int, ...], itemsize: int) -> None:
    if len(shape) != 2:
        raise KernelInputError(f"transpose2d expects a 2-D matrix, got shape {shape}")
    check_sbuf_budget(2 * PMAX * itemsize, "transpose2d block")


def validate_conv2d(x_shape: tuple[int, ...], w_shape: tuple[int, ...], pool: int, itemsize: int) -> None:
    batch, c_in, height, width = x_shape
    c_out, c_in_w, fh, fw = w_shape
    if c_in != c_in_w:
        raise KernelInputError(f"conv2d: input has {c_in} channels, filters expect {c_in_w}")
    if pool < 1:
        raise KernelInputError("conv2d: pool must be >= 1")
    out_h, out_w = height - fh + 1, width - fw + 1
    if out_h < pool or out_w < pool:
        raise KernelInputError(f"conv2d: output {out_h}x{out_w} smaller than pool {pool}")
    conv_w = (out_w // pool) * pool
    check_free(conv_w, GEMM_MOVING_FMAX, "conv2d output row (moving operand)")
    n_ci = -(-c_in // PMAX)
    per_partition = (
        n_ci * fh * fw * c_out * itemsize  # resident weights
        + n_ci * (pool + fh - 1) * width * itemsize  # input row band
        + 2 * conv_w * 4 + conv_w * itemsize  # band max, pooled, result
    )
    check_sbuf_budget(per_partition, "conv2d weights + row band")


def validate_tensor_add_spmd(shape: tuple[int, ...], cores: int) -> None:
    if len(shape) != 2:
        raise KernelInputError(f"tensor_add_spmd expects a 2-D tensor, got shape {shape}")
    if shape[0] % (PMAX * cores):
        raise KernelInputError(
            f"tensor_add_spmd: {shape[0]} rows do not split into {cores} program(s) (LNC={cores}) "
            f"x {PMAX}-row tiles"
        )


def validate_gated_mlp(tokens: int, hidden: int, inter: int, itemsize: int) -> None:
    for name, value in (("hidden", hidden), ("intermediate", inter)):
        if value % PMAX:
            raise KernelInputError(f"gated_mlp: {name} {value} must be a multiple of {PMAX}")
    t_tile = min(tokens, GEMM_MOVING_FMAX)
    per_partition = (
        (2 * (hidden // PMAX) * inter + (inter // PMAX) * hidden) * itemsize  # resident weights
        + ((hidden // PMAX) + (inter // PMAX) + 1) * t_tile * itemsize  # x, h, out tiles
        + t_tile * 4  # silu(gate) in fp32
    )
    check_sbuf_budget(per_partition, "gated_mlp resident weights")
    # gate and up accumulate side by side; the last pair is still held while down accumulates.
    check_psum_banks(3, "gated_mlp gate/up/down accumulators")


# --- kernel specs: inputs, host-side layout, reference --------------------------------------

@dataclass(frozen=True)
class KernelRun:
    """One ready-to-launch kernel call: device args plus how to read the result back.

    ``lnc`` is the LNC it launches at (the runtime's unless a test asks otherwise);
    ``supported_lnc`` the degrees the kernel is written for.
    """

    name: str
    kernel: str  # function name in siglip_serve.kernels.nki_kernels
    args: tuple[Any, ...]
    expected: np.ndarray
    postprocess: Callable[[np.ndarray], np.ndarray]
    lnc: int = 1
    supported_lnc: tuple[int, ...] = (1, 2)
    module: str = "siglip_serve.kernels.nki_kernels"  # where the kernel function lives


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def prepare_vector_add_tiled(a: np.ndarray, b: np.ndarray, row_chunk: int = PMAX) -> KernelRun:
    validate_vector_add_tiled(a.size, row_chunk)
    return KernelRun("vector_add_tiled", "vector_add_tiled", (a.reshape(-1, 1), b.reshape(-1, 1), row_chunk),
                     references.vector_add(a, b), lambda out: np.asarray(out).reshape(-1))


def prepare_vector_add_stream(a: np.ndarray, b: np.ndarray, free_dim: int) -> KernelRun:
    validate_vector_add_stream(a.size, free_dim, a.itemsize)
    return KernelRun("vector_add_stream", "vector_add_stream",
                     (a.reshape(PMAX, -1), b.reshape(PMAX, -1), free_dim),
                     references.vector_add(a, b), lambda out: np.asarray(out).reshape(-1))


def prepare_transpose2d(x: np.ndarray) -> KernelRun:
    validate_transpose2d(x.shape, x.itemsize)
    return KernelRun("transpose2d", "transpose2d", (x,), references.transpose2d(x), _identity)


def conv_weights_stationary(w: np.ndarray) -> np.ndarray:
    """[C_out, C_in, fh, fw] -> [C_in, fh*fw*C_out]: each filter tap becomes a stationary slice."""
    c_out, c_in, fh, fw = w.shape
    return np.ascontiguousarray(w.transpose(1, 2, 3, 0).reshape(c_in, fh * fw * c_out))


def prepare_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pool: int) -> KernelRun:
    validate_conv2d(x.shape, w.shape, pool, x.itemsize)
    fh, fw = w.shape[2:]
    return KernelRun("conv2d_bias_maxpool", "conv2d_bias_maxpool",
                     (x, conv_weights_stationary(w), bias.reshape(-1, 1), fh, fw, pool),
                     references.conv2d_bias_maxpool(x, w, bias, pool), _identity)


def prepare_tensor_add_spmd(a: np.ndarray, b: np.ndarray, lnc: int) -> KernelRun:
    validate_tensor_add_spmd(a.shape, lnc)
    return KernelRun("tensor_add_spmd", "tensor_add_spmd", (a, b), references.tensor_add(a, b),
                     _identity, lnc=lnc)


def prepare_gated_mlp(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, wd: np.ndarray) -> KernelRun:
    validate_gated_mlp(x.shape[0], x.shape[1], wg.shape[1], x.itemsize)
    return KernelRun("gated_mlp", "gated_mlp_t", (np.ascontiguousarray(x.T), wg, wu, wd),
                     references.gated_mlp(x, wg, wu, wd), lambda out: np.asarray(out).T)


def at_lnc(run: KernelRun, lnc: int) -> KernelRun:
    """``run`` launched at ``lnc``."""
    return dataclasses.replace(run, lnc=lnc)


def default_runs(seed: int = 0, lnc: int | None = None) -> list[KernelRun]:
    """Small random problems covering every kernel, including ragged tiles, at ``lnc``
    (default: the Neuron runtime's LNC)."""
    lnc = runtime_kernel_lnc() if lnc is None else lnc
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    runs = [
        prepare_vector_add_tiled(rand(25600), rand(25600), row_chunk=128),
        prepare_vector_add_stream(rand(25600), rand(25600), free_dim=100),
        prepare_transpose2d(rand(200, 300)),
        prepare_conv2d(rand(1, 3, 12, 14), rand(8, 3, 3, 3), rand(8), pool=2),
        prepare_conv2d(rand(1, 130, 6, 7), rand(130, 130, 2, 2), rand(130), pool=1),
        prepare_tensor_add_spmd(rand(512, 700), rand(512, 700), lnc),
        prepare_gated_mlp(rand(64, 256) * 0.5, rand(256, 384) * 0.06, rand(256, 384) * 0.06, rand(384, 256) * 0.05),
    ]
    return [at_lnc(run, lnc) for run in runs]
