"""One LNC for every kernel command (read through siglip_serve.models.neuron.sdk), and timing labels."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from siglip_serve.kernels.cli import main
from siglip_serve.kernels.device_timing import DeviceTimingUnavailable, format_device_times, profile_neff
from siglip_serve.kernels.lnc import KernelLncError, require_kernel_lnc, resolve_lnc
from siglip_serve.kernels.tiling import MatmulConfig, roofline


@pytest.mark.parametrize("env, lnc", [(None, 2), ("1", 1), ("2", 2)])
def test_matmul_and_mlp_default_to_the_runtime_lnc(tmp_path, monkeypatch, env, lnc):
    if env is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", env)
    mm, mlp = tmp_path / "mm.json", tmp_path / "mlp.json"
    assert main(["matmul", "--shapes", "64x64x64", "--device", "cpu", "--warmup", "1", "--iterations", "1",
                 "--json", str(mm)]) == 0
    assert main(["mlp", "--device", "cpu", "--configs", "1x4x16x8", "--paths", "compiler", "--warmup", "1",
                 "--iterations", "1", "--json", str(mlp)]) == 0
    mm_doc, mlp_doc = json.loads(mm.read_text()), json.loads(mlp.read_text())
    expected_ms = roofline(MatmulConfig(64, 64, 64), "float32", lnc).time_s * 1e3
    assert mm_doc["results"][0]["trn2_roofline_ms"] == pytest.approx(expected_ms)
    assert mlp_doc["lnc"] == lnc and mlp_doc["results"][0]["lnc"] == lnc and mm_doc["lnc"] == lnc


def test_timing_is_labelled_wall_clock_in_table_and_json(tmp_path, capsys):
    mm, mlp = tmp_path / "mm.json", tmp_path / "mlp.json"
    main(["matmul", "--shapes", "64x64x64", "--device", "cpu", "--warmup", "1", "--iterations", "1",
          "--json", str(mm)])
    main(["mlp", "--device", "cpu", "--configs", "1x4x16x8", "--paths", "compiler", "--warmup", "1",
          "--iterations", "1", "--json", str(mlp)])
    printed = capsys.readouterr().out
    assert "timing: wall_clock_including_dispatch" in printed  # matmul table
    assert printed.count("wall_clock_including_dispatch") >= 2  # and the MLP table's timing column
    for doc in (json.loads(mm.read_text()), json.loads(mlp.read_text())):
        assert doc["timing"] == "wall_clock_including_dispatch"
        assert all(r["timing"] == "wall_clock_including_dispatch" for r in doc["results"])


def test_invalid_runtime_lnc_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    assert main(["matmul", "--shapes", "8x8x8", "--device", "cpu", "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: NEURON_LOGICAL_NC_CONFIG='3' is not a valid LNC") and err.count("\n") == 1


def test_lnc_flag_must_match_the_runtime_on_a_neuroncore():
    env = {"NEURON_LOGICAL_NC_CONFIG": "2"}
    assert resolve_lnc(None, on_neuron=True, env=env) == 2
    assert resolve_lnc(2, on_neuron=True, env=env) == 2
    assert resolve_lnc(1, on_neuron=False, env=env) == 1  # cpu/cuda: only picks the roofline
    with pytest.raises(KernelLncError, match="--lnc 1 differs from the Neuron runtime's LNC=2 "
                                             r"\(NEURON_LOGICAL_NC_CONFIG=2\).*export NEURON_LOGICAL_NC_CONFIG=1"):
        resolve_lnc(1, on_neuron=True, env=env)
    with pytest.raises(ValueError, match="--lnc must be one of"):
        resolve_lnc(4, on_neuron=False, env=env)


def test_kernel_lnc_error_names_the_default_when_the_variable_is_unset():
    require_kernel_lnc("k", (1, 2), 2, env={})
    with pytest.raises(KernelLncError, match=r"LNC=2 \(NEURON_LOGICAL_NC_CONFIG unset, so the trn2 default LNC=2\)"):
        require_kernel_lnc("k", (1,), 2, env={})


class _FakeExplorer:
    """Stands in for the neuron-explorer CLI: records commands and writes what the real one would."""

    def __init__(self, summary_json: str, nth: int = 2, fail: str | None = None):
        self.commands, self.summary_json, self.nth, self.fail = [], summary_json, nth, fail

    def __call__(self, cmd, capture_output, text):
        self.commands.append(cmd)
        if self.fail and cmd[1] == self.fail:
            return SimpleNamespace(returncode=1, stdout="", stderr="boom\nERROR: device busy")
        if cmd[1] == "capture":
            session = cmd[cmd.index("-s") + 1]
            with open(session.replace(".ntff", f"_exec_{self.nth}.ntff"), "w") as fh:
                fh.write("trace")
        elif cmd[1] == "view":  # the summary formats print to stdout
            return SimpleNamespace(returncode=0, stdout=self.summary_json, stderr="")
        return SimpleNamespace(returncode=0, stdout="", stderr="")


def test_profile_neff_runs_explorer_capture_then_view_and_reads_device_time(tmp_path, data_dir):
    neff = tmp_path / "graph.neff"
    neff.write_bytes(b"neff")
    summary = (data_dir / "profile_explorer_summary.json").read_text()
    explorer = _FakeExplorer(summary)
    result = profile_neff(neff, tmp_path / "prof", run=explorer, which=lambda name: "/usr/bin/" + name)
    capture, view = explorer.commands
    assert capture[:2] == ["neuron-explorer", "capture"] and "--profile-nth-exec=2" in capture
    assert view[:2] == ["neuron-explorer", "view"] and view[view.index("-s") + 1].endswith("graph_exec_2.ntff")
    assert view[view.index("--output-format") + 1] == "summary-json"
    expected_us = json.loads(summary)["0"]["total_time"] * 1e6
    assert (tmp_path / "prof" / "graph.json").read_text() == summary  # kept to send back
    assert result.timing == "device" and result.total_us == pytest.approx(expected_us)
    assert result.as_dict()["timing"] == "device"
    assert "device" in format_device_times([result])


def test_profile_neff_errors_are_clear(tmp_path, data_dir):
    neff = tmp_path / "graph.neff"
    with pytest.raises(DeviceTimingUnavailable,
                       match="neuron-explorer is not on PATH; it ships with aws-neuronx-tools"):
        profile_neff(neff, tmp_path, which=lambda name: None)
    with pytest.raises(DeviceTimingUnavailable, match="no such NEFF; run the benchmark with NEURON_FRAMEWORK_DEBUG=1"):
        profile_neff(neff, tmp_path, which=lambda name: "/x")
    neff.write_bytes(b"neff")
    explorer = _FakeExplorer("{}", fail="capture")
    with pytest.raises(DeviceTimingUnavailable,
                       match="neuron-explorer capture failed \\(exit 1\\): ERROR: device busy"):
        profile_neff(neff, tmp_path, run=explorer, which=lambda name: "/x")


@pytest.mark.skipif(shutil.which("neuron-explorer") is not None, reason="a real neuron-explorer is installed")
def test_profile_neff_command_without_explorer_is_one_line(tmp_path, capsys):
    neff = tmp_path / "graph.neff"
    neff.write_bytes(b"neff")
    assert main(["profile-neff", str(neff), "--workdir", str(tmp_path / "p")]) == 2
    assert "error: neuron-explorer is not on PATH" in capsys.readouterr().err
