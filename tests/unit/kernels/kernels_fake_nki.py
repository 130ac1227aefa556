"""Test-only NumPy model of the slice of the NKI 0.2+ API that kernels/nki_kernels.py uses.

It is NOT the NKI simulator and proves nothing about the real compiler or about
performance. It runs the kernel bodies as Python on NumPy arrays and enforces the rules
the NKI docs state (SDK 2.33 API pages; the NKI CPU Simulator guide), so a kernel that
breaks one fails here, on any machine:

* buffers: every tensor lives in HBM, SBUF or PSUM. ``nc_matmul`` reads ``stationary`` and
  ``moving`` from SBUF and writes ``dst`` to PSUM; ``dma_copy`` moves data between HBM and
  SBUF only; ``tensor_copy`` / ``tensor_tensor`` / ``tensor_scalar`` / ``activation`` work on
  on-chip memory (SBUF, PSUM), and ``tensor_tensor``'s two inputs cannot both be in PSUM;
  a kernel's top-level inputs and outputs are HBM tensors;
* dtypes: float32, float16, int32 and bfloat16 (bf16 values are float32 rounded to
  nearest-even on every write, through ml_dtypes when it is installed); ``nc_matmul``'s
  ``dst`` must be float32 (NeuronCore-v2/v3), a float32 operand needs a float32 partner,
  and ``tensor_scalar``'s per-partition tile operand must be float32 (issue 12's review of the
  API; the SDK 2.33 page excerpt read here states only its shape, (P, 1), and SBUF/PSUM);
* ``tensor_reduce`` reduces free axes only (across partitions is ``tensor_partition_reduce``);
* ``nc_matmul(accumulate=...)``: True adds to ``dst``, False overwrites it, None (default)
  overwrites a PSUM location on its first write and adds on later ones;
* new tensors are filled with NaN (ints with 4), as the simulator does, so reading memory
  that was never written poisons the result;
* tile limits: 128 partitions, a 2 KiB PSUM bank per partition, matmul tiles
  stationary <= 128x128 and moving <= 128x512;
* budgets per partition, counted over the tiles still alive (CPython frees a tile once no name
  holds it, as a kernel's scope would): SBUF 212,728 bytes (nki-library's MAX_AVAILABLE_SBUF_SIZE,
  what ``nl.tile_size.sbuf_fmax_bytes`` reports), PSUM 8 banks of 2 KiB (7 with
  NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true);
* ``op=`` (and ``op0``/``op1``) only from the ISA's operator table (nki.api.shared, "Supported Math
  Operators": ``nl.maximum``, not the reduction function ``nl.max``; its unary ``nl.rsqrt`` and
  ``nl.reciprocal`` with ``operand0`` None or 0); ``activation`` only with an activation function;
  ``tensor_scalar(engine=gpsimd)`` only for rsqrt; ``nisa.reciprocal`` runs on the Vector Engine. Which
  engine ran which function is recorded (``engine_ops``), not its precision: the fake computes every
  function exactly, on every engine;
* ``nc_transpose`` keeps the dtype; a DMA moves raw bytes, so a ``dma_copy`` that changes the dtype
  needs a casting DGE mode (``dge_mode.swdge`` or ``dge_mode.none``: the NKI 0.3.0 migration guide);
* a launch grid of 1 or 2 (the LNC degrees); without a grid a launch runs at the LNC of
  NEURON_LOGICAL_NC_CONFIG (1 when unset), as NKI 0.7's ``nki.jit`` page says; from version 0.7 a
  grid that differs from that variable is refused (the SPMD-grid notice: "a compile-time error").
  The version string is ``build``'s argument: NKI 0.5's grid-only LNC and the real simulator's
  treatment of a launch without a grid are not modelled beyond that.

LNC launches run the programs one after another, sharing ``shared_hbm``.
The real simulator and hardware runs are the ``neuron``-marked tests.
"""
from __future__ import annotations

