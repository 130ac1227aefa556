"""The memory half of the test-only NumPy model of NKI (kernels_fake_nki.py has the rules it enforces and what it
does not prove): the limits, dtypes, buffers and tensor views the fake ISA of kernels_fake_nki reads and writes.
"""
from __future__ import annotations

import weakref
from collections import Counter

import numpy as np

PMAX, STATIONARY_FMAX, MOVING_FMAX, PSUM_BANK_BYTES = 128, 128, 512, 2048
SBUF_BUDGET, PSUM_BUDGET = 224 * 1024 - 16384 - 8 - 256, 8 * PSUM_BANK_BYTES
CASTING_DGE = ("swdge", "none")
HBM_KINDS = ("hbm", "shared_hbm")
ON_CHIP = ("sbuf", "psum")
# Storage per dtype name; bfloat16 is stored as float32 holding bf16-representable values.
STORAGE = {"float32": np.float32, "bfloat16": np.float32, "float16": np.float16, "int32": np.int32}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}


class NkiRuleError(ValueError):
    """The kernel broke a documented NKI rule (buffer, dtype, accumulation or tile limit)."""


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    values = np.asarray(values, dtype=np.float32)
    try:
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    except ImportError:
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.where(np.isnan(values), values, rounded)


def dtype_name(dtype) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in STORAGE:
        raise NkiRuleError(f"dtype {name} is not modelled (have {sorted(STORAGE)})")
    return name


def _cast(values: np.ndarray, name: str) -> np.ndarray:
    if name == "bfloat16":
        return round_to_bf16(values)
    return np.asarray(values).astype(STORAGE[name])


class Buffer:
    """One allocation: its memory kind, dtype, storage, and which elements were ever written."""

    def __init__(self, shape: tuple[int, ...], dtype: str, kind: str, data: np.ndarray | None = None):
        self.kind, self.dtype = kind, dtype
        fill = 4 if dtype == "int32" else np.nan
        self.data = np.full(shape, fill, dtype=STORAGE[dtype]) if data is None else data
        self.written = np.zeros(shape, dtype=bool) if data is None else np.ones(shape, dtype=bool)


class FakeTensor:
    """A view of a Buffer; basic indexing (ints, slices) gives views, as NKI tiles do."""

    def __init__(self, buf: Buffer, data: np.ndarray, written: np.ndarray):
        self.buf, self.values, self.written = buf, data, written

    @classmethod
    def whole(cls, buf: Buffer) -> FakeTensor:
        return cls(buf, buf.data, buf.written)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    @property
    def dtype(self) -> str:
        return self.buf.dtype

    @property
    def buffer(self) -> str:
        return self.buf.kind

    def __getitem__(self, key) -> FakeTensor:
        parts = key if isinstance(key, tuple) else (key,)
        if not all(isinstance(k, (int, np.integer, slice)) for k in parts):
            raise NkiRuleError(f"index {key!r}: only ints and slices are modelled")
        return FakeTensor(self.buf, self.values[key], self.written[key])

    def __repr__(self) -> str:
        return f"FakeTensor({self.buffer}, {self.dtype}, {self.shape})"


class FakeNkiState:
    def __init__(self) -> None:
        self.program_id = 0
        self.num_programs = 1
        self.shared: list[Buffer] = []
        self.alloc_index = 0
        self.instructions: Counter[str] = Counter()
        self.grids: list[int] = []  # programs each kernel call ran (its LNC), in order
        self.explicit_grids: list[int | None] = []  # the grid each call passed (None: a plain call)
        self.simulate_targets: list[str | None] = []  # NEURON_PLATFORM_TARGET_OVERRIDE at each nki.simulate
        # (instruction, function, engine) of each activation, reciprocal and tensor_scalar: which engine ran what.
        self.engine_ops: Counter[tuple[str, str, str]] = Counter()
        self.live: weakref.WeakSet[Buffer] = weakref.WeakSet()  # on-chip tiles some name still holds


def _check_tile(shape: tuple[int, ...], what: str) -> None:
    if len(shape) < 2:
        raise NkiRuleError(f"{what}: an SBUF/PSUM tile needs at least 2 dimensions, got {shape}")
    if shape[0] > PMAX:
        raise NkiRuleError(f"{what}: number of partitions {shape[0]} exceed architecture limitation of {PMAX}")


def _tensor(t, op: str, role: str) -> FakeTensor:
    if not isinstance(t, FakeTensor):
        raise NkiRuleError(f"{op}: {role} must be an NKI tensor, got {type(t).__name__}")
    return t


def _read(t, op: str, role: str, allowed: tuple[str, ...]) -> np.ndarray:
    t = _tensor(t, op, role)
    if t.buffer not in allowed:
        raise NkiRuleError(f"{op}: {role} is in {t.buffer}; {op} reads {role} only from {'/'.join(allowed)}")
    return t.values.astype(np.float64 if t.dtype != "int32" else np.int64)


def _write(t, values: np.ndarray, op: str, allowed: tuple[str, ...]) -> None:
    t = _tensor(t, op, "dst")
    if t.buffer not in allowed:
        raise NkiRuleError(f"{op}: dst is in {t.buffer}; {op} writes only to {'/'.join(allowed)}")
    if t.shape != np.shape(values):
        raise NkiRuleError(f"{op}: dst {t.shape} != result {np.shape(values)}")
    t.values[...] = _cast(values, t.dtype)
    t.written[...] = True


def hbm_input(array: np.ndarray, dtype: str) -> FakeTensor:
    """A kernel input in HBM of ``dtype`` (how a test passes bfloat16 without ml_dtypes)."""
    name = dtype_name(dtype)
    values = _cast(np.asarray(array, dtype=np.float32), name)
    return FakeTensor.whole(Buffer(values.shape, name, "hbm", values))
