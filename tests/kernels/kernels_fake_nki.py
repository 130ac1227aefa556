"""Test-only NumPy model of the slice of the NKI 0.2+ API that kernels/nki_kernels.py uses.

It is NOT the NKI simulator and proves nothing about the real compiler. It runs the
kernel bodies as Python on NumPy arrays with the documented semantics
(``nc_matmul``: dst += stationary.T @ moving, PSUM accumulation; ``dma_copy`` shape-exact
copies; LNC programs sharing one shared-HBM output) and enforces the documented tile
limits, so indexing, tiling and ragged-edge mistakes in the kernels fail here, on any
machine. The real simulator/hardware runs are the ``neuron``-marked tests.
"""
from __future__ import annotations

import math
import types
from collections import Counter
from types import SimpleNamespace

import numpy as np

PMAX, STATIONARY_FMAX, MOVING_FMAX, PSUM_BANK_BYTES = 128, 128, 512, 2048


class FakeNkiState:
    def __init__(self) -> None:
        self.program_id = 0
        self.num_programs = 1
        self.shared: list[np.ndarray] = []
        self.alloc_index = 0
        self.instructions: Counter[str] = Counter()


def _check_tile(shape: tuple[int, ...], what: str) -> None:
    if shape[0] > PMAX:
        raise ValueError(f"{what}: number of partitions {shape[0]} exceed architecture limitation of {PMAX}")


def build(state: FakeNkiState) -> dict[str, types.ModuleType]:
    nki = types.ModuleType("nki")
    nl = types.ModuleType("nki.language")
    nisa = types.ModuleType("nki.isa")
    nki.language, nki.isa, nki.__version__ = nl, nisa, "fake-for-tests"

    nl.sbuf, nl.psum, nl.shared_hbm, nl.hbm = "sbuf", "psum", "shared_hbm", "hbm"
    nl.float32 = np.float32
    nl.add, nl.multiply, nl.maximum = np.add, np.multiply, np.maximum
    nl.silu = lambda x: x / (1.0 + np.exp(-x))
    nl.tile_size = SimpleNamespace(pmax=PMAX, gemm_stationary_fmax=STATIONARY_FMAX, gemm_moving_fmax=MOVING_FMAX)
    nl.affine_range = range
    nl.program_id = lambda axis: state.program_id
    nl.num_programs = lambda axis=None: state.num_programs

    def ndarray(shape, dtype, buffer=None):
        shape = tuple(int(s) for s in shape)
        if buffer in ("sbuf", "psum"):
            _check_tile(shape, f"nl.ndarray({buffer})")
        if buffer == "psum" and math.prod(shape[1:]) * 4 > PSUM_BANK_BYTES:
            raise ValueError(f"PSUM tile {shape} exceeds one 2 KiB bank per partition")
        if buffer == "shared_hbm":
            # Every program of an LNC launch sees the same shared-HBM allocation.
            index = state.alloc_index
            state.alloc_index += 1
            if state.program_id > 0:
                return state.shared[index]
            state.shared.append(np.zeros(shape, dtype=np.dtype(dtype)))
            return state.shared[index]
        return np.zeros(shape, dtype=np.dtype(dtype))

    nl.ndarray = ndarray

    def same_shape(dst, src, what):
        if dst.shape != src.shape:
            raise ValueError(f"{what}: dst {dst.shape} != src {src.shape}")

    def dma_copy(dst, src):
        state.instructions["dma_copy"] += 1
        same_shape(dst, src, "dma_copy")
        dst[...] = src

    def tensor_copy(dst, src, dtype=None):
        state.instructions["tensor_copy"] += 1
        same_shape(dst, src, "tensor_copy")
        dst[...] = src

    def tensor_tensor(dst, data1, data2, op):
        state.instructions["tensor_tensor"] += 1
        same_shape(data1, data2, "tensor_tensor inputs")
        same_shape(dst, data1, "tensor_tensor")
        dst[...] = op(data1, data2)

    def tensor_scalar(dst, data, op0, operand0, **_):
        state.instructions["tensor_scalar"] += 1
        if isinstance(operand0, np.ndarray) and operand0.shape != (data.shape[0], 1):
            raise ValueError(f"tensor_scalar operand {operand0.shape} is not ({data.shape[0]}, 1)")
        same_shape(dst, data, "tensor_scalar")
        dst[...] = op0(data, operand0)

    def activation(dst, op, data, bias=None, scale=1.0):
        state.instructions["activation"] += 1
        same_shape(dst, data, "activation")
        dst[...] = op(data * scale + (0 if bias is None else bias))

    def nc_matmul(dst, stationary, moving, **_):
        state.instructions["nc_matmul"] += 1
        k, m = stationary.shape
        k2, n = moving.shape
        if k != k2 or k > PMAX or m > STATIONARY_FMAX or n > MOVING_FMAX:
            raise ValueError(f"nc_matmul: stationary {stationary.shape} / moving {moving.shape} break tile limits")
        if dst.shape != (m, n):
            raise ValueError(f"nc_matmul: dst {dst.shape} != {(m, n)}")
        dst += (stationary.astype(np.float64).T @ moving.astype(np.float64)).astype(dst.dtype)

    def nc_transpose(dst, data, **_):
        state.instructions["nc_transpose"] += 1
        if max(data.shape) > PMAX:
            raise ValueError(f"nc_transpose: {data.shape} exceeds {PMAX}x{PMAX}")
        same_shape(dst, data.T, "nc_transpose")
        dst[...] = data.T

    for fn in (dma_copy, tensor_copy, tensor_tensor, tensor_scalar, activation, nc_matmul, nc_transpose):
        setattr(nisa, fn.__name__, fn)

    class Kernel:
        def __init__(self, fn, grid=1):
            self.fn, self.grid = fn, grid

        def __getitem__(self, grid):
            return Kernel(self.fn, grid)

        def __call__(self, *args):
            state.shared, result = [], None
            for pid in range(self.grid):
                state.program_id, state.num_programs, state.alloc_index = pid, self.grid, 0
                result = self.fn(*args)
            state.program_id, state.num_programs = 0, 1
            return result

    nki.jit = lambda fn: Kernel(fn)
    nki.simulate = lambda kernel: kernel
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa}
