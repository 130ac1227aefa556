"""Test-only stand-in for the slice of torch-xla that kernels/device_neuron.py asks of the 2.31 trace line:
``torch_xla.device()``, ``torch_xla.sync()``, ``xm.wait_device_ops()`` and the ``CompileTime`` metric.

It makes ``import torch_xla`` work so a test can check which Neuron line the kernels pick and that the
trace line's synchronisation and compile counter are the ones called. It does NOT prove anything about
torch-xla itself: its device is only a name (no tensor can move to it), nothing is lazy or compiled, and
the metric is whatever the test sets. The neuron-marked tests run the real thing on a trn2.
"""
from __future__ import annotations

import importlib.machinery
import types
from typing import Any


class FakeXla:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.compile_time_samples = 0

    def modules(self) -> dict[str, types.ModuleType]:
        import torch

        def module(name: str) -> types.ModuleType:
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec reads it from sys.modules
            return m

        root, core, xm, debug, met = (module(n) for n in ("torch_xla", "torch_xla.core", "torch_xla.core.xla_model",
                                                          "torch_xla.debug", "torch_xla.debug.metrics"))
        root.device = lambda: torch.device("xla", 0)
        root.sync = lambda: self.calls.append("sync")
        xm.wait_device_ops = lambda: self.calls.append("wait_device_ops")
        xm.mark_step = lambda: self.calls.append("mark_step")
        met.metric_data = lambda name: (self.compile_time_samples, 0.0, []) if name == "CompileTime" else None
        root.core, core.xla_model, root.debug, debug.metrics = core, xm, debug, met
        return {m.__name__: m for m in (root, core, xm, debug, met)}


def install(monkeypatch: Any) -> FakeXla:
    """Put the stand-in in sys.modules for the rest of the test."""
    import sys

    fake = FakeXla()
    for name, module in fake.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return fake
