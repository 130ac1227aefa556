"""Validate, launch and check the NKI kernels of :mod:`siglip_serve.kernels.nki_kernels`.

Validation runs first and needs nothing but NumPy, so a tile that breaks a
NeuronCore limit fails here with a clear :class:`TileSizeError` (worded like the
compiler's "number of partitions 256 exceed architecture limitation of 128")
instead of deep inside a compile. Only then is ``nki`` imported, lazily.

Runs go to the NKI CPU simulator (``nki.simulate``; ``nki.simulate_kernel`` on
older SDKs) or to a NeuronCore through torch-xla with the recompile guard. Every
launch uses the Neuron runtime's LNC (:mod:`siglip_serve.kernels.lnc`): ``kernel[2](...)`` on a
default trn2, plain ``kernel(...)`` at LNC=1. The current ``nki`` package has no
``nki.benchmark``, so hardware latencies here are wall clock including dispatch
(labelled ``timing: wall_clock_including_dispatch``); device time comes from
Neuron Explorer (:mod:`siglip_serve.kernels.device_timing`).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from siglip_serve.core.constants import KERNEL_TARGET, PLATFORM_TARGET_ENV
from siglip_serve.kernels import references
from siglip_serve.kernels.device import WALL_CLOCK_TIMING
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable
from siglip_serve.kernels.hardware import (
    GEMM_MOVING_FMAX,
    PMAX,
    check_free,
    check_partitions,
    check_psum_banks,
    check_sbuf_budget,
)
from siglip_serve.kernels.lnc import launch_grid, pin_launch_lnc, require_kernel_lnc, runtime_kernel_lnc

log = logging.getLogger(__name__)



# --- nki availability -----------------------------------------------------------------------

def nki_status() -> tuple[bool, str]:
    """(usable, reason). PyPI's ``nki`` 0.0.1 is an empty placeholder and does not count."""
    try:
        import nki
    except ImportError as exc:
        return False, f"nki is not installed ({exc})"
    try:
        importlib.import_module("nki.isa")
        importlib.import_module("nki.language")
    except ImportError as exc:
        version = getattr(nki, "__version__", "unknown")
        return False, f"nki {version} has no nki.language/nki.isa (the PyPI placeholder?): {exc}"
    if not hasattr(nki, "jit"):
        return False, "nki has no nki.jit; need NKI 0.2+ (Neuron SDK 2.27+)"
    return True, f"nki {getattr(nki, '__version__', 'unknown')}"


def _nki():
    usable, reason = nki_status()
    if not usable:
        raise KernelUnavailable(f"the real NKI package is required: {reason}")
    import nki

    return nki


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


# --- running ---------------------------------------------------------------------------------

_JITTED: dict[str, Any] = {}


def jitted_kernel(name: str, module: str = "siglip_serve.kernels.nki_kernels"):
    """``nki.jit`` applied once per kernel; the jit object caches compiled NEFFs per input signature."""
    key = f"{module}:{name}"
    if key not in _JITTED:
        nki = _nki()
        _JITTED[key] = nki.jit(getattr(importlib.import_module(module), name))
    return _JITTED[key]


def launchable(run: KernelRun, on_device: bool = True):
    """The jitted kernel ready to launch at ``run.lnc``; a kernel not written for it raises.

    The LNC is set in the environment first (``pin_launch_lnc``, what NKI 0.7's ``nki.jit`` reads) and, at
    LNC > 1, passed as the matching launch grid too (``launch_grid``: what NKI 0.5 and the simulator's docs
    use). At LNC=1 the plain call is the documented form on every version.
    """
    require_kernel_lnc(run.name, run.supported_lnc, run.lnc)
    pin_launch_lnc(run.lnc, on_device=on_device)
    kernel = jitted_kernel(run.kernel, run.module)
    grid = launch_grid(run.lnc)
    return kernel if grid is None else kernel[grid]


def pin_simulator_target(env: MutableMapping[str, str] | None = None) -> str:
    """The chip the NKI simulator models, as a row title says it: NEURON_PLATFORM_TARGET_OVERRIDE where the
    user set it, else pinned here to trn2 (unset, the simulator takes the chip it runs on, else trn3)."""
    env = os.environ if env is None else env
    current = (env.get(PLATFORM_TARGET_ENV) or "").strip()
    if current and current != KERNEL_TARGET:
        return f"{current} from {PLATFORM_TARGET_ENV}"
    env[PLATFORM_TARGET_ENV] = KERNEL_TARGET
    return KERNEL_TARGET


def simulate(run: KernelRun) -> np.ndarray:
    """Run on the NKI CPU simulator, for trn2 unless the user chose another target, and return the
    host-layout result."""
    nki = _nki()
    kernel = launchable(run, on_device=False)
    pin_simulator_target()
    if hasattr(nki, "simulate"):
        out = nki.simulate(kernel)(*run.args)
    elif hasattr(nki, "simulate_kernel"):
        out = nki.simulate_kernel(kernel, *run.args)
    else:
        raise KernelUnavailable("this nki has neither nki.simulate nor nki.simulate_kernel")
    return run.postprocess(np.asarray(out))


@dataclass(frozen=True)
class KernelTiming:
    name: str
    latency_p50_us: float
    latency_p99_us: float
    iterations: int
    method: str
    timing: str  # WALL_CLOCK_TIMING here; "device" only for profiler-measured times


def run_on_neuron(run: KernelRun, warmup: int = 5, iterations: int = 20,
                  device: Any = None) -> tuple[np.ndarray, KernelTiming]:
    """Run on a NeuronCore through torch-xla: the result plus wall-clock percentiles in microseconds."""
    from siglip_serve.kernels.device import resolve_device

    kernel = launchable(run)
    tolerance = kernel_tolerance(run, "neuron")
    return time_kernel(run, kernel, device or resolve_device("neuron"), warmup, iterations, tolerance, tolerance)


