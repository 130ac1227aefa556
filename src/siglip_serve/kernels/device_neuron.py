"""The NeuronCore of the kernel benchmarks, on whichever Neuron line this venv has.

* The trace line (Neuron 2.31, torch-neuronx 2.9): torch-xla's lazy ``xla`` device, synchronised with
  ``torch_xla.sync()`` + ``xm.wait_device_ops()``, its ``CompileTime`` metric as the compile counter. The
  2.33 DLAMI no longer ships torch-xla ("DLAMIs for PyTorch 2.9 (PyTorch/XLA) are no longer published
  after Neuron SDK 2.31.0"), so nothing here asks for it on the other line.
* The native line (Neuron 2.33, TorchNeuron, torch-neuronx 2.13+): the eager ``neuron`` device of
  :class:`siglip_serve.models.neuron.runtime.TorchNeuronRuntime`. An ``@nki.jit`` kernel called with
  tensors on it runs through torch-neuronx: "The first call compiles the kernel for the input shapes,
  data types, and non-tensor argument values of that call. Later calls with the same inputs reuse the
  compiled kernel" (Neuron docs, "How to work with NKI kernels from torch-neuronx"). Synchronised
  through ``torch.accelerator``; the compile counter is the number of NEFFs in TorchNeuron's persistent
  cache (a compile that cache does not record is not seen).

Which line: torch-neuronx's package metadata (2.13+ is TorchNeuron); without it (a source checkout, a
test double) whichever imports, torch-xla first.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from siglip_serve.kernels.errors import DeviceUnavailableError

LINE_NAMES = {"trace": "the Neuron 2.31 trace line (torch-neuronx 2.9 with torch-xla)",
              "native": "TorchNeuron (Neuron 2.33, torch-neuronx 2.13+, the neuron device)"}


@dataclass(frozen=True)
class NeuronCore:
    """What kernels/device.py makes its Device of: the torch device, how to wait for it and count compiles."""

    torch_device: Any
    description: str
    sync: Callable[[], None]
    compile_count: Callable[[], int | None]
    line: str
    compile_backend: Any = None


def neuron_core(native_runtime: Any = None) -> NeuronCore:
    """The NeuronCore on the line installed here, or DeviceUnavailableError naming what is missing."""
    from siglip_serve.models.neuron.sdk import installed_line

    line = installed_line()
    if line == "trace":
        return xla_device()
    if line == "native":
        return torchneuron_device(native_runtime)
    if importlib.util.find_spec("torch_xla") is not None:
        return xla_device()
    try:
        return torchneuron_device(native_runtime)
    except DeviceUnavailableError as exc:
        raise DeviceUnavailableError(f"no NeuronCore line here: torch-xla is not installed (so not "
                                     f"{LINE_NAMES['trace']}), and {exc}") from None


def _lnc_label() -> str:
    from siglip_serve.kernels.lnc import runtime_kernel_lnc

    return f"runtime LNC={runtime_kernel_lnc()}"


def xla_device() -> NeuronCore:
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
    except ImportError as exc:
        raise DeviceUnavailableError(f"torch-xla is not installed ({exc}); it is {LINE_NAMES['trace']}'s "
                                     f"device, and the 2.33 line has none") from exc
    try:
        import torch_neuronx  # noqa: F401 - imported only to register the Neuron PJRT plugin
    except ImportError as exc:
        raise DeviceUnavailableError(f"torch-neuronx is not installed: {exc}") from exc
    xla = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    if "xla" not in str(xla):
        raise DeviceUnavailableError(f"torch-xla returned a non-XLA device {xla!r}")

    def sync() -> None:
        # Cut the lazy graph (compiling it if new) and wait until the device has run it.
        if hasattr(torch_xla, "sync"):
            torch_xla.sync()
        else:
            xm.mark_step()
        xm.wait_device_ops()

    def compile_count() -> int | None:
        data = met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    return NeuronCore(xla, f"Neuron {xla} (torch-xla, {_lnc_label()})", sync, compile_count, "trace")


def torchneuron_device(runtime: Any = None) -> NeuronCore:
    """TorchNeuron's ``neuron`` device through the backend's runtime seam (its SDK checks included)."""
    from siglip_serve.models.neuron.env import TorchNeuronRefusal, neff_cache_dir

    if runtime is None:
        try:
            from siglip_serve.models.neuron.runtime import TorchNeuronRuntime
        except ImportError as exc:  # torch itself absent
            raise DeviceUnavailableError(f"{LINE_NAMES['native']} is not usable: {exc}") from exc
        runtime = TorchNeuronRuntime()
    try:
        runtime.check_sdk()
    except TorchNeuronRefusal as exc:
        raise DeviceUnavailableError(f"{LINE_NAMES['native']} is not usable: {str(exc).split(';')[0]}") from None

    def compile_count() -> int | None:
        return len(runtime.graph_files(neff_cache_dir(os.environ)))

    device = runtime.device
    return NeuronCore(device, f"Neuron {device} (TorchNeuron, {_lnc_label()})", runtime.synchronize, compile_count,
                      "native", runtime.compile_backend)
