"""Gated-MLP benchmark (seed 002): the compiler path against the NKI kernel path.

* ``compiler``: the torch module compiled as a whole graph. On Neuron that is
  ``torch_neuronx.trace`` (neuronx-cc) on the 2.31 trace line, ``torch.compile(backend="neuron")``
  on TorchNeuron (2.33); on cpu/cuda ``torch.jit.trace``.
* ``nki``: the same module whose forward calls :func:`siglip_serve.kernels.nki_kernels.gated_mlp_t`,
  traced with ``torch_neuronx.trace`` on the trace line so the kernel is compiled into one NEFF once
  instead of being re-specialised per call (the seed's ~4 s-per-call pitfall); on TorchNeuron the
  kernel is called eagerly on ``neuron`` tensors and compiles on its first call. Neuron only.

Compile time is measured on the cache miss, apart from execution; the timed loop
runs inside ``CompileCache.guard`` so any compile during it raises RecompileError.
Both paths compile at the Neuron runtime's LNC and the kernel launches with the matching
grid (:mod:`siglip_serve.kernels.lnc`). Latency here is framework wall clock (``timing:
wall_clock_including_dispatch``: dispatch and, for torch_neuronx.trace, host<->device copies
included); the kernel's own device time comes from Neuron Explorer
(:mod:`siglip_serve.kernels.device_timing`).
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from siglip_serve.kernels import references
from siglip_serve.kernels.compile_cache import CacheKey, CompileCache
from siglip_serve.kernels.device import Device, LatencyStats, ResultMismatch, torch_dtype
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable
from siglip_serve.kernels.lnc import launch_grid, pin_launch_lnc, runtime_kernel_lnc
from siglip_serve.kernels.nki_launch import nki_status, validate_gated_mlp

log = logging.getLogger(__name__)

PATHS = ("compiler", "nki")


@dataclass(frozen=True)
class MLPConfig:
    batch: int
    seq: int
    hidden: int
    intermediate: int

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise KernelInputError(f"MLPConfig.{name} must be >= 1, got {value}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def label(self) -> str:
        return f"b={self.batch}, s={self.seq}, h={self.hidden}, i={self.intermediate}"

    @property
    def flops(self) -> int:
        """Three [T,H]x[H,I]-sized matmuls; the SiLU and product are negligible."""
        return 3 * 2 * self.tokens * self.hidden * self.intermediate

    @classmethod
    def parse(cls, text: str) -> MLPConfig:
        """``"1x128x1024x512"`` = batch x seq x hidden x intermediate."""
        try:
            b, s, h, i = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise KernelInputError(f"MLP config {text!r} is not BxSxHxI") from None
        return cls(b, s, h, i)


# The two configurations of seed 002.
SEED_CONFIGS = (MLPConfig(1, 128, 1024, 512), MLPConfig(1, 256, 2048, 1024))


def make_inputs(cfg: MLPConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Activations and fan-in-scaled weights (keeps outputs O(1) so tolerances mean something)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((cfg.tokens, cfg.hidden)).astype(np.float32),
        "w_gate": (rng.standard_normal((cfg.hidden, cfg.intermediate)) / np.sqrt(cfg.hidden)).astype(np.float32),
        "w_up": (rng.standard_normal((cfg.hidden, cfg.intermediate)) / np.sqrt(cfg.hidden)).astype(np.float32),
        "w_down": (rng.standard_normal((cfg.intermediate, cfg.hidden)) / np.sqrt(cfg.intermediate)).astype(np.float32),
    }


def _build_module(inputs: dict[str, np.ndarray], dtype: str, use_nki: bool, lnc: int):
    import torch

    class GatedMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in ("w_gate", "w_up", "w_down"):
                self.register_buffer(name, torch.from_numpy(inputs[name]).to(torch_dtype(dtype)))

        def forward(self, x):
            if use_nki:
                from siglip_serve.kernels.nki_launch import jitted_kernel

                kernel = jitted_kernel("gated_mlp_t")
                # The kernel's LNC must equal the graph's (--lnc below): NCC_EVRF066 otherwise.
                pin_launch_lnc(lnc)
                grid = launch_grid(lnc)
                kernel = kernel if grid is None else kernel[grid]
                out_t = kernel(x.t().contiguous(), self.w_gate, self.w_up, self.w_down)
                return out_t.t()
            gate = torch.nn.functional.silu(x @ self.w_gate)
            return (gate * (x @ self.w_up)) @ self.w_down

    return GatedMLP().eval()


def make_compile_fn(device: Device, inputs: dict[str, np.ndarray], lnc: int) -> Callable[[CacheKey], Callable]:
    """The compile step for each (device, path): what the cache calls on a miss."""
    import torch

    def compile_fn(key: CacheKey) -> Callable[..., Any]:
        use_nki = key.path == "nki"
        module = _build_module(inputs, key.dtype, use_nki, lnc)
        example = torch.from_numpy(inputs["x"]).to(torch_dtype(key.dtype))
        if device.kind == "neuron" and device.line == "native":
            return _torchneuron_compile(module, example, device, use_nki)
        if device.kind == "neuron":
            import torch_neuronx

            # The kernel and the graph must agree on LNC (compiler error NCC_EVRF066 otherwise).
            return torch_neuronx.trace(module, example, compiler_args=["--lnc", str(lnc)])
        if use_nki:
            raise KernelUnavailable("the nki path needs a NeuronCore")
        with torch.no_grad(), warnings.catch_warnings():
            # Deprecated in newer torch, but it is the explicit ahead-of-time compile step that
            # torch 2.9 (the Neuron DLAMI's) and later both offer; torch.compile compiles lazily.
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.trace(module.to(device.torch_device), example.to(device.torch_device))

    return compile_fn


def _torchneuron_compile(module: Any, example: Any, device: Device, use_nki: bool) -> Callable[..., Any]:
    """TorchNeuron (2.33): the compiler path is ``torch.compile(backend="neuron")`` (neuronx-cc); the nki path
    calls the kernel eagerly, which compiles it on the first call for those shapes. Either is run once here,
    so the compile is timed apart from the timed loop, as ``torch_neuronx.trace`` is on the trace line."""
    import torch

    module = module.to(device.torch_device)
    fn = module if use_nki else torch.compile(module, backend=device.compile_backend, fullgraph=True, dynamic=False)
    x = example.to(device.torch_device)
    with torch.no_grad():
        device.run_synced(lambda: fn(x))
    return fn


@dataclass(frozen=True)
class MLPResult:
    kernel: str
    config: str
    device: str
    dtype: str
    compile_ms: float
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    tflops_at_p50: float
    max_abs_err: float
    iterations: int
    compilations: int
    lnc: int
    timing: str


def skip_reason(path: str, device: Device) -> str | None:
    """Why a path cannot run here, or None."""
    if path not in PATHS:
        raise KernelInputError(f"path must be one of {PATHS}, got {path!r}")
    if path == "nki":
        if device.kind != "neuron":
            return f"nki path needs a NeuronCore (device is {device.kind})"
        usable, reason = nki_status()
        if not usable:
            return reason
    return None


def benchmark_mlp(
    cfg: MLPConfig,
    device: Device,
    path: str = "compiler",
    dtype: str = "float32",
    warmup: int = 3,
    iterations: int = 20,
    lnc: int | None = None,
    cache: CompileCache | None = None,
    seed: int = 0,
) -> MLPResult:
    import torch

    if path == "nki":
        validate_gated_mlp(cfg.tokens, cfg.hidden, cfg.intermediate, 4 if dtype == "float32" else 2)
    reason = skip_reason(path, device)
    if reason:
        raise KernelUnavailable(f"cannot run the {path} path: {reason}")
    lnc = runtime_kernel_lnc() if lnc is None else lnc
    inputs = make_inputs(cfg, seed)
    if cache is None:
        cache = CompileCache(make_compile_fn(device, inputs, lnc), device.compile_count)
    key = CacheKey((cfg.tokens, cfg.hidden, cfg.intermediate), dtype, path)
    was_cached = key in cache
    compiled = cache.get(key)
    compile_ms = 0.0 if was_cached else compiled.compile_time_s * 1e3

    # torch_neuronx-traced models take host tensors and copy them in themselves; TorchNeuron's take its own.
    target = "cpu" if device.line == "trace" else device.torch_device
    x = torch.from_numpy(inputs["x"]).to(torch_dtype(dtype)).to(target)
    expected = references.gated_mlp(inputs["x"], inputs["w_gate"], inputs["w_up"], inputs["w_down"])
    errors: list[float] = []

    def check(out) -> None:
        # Once, on the last timed result: the error reported is that of the work that was timed.
        actual = out.float().cpu().numpy()
        if actual.shape != expected.shape:
            raise ResultMismatch(f"{path} {cfg.label}: timed call returned shape {actual.shape}")
        errors.append(float(np.max(np.abs(actual - expected))))

    with torch.no_grad():
        for _ in range(max(1, warmup)):
            device.run_synced(lambda: compiled.fn(x))
        with cache.guard(f"{path} {cfg.label} timed loop"):
            samples = device.time_calls(lambda: compiled.fn(x), iterations, check=check)
    stats = LatencyStats.from_seconds(samples)
    err = errors[0]
    return MLPResult(
        kernel="neuronxcc" if (path == "compiler" and device.kind == "neuron") else
        ("nki" if path == "nki" else f"torch-{device.kind}"),
        config=cfg.label,
        device=device.kind,
        dtype=dtype,
        compile_ms=compile_ms,
        latency_mean_ms=stats.latency_mean_ms,
        latency_p50_ms=stats.latency_p50_ms,
        latency_p99_ms=stats.latency_p99_ms,
        tflops_at_p50=cfg.flops / (stats.latency_p50_ms / 1e3) / 1e12,
        max_abs_err=err,
        iterations=stats.iterations,
        compilations=cache.compilations,
        lnc=lnc,
        timing=device.timing,
    )


def format_mlp_table(results: list[MLPResult], skipped: Sequence[tuple[str, str, str]] = ()) -> str:
    header = (f"{'Kernel':<12} {'Config':<30} {'Compile (ms)':>12} {'p50 (ms)':>9} {'p99 (ms)':>9} "
              f"{'TFLOP/s':>8} {'max|err|':>9} {'LNC':>3}  timing")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.kernel:<12} {r.config:<30} {r.compile_ms:>12.1f} {r.latency_p50_ms:>9.3f} "
                     f"{r.latency_p99_ms:>9.3f} {r.tflops_at_p50:>8.3f} {r.max_abs_err:>9.2e} {r.lnc:>3}  {r.timing}")
    for path, config, reason in skipped:
        lines.append(f"{path:<12} {config:<30} skipped: {reason}")
    return "\n".join(lines)