def time_kernel(run: KernelRun, kernel: Callable[..., Any], device: Any, warmup: int,
                iterations: int, rtol: float = 2e-3, atol: float = 2e-3,
                dtype: str | None = None) -> tuple[np.ndarray, KernelTiming]:
    """Warm up (the first call compiles), then time ``kernel(*args)`` with every result kept alive
    across its sync, and check the last timed result against the reference once.
    ``dtype`` (e.g. bfloat16) casts the floating-point inputs on the way to the device."""
    import torch

    from siglip_serve.kernels.compile_cache import CompileCache
    from siglip_serve.kernels.device import LatencyStats, ResultMismatch, torch_dtype

    def to_device(a: np.ndarray):
        t = torch.from_numpy(np.asarray(a))
        if dtype is not None and t.is_floating_point():
            t = t.to(torch_dtype(dtype))
        return t.to(device.torch_device)

    args = [to_device(a) if isinstance(a, np.ndarray) else a for a in run.args]
    for _ in range(max(1, warmup)):
        device.run_synced(lambda: kernel(*args))
    checked: list[np.ndarray] = []

    def check(out) -> None:
        actual = run.postprocess(out.float().cpu().numpy() if hasattr(out, "cpu") else np.asarray(out))
        result = compare(run.name, "timed kernel calls", actual, run.expected, rtol, atol)
        if not result.passed:
            raise ResultMismatch(f"{run.name}: the timed calls returned a wrong result "
                                       f"(max |err| {result.max_abs_err:.3g}) {result.detail}".rstrip())
        checked.append(actual)

    cache = CompileCache(lambda key: kernel, device.compile_count)
    with cache.guard(f"{run.name} timed loop"):
        samples = device.time_calls(lambda: kernel(*args), iterations, check=check)
    stats = LatencyStats.from_seconds(samples)
    timing = KernelTiming(run.name, stats.latency_p50_ms * 1e3, stats.latency_p99_ms * 1e3, iterations,
                          f"torch-xla at LNC={run.lnc}", WALL_CLOCK_TIMING)
    return checked[0], timing


# The simulator computes ScalarE's activation functions exactly; on a NeuronCore they are piecewise
# polynomial approximations (nki.api.shared, "Supported Activation Functions"), so on-device rows of kernels
# that call one get a wider tolerance than the simulator's 2e-3. The single-column steps (softmax's [rows, 1]
# reciprocal, LayerNorm's rsqrt) run on VectorE / GpSimd, which the engine-selection guide calls more
# precise and, at a handful of elements per partition, no slower: LayerNorm has no ScalarE function left
# and is held to 2e-3 on the device too. The table says which ScalarE functions each kernel calls
# (tests/unit/kernels/test_kernels_engines.py checks it against the kernels); every row prints the error
# it observed beside its tolerance, which the first trn2 run checks (docs/kernels.md).
SIMULATOR_TOLERANCE = 2e-3
SCALAR_ENGINE_FUNCTIONS = {"softmax_rows": ("exp",), "mlp_gelu_t": ("gelu_apprx_tanh",), "gated_mlp_t": ("silu",)}
DEVICE_TOLERANCE = {kernel: 1e-2 for kernel in SCALAR_ENGINE_FUNCTIONS}


def kernel_tolerance(run: KernelRun, on: str) -> float:
    """rtol = atol for ``run``'s float32 result on ``on`` ("simulator" or "neuron")."""
    if on == "neuron":
        return DEVICE_TOLERANCE.get(run.kernel, SIMULATOR_TOLERANCE)
    return SIMULATOR_TOLERANCE


@dataclass(frozen=True)
class CheckResult:
    name: str
    target: str  # what was compared against the golden reference
    max_abs_err: float
    passed: bool
    detail: str = ""
    tolerance: float | None = None  # rtol = atol it was held to
    lnc: int | None = None  # the LNC a kernel ran at (None: a reference check)

    def as_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "max_abs_err": self.max_abs_err,
                "passed": self.passed, "detail": self.detail, "tolerance": self.tolerance, "lnc": self.lnc}

    @property
    def verdict(self) -> str:
        if self.tolerance is None:
            return "ok" if self.passed else "MISMATCH"
        return f"{'ok within' if self.passed else 'MISMATCH, over'} {self.tolerance:g}"


def compare(name: str, target: str, actual: np.ndarray, expected: np.ndarray,
            rtol: float = 1e-4, atol: float = 1e-4) -> CheckResult:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return CheckResult(name, target, float("inf"), False, f"shape {actual.shape} != {expected.shape}")
    err = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    return CheckResult(name, target, err, bool(np.allclose(actual, expected, rtol=rtol, atol=atol)))


def check_kernel(run: KernelRun, on: str = "simulator") -> CheckResult:
    """Run one kernel (simulator or neuron) and compare it with its golden reference, at the kernel's
    tolerance there (``kernel_tolerance``); the result names the LNC it ran at."""
    tolerance = kernel_tolerance(run, on)
    if on == "simulator":
        actual = simulate(run)
        where = f"simulator {pin_simulator_target()}"
    elif on == "neuron":
        actual, _ = run_on_neuron(run, warmup=1, iterations=1)
        where = "neuron"
    else:
        raise KernelInputError(f"on must be 'simulator' or 'neuron', got {on!r}")
    result = compare(run.name, f"nki kernel ({where}, LNC={run.lnc})", actual, run.expected, tolerance, tolerance)
    return dataclasses.replace(result, tolerance=tolerance, lnc=run.lnc)
