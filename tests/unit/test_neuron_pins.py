"""The trace path's package set: constraints-neuron-2.31.txt and the `neuron` extra name the same
versions, and serving does not pull in the NKI kernel toolchain."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement

from tests.helpers import REPO

CONSTRAINTS = REPO / "constraints-neuron-2.31.txt"

# Neuron SDK 2.31.0's release content: the trace path's last coherent set.
NEURON_2_31 = {
    "torch-neuronx": "==2.9.0.2.15.32035",
    "neuronx-cc": "==2.26.6360.0",
    "libneuronxla": "==2.2.17544.0",
    "torch": "==2.9.*",
    "torchvision": "==0.24.*",
}


def constraints() -> dict[str, Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return {(req := Requirement(line)).name: req for line in lines if line}


def extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}


def test_the_constraints_pin_neuron_2_31_exactly() -> None:
    pinned = constraints()
    assert {name: str(pinned[name].specifier) for name in NEURON_2_31} == NEURON_2_31
    assert str(pinned["nki"].specifier) == "==0.5.0"


def test_the_neuron_extra_is_the_constraints_set() -> None:
    pinned = constraints()
    neuron = {req.name: req for req in extras()["neuron"]}
    assert set(neuron) == set(NEURON_2_31)
    for name, req in neuron.items():
        assert req.specifier == pinned[name].specifier, name


def test_the_pinned_torch_satisfies_the_projects_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {(req := Requirement(r)).name: req for r in project["dependencies"]}
    # A version the 2.31 wildcard admits must also be admitted by the serving dependencies.
    assert base["torch"].specifier.contains("2.9.1") and constraints()["torch"].specifier.contains("2.9.1")
    assert base["torchvision"].specifier.contains("0.24.1")
    assert constraints()["torchvision"].specifier.contains("0.24.1")


def test_nki_is_a_kernels_extra_not_a_serving_one() -> None:
    groups = extras()
    assert all(req.name != "nki" for req in groups["neuron"])
    (nki,) = (req for req in groups["kernels"] if req.name == "nki")
    assert nki.specifier.contains("0.5.0")


@pytest.mark.parametrize("torch_version, refused", [("2.14.0", False), ("2.14.0+cpu", False), ("2.14.1", True),
                                                    ("2.14.1+cpu", True)])
def test_the_native_backend_takes_only_the_torch_torchneuron_is_built_for(torch_version: str, refused: bool) -> None:
    from siglip_serve.models.neuron.env import NEURONX_CC_VERSION, TorchNeuronRefusal, check_native_sdk

    versions = {"torch": torch_version, "torch_neuronx": "2.14.3.0.1", "neuronx_cc": NEURONX_CC_VERSION}
    if not refused:
        check_native_sdk(versions)
        return
    shown = rf"built for torch 2\.14\.0 but this venv has torch {re.escape(torch_version)}"
    with pytest.raises(TorchNeuronRefusal, match=shown):
        check_native_sdk(versions)
