"""The CLI contract: subcommands, outputs, exit codes, and ``python -m siglip_serve.kernels``."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from siglip_serve.kernels.cli import main
from tests.helpers import REPO


def test_matmul_cpu_writes_csv_json_plot(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(["matmul", "--shapes", "64x64x64,129x128x513", "--device", "cpu", "--warmup", "1",
               "--iterations", "2", "--csv", str(out / "m.csv"), "--json", str(out / "m.json"),
               "--plot", str(out / "m.png")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "NOT NPU numbers" in printed and "float32" in printed  # cpu defaults to float32
    with (out / "m.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(int(r["M"]), int(r["total_tiles"])) for r in rows] == [(64, 1), (129, 4)]
    doc = json.loads((out / "m.json").read_text())
    assert doc["mode"] == "custom" and len(doc["results"]) == 2
    assert (out / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_mlp_cpu_json_lists_skipped_nki_path(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    rc = main(["mlp", "--device", "cpu", "--configs", "1x8x128x128", "--warmup", "1", "--iterations", "2",
               "--json", str(path)])
    assert rc == 0
    doc = json.loads(path.read_text())
    assert [r["kernel"] for r in doc["results"]] == ["torch-cpu"]
    assert doc["skipped"][0]["path"] == "nki" and "NeuronCore" in doc["skipped"][0]["reason"]
    assert "skipped" in capsys.readouterr().out


def test_profile_json_command(data_dir, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    files = [str(data_dir / "profile_nkilib_b1_s128_h1024_i512.json"),
             str(data_dir / "profile_neuronxcc_b1_s128_h1024_i512.json")]
    rc = main(["profile-json", *files, "--kernel", "nkilib", "--kernel", "neuronxcc",
               "--config", "b=1, s=128", "--config", "b=1, s=128", "--json", str(out)])
    assert rc == 0
    assert "neuronxcc is" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["comparisons"][0]["faster"] == "neuronxcc"
    assert isinstance(doc["summaries"][0]["total_us"], float)


def test_check_command_exit_codes(tmp_path, capsys):
    from siglip_serve.kernels.nki_launch import nki_status

    path = tmp_path / "check.json"
    rc = main(["check", "--json", str(path)])
    doc = json.loads(path.read_text())
    assert doc["references"] and all(r["passed"] for r in doc["references"])
    if not nki_status()[0]:
        # The kernels were asked for (default --kernels-on simulator) and skipped: not a pass.
        assert rc == 3 and doc["passed"] is False and doc["kernels_skipped_reason"]
        out = capsys.readouterr().out
        assert "NKI kernels SKIPPED" in out and "--kernels-on none" in out and "PASSED" not in out
    else:
        assert rc == 0 and doc["passed"] is True
    assert main(["check", "--kernels-on", "none"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASSED")


def test_check_command_exit_code_through_python_dash_m():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NEURON_LOGICAL_NC_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "siglip_serve.kernels", "check"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    from siglip_serve.kernels.nki_launch import nki_status

    assert proc.returncode == (0 if nki_status()[0] else 3), proc.stdout[-500:]


def test_check_command_fails_on_mismatch(monkeypatch):
    from siglip_serve.kernels import references

    monkeypatch.setattr(references, "vector_add", lambda a, b: a - b)
    assert main(["check"]) == 1


def test_errors_are_one_line_with_exit_code_2(capsys):
    assert main(["matmul", "--shapes", "12x3", "--device", "cpu"]) == 2
    assert "error: shape '12x3' is not MxKxN" in capsys.readouterr().err
    assert main(["profile-json", "/nonexistent/profile.json"]) == 2
    assert "/nonexistent/profile.json: cannot read" in capsys.readouterr().err


def test_python_dash_m_kernels_help():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "siglip_serve.kernels", "--help"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0
    for command in ("matmul", "mlp", "profile-json", "check"):
        assert command in proc.stdout


def test_help_names_neuron_explorer_and_both_ways_to_save_neffs_not_neuron_profile(capsys):
    """Issue 35, B9: neuron-profile left the SDK in 2.30; the help names what replaced it, on both Neuron lines."""
    from siglip_serve.kernels.cli import build_parser

    parser = build_parser()
    helps = [parser.format_help()]
    for command in ("profile-json", "profile-neff"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        helps.append(capsys.readouterr().out)
    assert not any("neuron-profile" in text for text in helps)
    assert "Neuron Explorer summaries" in helps[0] and "NEURON_RT_INSPECT_ENABLE=1" in " ".join(helps[2].split())
