"""Issue 35, B2: the kernels reach a NeuronCore on whichever Neuron line is installed, torch-xla on the 2.31 trace
line and TorchNeuron's eager ``neuron`` device on the 2.33 line, and say why when neither is there.

Doubles: kernels_fake_xla (torch-xla's device name, sync and compile metric), tests/doubles/torch_neuronx (the
trace line's package), tests/doubles/torchneuron_runtime.RecordingRuntime (TorchNeuron's runtime seam on the CPU)
and kernels_fake_nki (the NKI kernels, taking and returning torch tensors as nki.jit does). Together they prove
which line is picked, what it synchronises and counts, and that the timed loops run and check every kernel on
it; not that torch-xla or TorchNeuron run an NKI kernel (tests/device/test_kernels_neuron.py does, on a trn2).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from siglip_serve.kernels import check, nki_launch, siglip
from siglip_serve.kernels.cli import EXIT_KERNELS_SKIPPED, main
from siglip_serve.kernels.device import DeviceUnavailableError, resolve_device
from siglip_serve.kernels.mlp import MLPConfig, benchmark_mlp
from tests.doubles.torchneuron_runtime import RecordingRuntime
from tests.helpers import neuronx_double

no_real_xla = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None,
                                 reason="a real torch-xla is installed here: these tests are of the 2.33 line")


def _load_fake_xla():
    spec = importlib.util.spec_from_file_location("kernels_fake_xla", os.path.join(os.path.dirname(__file__),
                                                                                    "kernels_fake_xla.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@no_real_xla
def test_without_either_line_the_neuron_device_is_refused_naming_both():
    with pytest.raises(DeviceUnavailableError, match=r"no NeuronCore line here: torch-xla is not installed .*"
                                                     r"TorchNeuron \(Neuron 2.33.*is not usable"):
        resolve_device("neuron")


@no_real_xla
def test_the_kernels_check_on_a_neuroncore_skips_with_the_reason_when_no_line_is_there(fake_nki, capsys):
    assert main(["check", "--kernels-on", "neuron"]) == EXIT_KERNELS_SKIPPED
    printed = capsys.readouterr().out
    assert "NKI kernels SKIPPED: no NeuronCore line here" in printed and "nki kernel (neuron" not in printed


def test_with_torch_xla_importable_the_trace_line_is_picked(monkeypatch):
    xla = _load_fake_xla().install(monkeypatch)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with neuronx_double():
        device = resolve_device("neuron")
    assert (device.kind, device.line, device.launch_method) == ("neuron", "trace", "torch-xla")
    assert device.description == "Neuron xla:0 (torch-xla, runtime LNC=2)"
    device.synchronize()
    assert xla.calls == ["sync", "wait_device_ops"]
    xla.compile_time_samples = 3
    assert device.compile_count() == 3


@no_real_xla
def test_without_torch_xla_torchneuron_runs_and_checks_every_kernel(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    runtime = RecordingRuntime()
    device = resolve_device("neuron", native_runtime=runtime)
    assert (device.line, device.launch_method) == ("native", "TorchNeuron eager")
    assert device.description.endswith("(TorchNeuron, runtime LNC=2)")
    runs = nki_launch.default_runs(seed=8) + siglip.small_runs(lnc=2, seed=8)
    for run in runs:
        out, timing = nki_launch.run_on_neuron(run, warmup=1, iterations=2, device=device)
        tolerance = nki_launch.kernel_tolerance(run, "neuron")
        np.testing.assert_allclose(out, run.expected, rtol=tolerance, atol=tolerance, err_msg=run.name)
        assert timing.method == "TorchNeuron eager at LNC=2" and timing.timing == "wall_clock_including_dispatch"
    assert fake_nki.state.explicit_grids == [2] * (3 * len(runs))  # a warm-up and two timed calls per run
    assert runtime.syncs >= 3 * len(runs)


@no_real_xla
def test_the_check_command_runs_on_torchneuron_and_names_it(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    monkeypatch.setattr("siglip_serve.models.neuron.runtime.TorchNeuronRuntime", RecordingRuntime)
    report = check.run_checks(seed=1, kernels_on="neuron")
    assert report.passed, report.format()
    assert report.setting["NeuronCore"] == "Neuron cpu (TorchNeuron, runtime LNC=1)"
    assert {r.target for r in report.kernels} == {"nki kernel (neuron, LNC=1)"}


@no_real_xla
def test_the_mlp_paths_compile_once_on_torchneuron(fake_nki, monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    runtime = RecordingRuntime()
    device = resolve_device("neuron", native_runtime=runtime)
    cfg = MLPConfig(1, 4, 128, 128)
    compiled = benchmark_mlp(cfg, device, "compiler", "float32", warmup=1, iterations=3, lnc=1)
    assert len(runtime.compiles) == 1 and not runtime.hits  # torch.compile on its backend, once, before the loop
    assert compiled.kernel == "neuronxcc" and compiled.compilations == 1 and compiled.max_abs_err < 1e-3
    kernel = benchmark_mlp(cfg, device, "nki", "float32", warmup=1, iterations=3, lnc=1)
    assert kernel.kernel == "nki" and kernel.compilations == 1 and kernel.max_abs_err < 2e-3
    assert fake_nki.state.explicit_grids and set(fake_nki.state.explicit_grids) == {None}  # LNC=1: plain calls


def test_device_timing_says_how_each_line_saves_its_neffs(tmp_path):
    from siglip_serve.kernels.device_timing import DeviceTimingUnavailable, profile_neff

    with pytest.raises(DeviceTimingUnavailable, match=r"NEURON_FRAMEWORK_DEBUG=1 XLA_IR_DEBUG=1 XLA_HLO_DEBUG=1 on the "
                                                      r"2.31 trace line, or with NEURON_RT_INSPECT_ENABLE=1 "
                                                      r"NEURON_RT_INSPECT_DEVICE_PROFILE=1 "
                                                      r"NEURON_RT_INSPECT_OUTPUT_DIR=neffs on TorchNeuron"):
        profile_neff(tmp_path / "absent.neff", tmp_path, which=lambda name: "/x")