import importlib.util
import math
import os
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def _memory_module() -> types.ModuleType:
    # Loaded by path, as conftest loads this file, so it works under any pytest --import-mode.
    path = Path(__file__).with_name("kernels_fake_nki_memory.py")
    spec = importlib.util.spec_from_file_location("kernels_fake_nki_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_memory = _memory_module()
(PMAX, STATIONARY_FMAX, MOVING_FMAX, PSUM_BANK_BYTES, SBUF_BUDGET, PSUM_BUDGET, CASTING_DGE, HBM_KINDS, ON_CHIP,
 STORAGE, ITEMSIZE) = (_memory.PMAX, _memory.STATIONARY_FMAX, _memory.MOVING_FMAX, _memory.PSUM_BANK_BYTES,
                       _memory.SBUF_BUDGET, _memory.PSUM_BUDGET, _memory.CASTING_DGE, _memory.HBM_KINDS,
                       _memory.ON_CHIP, _memory.STORAGE, _memory.ITEMSIZE)
NkiRuleError, Buffer, FakeTensor, FakeNkiState = (_memory.NkiRuleError, _memory.Buffer, _memory.FakeTensor,
                                                  _memory.FakeNkiState)
round_to_bf16, dtype_name, hbm_input = _memory.round_to_bf16, _memory.dtype_name, _memory.hbm_input
_cast, _check_tile, _tensor, _read, _write = (_memory._cast, _memory._check_tile, _memory._tensor, _memory._read,
                                              _memory._write)


def psum_budget() -> int:
    """PSUM bytes per partition a kernel may hold: 8 banks, 7 with NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true
    (``nl.tile_size.psum_num_banks``: bank 7 is reserved for nc_transpose then)."""
    pe_transpose = (os.environ.get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE") or "").strip().lower() == "true"
    return PSUM_BUDGET - PSUM_BANK_BYTES if pe_transpose else PSUM_BUDGET


def _release(version: str) -> tuple[int, int] | None:
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _env_lnc() -> int:
    raw = (os.environ.get("NEURON_LOGICAL_NC_CONFIG") or "").strip()
    return int(raw) if raw else 1


def build(state: FakeNkiState, version: str = "fake-for-tests") -> dict[str, types.ModuleType]:
    """The fake ``nki``, ``nki.language`` and ``nki.isa`` modules; ``version`` is ``nki.__version__``."""
    nki = types.ModuleType("nki")
    nl = types.ModuleType("nki.language")
    nisa = types.ModuleType("nki.isa")
    nki.language, nki.isa, nki.__version__ = nl, nisa, version

    nl.sbuf, nl.psum, nl.shared_hbm, nl.hbm = "sbuf", "psum", "shared_hbm", "hbm"
    nl.float32, nl.bfloat16, nl.float16, nl.int32 = "float32", "bfloat16", "float16", "int32"
    nl.add, nl.subtract, nl.multiply, nl.maximum = np.add, np.subtract, np.multiply, np.maximum
    nl.minimum = np.minimum
    binary = (nl.add, nl.subtract, nl.multiply, nl.maximum, nl.minimum)
    # The reduction *function* nl.max(x, axis): not an operator, so never an op= argument.
    nl.max = lambda x, axis=None, keepdims=False: np.max(x, axis=axis, keepdims=keepdims)
    def rsqrt(x):
        return 1.0 / np.sqrt(x)

    def reciprocal(x):
        return 1.0 / x

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def gelu_apprx_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    nl.exp, nl.rsqrt, nl.reciprocal, nl.silu, nl.gelu_apprx_tanh = np.exp, rsqrt, reciprocal, silu, gelu_apprx_tanh
    activations = (nl.exp, nl.rsqrt, nl.reciprocal, nl.silu, nl.gelu_apprx_tanh)
    # The operator table's "Arithmetic Unary" rows: op0 of tensor_scalar with operand0 None or 0.
    unary = (nl.rsqrt, nl.reciprocal)
    operators = binary + unary
    nisa.dge_mode = SimpleNamespace(none="none", swdge="swdge", hwdge="hwdge", unknown="unknown")
    nisa.engine = SimpleNamespace(unknown="unknown", vector="vector", scalar="scalar", gpsimd="gpsimd",
                                  tensor="tensor")

    def operator(op, where: str):
        if not any(op is known for known in operators):
            raise NkiRuleError(f"{where}: {getattr(op, '__name__', op)!r} is not in the ISA's operator table "
                               "(nl.add, nl.subtract, nl.multiply, nl.maximum, nl.minimum, ...)")
        return op
    nl.tile_size = SimpleNamespace(pmax=PMAX, gemm_stationary_fmax=STATIONARY_FMAX, gemm_moving_fmax=MOVING_FMAX)
    nl.affine_range = range
    nl.program_id = lambda axis=0: state.program_id
    nl.num_programs = lambda axis=None: state.num_programs

    def ndarray(shape, dtype, buffer=None):
        shape = tuple(int(s) for s in shape)
        name = dtype_name(dtype)
        kind = buffer or "sbuf"
        if kind not in ON_CHIP + HBM_KINDS:
            raise NkiRuleError(f"nl.ndarray: unknown buffer {buffer!r}")
        if kind in ON_CHIP:
            _check_tile(shape, f"nl.ndarray({kind})")
        per_partition = math.prod(shape[1:]) * ITEMSIZE[name]
        if kind == "psum" and per_partition > PSUM_BANK_BYTES:
            raise NkiRuleError(f"PSUM tile {shape} of {name} exceeds one 2 KiB bank per partition")
        if kind in ON_CHIP:
            budget = SBUF_BUDGET if kind == "sbuf" else psum_budget()
            live = sum(math.prod(b.data.shape[1:]) * ITEMSIZE[b.dtype] for b in state.live if b.kind == kind)
            if live + per_partition > budget:
                raise NkiRuleError(f"{kind} over budget: {live} bytes per partition live + {per_partition} "
                                   f"for {shape} {name} > {budget}")
        if kind == "shared_hbm":
            # Every program of an LNC launch sees the same shared-HBM allocation.
            index = state.alloc_index
            state.alloc_index += 1
            if state.program_id > 0:
                return FakeTensor.whole(state.shared[index])
            state.shared.append(Buffer(shape, name, kind))
            return FakeTensor.whole(state.shared[index])
        buf = Buffer(shape, name, kind)
        if kind in ON_CHIP:
            state.live.add(buf)
        return FakeTensor.whole(buf)

    nl.ndarray = ndarray

    def same_shape(a, b, what):
        if a.shape != b.shape:
            raise NkiRuleError(f"{what}: {a.shape} != {b.shape}")

    def dma_copy(dst, src, dge_mode="unknown", **_):
        # "data movement between memory locations (SBUF or HBM)": PSUM is not a DMA endpoint.
        state.instructions["dma_copy"] += 1
        dma_kinds = HBM_KINDS + ("sbuf",)
        values = _read(src, "dma_copy", "src", dma_kinds)
        same_shape(_tensor(dst, "dma_copy", "dst"), src, "dma_copy dst/src")
        if dst.dtype != src.dtype and dge_mode not in CASTING_DGE:
            raise NkiRuleError(f"dma_copy: {src.dtype} -> {dst.dtype} with dge_mode={dge_mode}: a DMA moves raw "
                               "bytes; widen on an engine (tensor_copy) or ask for dge_mode.swdge/none")
        _write(dst, values, "dma_copy", dma_kinds)

    def tensor_copy(dst, src, **_):
        state.instructions["tensor_copy"] += 1
        values = _read(src, "tensor_copy", "src", ON_CHIP)
        _write(dst, values, "tensor_copy", ON_CHIP)

    def tensor_tensor(dst, data1, data2, op, **_):
        state.instructions["tensor_tensor"] += 1
        a = _read(data1, "tensor_tensor", "data1", ON_CHIP)
        b = _read(data2, "tensor_tensor", "data2", ON_CHIP)
        if data1.buffer == "psum" and data2.buffer == "psum":
            raise NkiRuleError("tensor_tensor: data1 and data2 cannot both reside in PSUM")
        same_shape(data1, data2, "tensor_tensor inputs")
        _write(dst, operator(op, "tensor_tensor")(a.astype(np.float32), b.astype(np.float32)), "tensor_tensor",
               ON_CHIP)

    def _operand(value, data: np.ndarray, op: str):
        if isinstance(value, FakeTensor):
            if value.dtype != "float32":
                raise NkiRuleError(f"{op}: a tile operand must be float32, got {value.dtype}")
            operand = _read(value, op, "operand", ON_CHIP)
            if operand.shape != (data.shape[0], 1):
                raise NkiRuleError(f"{op}: operand {operand.shape} is not ({data.shape[0]}, 1)")
            return operand
        return value

    def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                      engine="unknown", **_):
        state.instructions["tensor_scalar"] += 1
        values = _read(data, "tensor_scalar", "data", ON_CHIP).astype(np.float32)
        operator(op0, "tensor_scalar op0")
        if op1 is not None:
            operator(op1, "tensor_scalar op1")
        if engine == "gpsimd" and op0 is not nl.rsqrt:
            raise NkiRuleError("tensor_scalar: engine=gpsimd is only allowed for rsqrt")
        state.engine_ops[("tensor_scalar", op0.__name__, engine)] += 1
        if any(op0 is u for u in unary):
            if operand0 not in (None, 0, 0.0):
                raise NkiRuleError(f"tensor_scalar: operand0 must be None or 0 for the unary {op0.__name__}")
            values = op0(values)
        else:
            first = _operand(operand0, values, "tensor_scalar")
            values = op0(first, values) if reverse0 else op0(values, first)
        if op1 is not None:
            second = _operand(operand1, values, "tensor_scalar")
            values = op1(second, values) if reverse1 else op1(values, second)
        _write(dst, values, "tensor_scalar", ON_CHIP)

    def activation(dst, op, data, bias=None, scale=1.0, **_):
        state.instructions["activation"] += 1
        values = _read(data, "activation", "data", ON_CHIP).astype(np.float32)
        if not any(op is known for known in activations):
            raise NkiRuleError(f"activation: {getattr(op, '__name__', op)!r} is not an activation function "
                               "(nl.exp, nl.rsqrt, nl.reciprocal, nl.silu, nl.gelu_apprx_tanh, ...)")
        shift = 0.0 if bias is None else _operand(bias, values, "activation")
        state.engine_ops[("activation", op.__name__, "scalar")] += 1
        _write(dst, op(values * scale + shift), "activation", ON_CHIP)

    def vector_reciprocal(dst, data, **_):
        # nisa.reciprocal: on the Vector Engine, in float32 (nki.isa.reciprocal); both tiles in SBUF or PSUM.
        state.instructions["reciprocal"] += 1
        values = _read(data, "reciprocal", "data", ON_CHIP).astype(np.float32)
        state.engine_ops[("reciprocal", "reciprocal", "vector")] += 1
        _write(dst, 1.0 / values, "reciprocal", ON_CHIP)

    def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, **_):
        state.instructions["tensor_reduce"] += 1
        values = _read(data, "tensor_reduce", "data", ON_CHIP).astype(np.float32)
        if axis in (0, [0], (0,)):
            raise NkiRuleError("tensor_reduce reduces free axes only; use tensor_partition_reduce across partitions")
        reduced = operator(op, "tensor_reduce").reduce(values, axis=tuple(np.atleast_1d(axis)), keepdims=keepdims)
        _write(dst, -reduced if negate else reduced, "tensor_reduce", ON_CHIP)

    def memset(dst, value, **_):
        state.instructions["memset"] += 1
        _write(dst, np.full(_tensor(dst, "memset", "dst").shape, value, dtype=np.float32), "memset", ON_CHIP)

    def nc_matmul(dst, stationary, moving, accumulate=None, **_):
        state.instructions["nc_matmul"] += 1
        st = _read(stationary, "nc_matmul", "stationary", ("sbuf",))
        mv = _read(moving, "nc_matmul", "moving", ("sbuf",))
        out = _tensor(dst, "nc_matmul", "dst")
        if out.buffer != "psum":
            raise NkiRuleError(f"nc_matmul: dst is in {out.buffer}; nc_matmul writes dst only to psum")
        if out.dtype != "float32":
            raise NkiRuleError(f"nc_matmul: dst must be a float32 PSUM tile on NeuronCore-v3, got {out.dtype}")
        if ("float32" in (stationary.dtype, moving.dtype)) and stationary.dtype != moving.dtype:
            raise NkiRuleError(f"nc_matmul: a float32 operand needs a float32 partner, got "
                               f"{stationary.dtype} x {moving.dtype}")
        (k, m), (k2, n) = st.shape, mv.shape
        if k != k2 or k > PMAX or m > STATIONARY_FMAX or n > MOVING_FMAX:
            raise NkiRuleError(f"nc_matmul: stationary {st.shape} / moving {mv.shape} break tile limits")
        if out.shape != (m, n):
            raise NkiRuleError(f"nc_matmul: dst {out.shape} != {(m, n)}")
        product = (st.T @ mv).astype(np.float32)
        if accumulate is None:  # first write to a PSUM location overwrites, later writes add
            add = out.written
        else:
            add = np.full(out.shape, bool(accumulate))
        out.values[...] = np.where(add, out.values + product, product)
        out.written[...] = True

    def nc_transpose(dst, data, **_):
        # On the Tensor Engine: data is the stationary operand (SBUF), the result lands in PSUM.
        state.instructions["nc_transpose"] += 1
        values = _read(data, "nc_transpose", "data", ("sbuf",))
        if max(values.shape) > PMAX:
            raise NkiRuleError(f"nc_transpose: {values.shape} exceeds {PMAX}x{PMAX}")
        if _tensor(dst, "nc_transpose", "dst").dtype != data.dtype:
            raise NkiRuleError(f"nc_transpose: dst is {dst.dtype}, data is {data.dtype}; a transpose keeps the dtype")
        _write(dst, values.T, "nc_transpose", ("psum",))

    for fn in (dma_copy, tensor_copy, tensor_tensor, tensor_scalar, activation, tensor_reduce, memset,
               nc_matmul, nc_transpose):
        setattr(nisa, fn.__name__, fn)
    nisa.reciprocal = vector_reciprocal

    def as_input(arg, kind: str):
        if hasattr(arg, "detach") and hasattr(arg, "numpy"):  # a torch tensor, as nki.simulate accepts
            arg = arg.detach().float().cpu().numpy()
        if isinstance(arg, np.ndarray):
            data = np.ascontiguousarray(arg)
            name = dtype_name(data.dtype)
            return FakeTensor.whole(Buffer(data.shape, name, kind, data.astype(STORAGE[name]).copy()))
        if isinstance(arg, FakeTensor) and arg.buffer not in HBM_KINDS:
            raise NkiRuleError(f"kernel input {arg} must be in HBM (top-level tensors live in HBM)")
        return arg

    release = _release(version)

    class Kernel:
        def __init__(self, fn, grid=None):
            self.fn, self.grid = fn, grid

        def __getitem__(self, grid):
            if grid not in (1, 2):
                raise NkiRuleError(f"launch grid [{grid}]: an LNC launch is [1] or [2]")
            return Kernel(self.fn, grid)

        def __call__(self, *args):
            env_lnc = _env_lnc()
            if self.grid is not None and release is not None and release >= (0, 7) and self.grid != env_lnc:
                raise NkiRuleError(f"launch grid [{self.grid}] differs from the LNC in use "
                                   f"(NEURON_LOGICAL_NC_CONFIG={env_lnc}): a compile-time error from NKI 0.7")
            programs = env_lnc if self.grid is None else self.grid
            state.grids.append(programs)
            state.explicit_grids.append(self.grid)
            kind = "shared_hbm" if programs > 1 else "hbm"
            inputs = [as_input(a, kind) for a in args]
            state.shared, result = [], None
            for pid in range(programs):
                state.program_id, state.num_programs, state.alloc_index = pid, programs, 0
                result = self.fn(*inputs)
            state.program_id, state.num_programs = 0, 1
            if not isinstance(result, FakeTensor) or result.buffer not in HBM_KINDS:
                raise NkiRuleError(f"kernel output {result!r} must be an HBM tensor")
            if any(hasattr(a, "detach") for a in args):  # torch in, torch out, as nki.simulate and nki.jit do
                import torch

                return torch.from_numpy(result.values.copy())
            return result.values.copy()

    nki.jit = lambda fn: Kernel(fn)
    def simulate(kernel):
        state.simulate_targets.append(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"))
        return kernel

    nki.simulate = simulate
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa}
