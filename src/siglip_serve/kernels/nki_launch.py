"""Launch and check the NKI kernels of :mod:`siglip_serve.kernels.nki_kernels`.

What runs is prepared and validated first, with nothing but NumPy
(:mod:`siglip_serve.kernels.nki_specs`, re-exported here); only then is ``nki`` imported, lazily.

Runs go to the NKI CPU simulator (``nki.simulate``; ``nki.simulate_kernel`` on
older SDKs) or to a NeuronCore with the recompile guard: through torch-xla on the 2.31 trace line,
as ``nki.jit`` calls on TorchNeuron's ``neuron`` tensors on the 2.33 line
(:mod:`siglip_serve.kernels.device_neuron`). Every
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
from siglip_serve.kernels.device import WALL_CLOCK_TIMING
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable
from siglip_serve.kernels.lnc import launch_grid, pin_launch_lnc, require_kernel_lnc
from siglip_serve.kernels.nki_specs import (  # noqa: F401 - re-exported: callers launch what they prepare there
    KernelRun,
    at_lnc,
    conv_weights_stationary,
    default_runs,
    prepare_conv2d,
    prepare_gated_mlp,
    prepare_tensor_add_spmd,
    prepare_transpose2d,
    prepare_vector_add_stream,
    prepare_vector_add_tiled,
    validate_conv2d,
    validate_gated_mlp,
    validate_tensor_add_spmd,
    validate_transpose2d,
    validate_vector_add_stream,
    validate_vector_add_tiled,
)
from siglip_serve.models.neuron.sdk import nki_status as nki_status  # where trn2-check's probe asks it too

log = logging.getLogger(__name__)


# --- nki availability -----------------------------------------------------------------------

def _nki():
    usable, reason = nki_status()
    if not usable:
        raise KernelUnavailable(f"the real NKI package is required: {reason}")
    import nki

    return nki


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
    """Run on a NeuronCore, through torch-xla on the 2.31 line or TorchNeuron's eager ``neuron`` device on the
    2.33 line (whichever is installed): the result plus wall-clock percentiles in microseconds."""
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
                          f"{getattr(device, 'launch_method', 'torch-xla')} at LNC={run.lnc}", WALL_CLOCK_TIMING)
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


def check_kernel(run: KernelRun, on: str = "simulator", device: Any = None) -> CheckResult:
    """Run one kernel (simulator or neuron) and compare it with its golden reference, at the kernel's
    tolerance there (``kernel_tolerance``); the result names the LNC it ran at."""
    tolerance = kernel_tolerance(run, on)
    if on == "simulator":
        actual = simulate(run)
        where = f"simulator {pin_simulator_target()}"
    elif on == "neuron":
        actual, _ = run_on_neuron(run, warmup=1, iterations=1, device=device)
        where = "neuron"
    else:
        raise KernelInputError(f"on must be 'simulator' or 'neuron', got {on!r}")
    result = compare(run.name, f"nki kernel ({where}, LNC={run.lnc})", actual, run.expected, tolerance, tolerance)
    return dataclasses.replace(result, tolerance=tolerance, lnc=run.lnc)
