"""Which Neuron SDK a venv holds beside the one its line is pinned to: in the native line's refusal
(models/neuron/env.py) and in trn2-check's summary (launcher/trn2_probes.py, launcher/trn2_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from siglip_serve.launcher import trn2_report
from siglip_serve.models.neuron.env import (
    NEURONX_CC_VERSION,
    SDK_RELEASE,
    TorchNeuronRefusal,
    check_native_sdk,
    neuron_release,
)


@pytest.mark.parametrize(("torch_neuronx", "release"), [
    ("2.14.3.0.1", "2.33"), ("2.13.3.0.7", "2.33"), ("2.14.3.1.0", "2.34"), ("2.13.3.1.2", "2.34"),
    ("2.9.0.2.15.32035", "2.31.0"), ("2.14.4.0.0", None), ("2.14.3.10.0", None), (None, None)])
def test_a_torch_neuronx_version_names_its_neuron_release(torch_neuronx: str | None, release: str | None) -> None:
    assert neuron_release(torch_neuronx) == release


def test_the_native_line_refuses_neuron_2_34_naming_both_releases() -> None:
    with pytest.raises(TorchNeuronRefusal) as refused:
        check_native_sdk({"torch": "2.14.0", "torch_neuronx": "2.14.3.1.0", "neuronx_cc": NEURONX_CC_VERSION})
    assert f"pinned to Neuron {SDK_RELEASE}" in str(refused.value) and "2.14.3.1.0 (Neuron 2.34)" in str(refused.value)


def test_trn2_checks_summary_names_the_sdk_found_beside_the_pinned_one(tmp_path: Path) -> None:
    for name, line, version, found, pinned in (("versions.json", "native", "2.14.3.1.0", "2.34", SDK_RELEASE),
                                               ("versions-2.json", "trace", "2.9.0.2.15.32035", "2.31.0", "2.31.0")):
        (tmp_path / name).write_text(json.dumps({"executable": f"/venv-{line}/bin/python", "line": line,
                                                 "versions": {"torch_neuronx": version},
                                                 "neuron_sdk": {"found": found, "pinned": pinned}}))
    sdks = trn2_report.neuron_sdks(tmp_path)
    assert [(s["line"], s["found"], s["pinned"]) for s in sdks] == [("trace", "2.31.0", "2.31.0"),
                                                                     ("native", "2.34", SDK_RELEASE)]
    md = trn2_report.markdown({"neuron_sdks": sdks, "cosines": {}, "warm_starts": {},
                               "neff_files": {"files": [], "outside_the_artifacts": []}, "hardware_answers": []})
    native = next(line for line in md if "/venv-native/" in line)
    assert f"Neuron 2.34 found, {SDK_RELEASE} pinned for the native line (the backend refuses it" in native
    trace = next(line for line in md if "/venv-trace/" in line)
    assert "Neuron 2.31.0 found, 2.31.0 pinned for the trace line" in trace and "refuses" not in trace
