"""Fixtures of the device tests. Whether a hardware-marked test runs is decided by tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def neuron_device():
    """The NeuronCore of the line installed here (torch-xla on Neuron 2.31, TorchNeuron on 2.33), or a skip
    when only the NKI simulator is available."""
    from siglip_serve.kernels.device import DeviceUnavailableError, resolve_device

    try:
        return resolve_device("neuron")
    except DeviceUnavailableError as exc:
        pytest.skip(f"no NeuronCore: {exc}")
