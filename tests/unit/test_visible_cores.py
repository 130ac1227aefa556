"""Issue 35, B4: a range in NEURON_RT_VISIBLE_CORES (the Neuron runtime takes "0-3") is expanded to the comma list
Ray reads before `siglip-serve run` starts Ray, or refused in one line; checked against Ray's own reader and its
raylet's resource check (ray/_private/accelerators/neuron.py, ray/_private/resource_and_label_spec.py), run here
without starting Ray."""
from __future__ import annotations

import argparse

import pytest
from ray._private.accelerators.neuron import NeuronAcceleratorManager
from ray._private.resource_and_label_spec import ResourceAndLabelSpec

from siglip_serve.core.cli import run_main
from siglip_serve.core.constants import expand_visible_cores
from siglip_serve.launcher import cli
from siglip_serve.launcher.preflight import VisibleCoresRefused, ray_visible_cores
from siglip_serve.launcher.timeline import Timeline


def _ray_accepts(monkeypatch: pytest.MonkeyPatch, value: str, neuron_cores: int) -> list[str]:
    """What Ray's raylet makes of the variable: its visible ids, after its check against the declared count."""
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", value)
    ResourceAndLabelSpec(resources={})._resolve_accelerator_resources(NeuronAcceleratorManager, neuron_cores)
    return NeuronAcceleratorManager.get_current_process_visible_accelerator_ids()


@pytest.mark.parametrize("raw, cores", [("3", [3]), ("0-3", [0, 1, 2, 3]), ("0-1,4", [0, 1, 4]),
                                        (" 2, 5-6", [2, 5, 6])])
def test_ranges_expand_as_the_runtime_reads_them(raw: str, cores: list[int]) -> None:
    assert expand_visible_cores(raw) == cores


@pytest.mark.parametrize("raw", ["a", "3-1", "0-", "-1", "1,,2"])
def test_what_is_no_core_index_or_range_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="is not a core index or an inclusive range"):
        expand_visible_cores(raw)


def test_a_range_is_expanded_before_ray_which_otherwise_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"Attempting to start raylet with 3 neuron_cores, but "
                                         r"NEURON_RT_VISIBLE_CORES contains \['0-1', '4'\]"):
        _ray_accepts(monkeypatch, "0-1,4", 3)  # Ray's comma split: "0-1" is one core to it
    env = {"NEURON_RT_VISIBLE_CORES": "0-1,4"}
    assert ray_visible_cores(3, env) == "0,1,4" and env["NEURON_RT_VISIBLE_CORES"] == "0,1,4"
    assert _ray_accepts(monkeypatch, env["NEURON_RT_VISIBLE_CORES"], 3) == ["0", "1", "4"]
    assert ray_visible_cores(3, {"NEURON_RT_VISIBLE_CORES": "0,1,4"}) is None  # a comma list stays as it is
    assert ray_visible_cores(None, {}) is None


def test_more_declared_cores_than_the_variable_names_is_one_line_before_ray(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(VisibleCoresRefused, match=r"--neuron-cores 5 declares more NeuronCores than "
                                                  r"NEURON_RT_VISIBLE_CORES=0-3 names \(4\)"):
        ray_visible_cores(5, {"NEURON_RT_VISIBLE_CORES": "0-3"})
    # Through `siglip-serve run`'s start: refused before the ports are even checked, let alone Ray started.
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-x")
    monkeypatch.setattr("siglip_serve.launcher.preflight.check_ports", lambda *a: pytest.fail("went on past"))
    args = argparse.Namespace(address=None, neuron_cores=2)
    assert run_main(lambda: cli._start(args, Timeline(0.0)), cli.log) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "'0-x' is not a core index or an inclusive range" in record.getMessage()
    assert "\n" not in record.getMessage()
