"""Fixtures of the kernel tests: the recorded profiles, the NumPy NKI model.

Whether a hardware-marked test runs is decided by tests/conftest.py, for every directory."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def data_dir():
    return HERE / "data"


KERNEL_MODULES = ("nki_kernels", "nki_siglip", "nki_tiles")  # import nki at load time


def _load_fake_nki():
    # Loaded by path so it works under any pytest --import-mode.
    spec = importlib.util.spec_from_file_location("kernels_fake_nki", HERE / "kernels_fake_nki.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_nki(monkeypatch, request):
    """The NumPy NKI model of kernels_fake_nki installed as ``nki``; siglip_serve.kernels.nki_kernels reloads on it.

    Yields ``state`` (instruction counts, launch grids), the ``nki``/``nl``/``nisa`` modules and
    ``lib`` (the model module: NkiRuleError, hbm_input, round_to_bf16). Its ``nki.__version__`` is
    "fake-for-tests" unless the test parametrizes the fixture (``indirect=True``) with another.
    """
    import siglip_serve.kernels as kernels
    from siglip_serve.kernels import nki_launch

    lib = _load_fake_nki()
    # Launches set NEURON_LOGICAL_NC_CONFIG (kernels/lnc.py pin_launch_lnc); set here first, so that
    # monkeypatch puts the variable back as it was when the test ends.
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "")
    # The simulator's target is pinned by a launch too (kernels/nki_launch.py pin_simulator_target).
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    state = lib.FakeNkiState()
    modules = lib.build(state, getattr(request, "param", "fake-for-tests"))
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in KERNEL_MODULES:
        monkeypatch.delitem(sys.modules, f"siglip_serve.kernels.{name}", raising=False)
        monkeypatch.delattr(kernels, name, raising=False)
    monkeypatch.setattr(nki_launch, "_JITTED", {})
    yield SimpleNamespace(state=state, nki=modules["nki"], nl=modules["nki.language"],
                          nisa=modules["nki.isa"], lib=lib)
    # Never leave the fake-bound modules behind for later tests.
    for name in KERNEL_MODULES:
        sys.modules.pop(f"siglip_serve.kernels.{name}", None)
        if hasattr(kernels, name):
            delattr(kernels, name)
