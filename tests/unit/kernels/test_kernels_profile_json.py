"""The neuron-profile JSON parser, on fixtures built from the fields seed 002 documents."""
from __future__ import annotations

import json

import numpy as np
import pytest

from siglip_serve.kernels.profile_json import (
    ENGINES,
    FRAMEWORK_DEBUG_ENV,
    ProfileJSONError,
    capture_command,
    comparison_rows,
    explorer_capture_command,
    format_comparison,
    load_summary,
    parse_summary,
    save_input_bins,
    view_json_command,
)

NKILIB = "profile_nkilib_b1_s128_h1024_i512.json"
NEURONXCC = "profile_neuronxcc_b1_s128_h1024_i512.json"
CONFIG = "b=1, s=128, h=1024, i=512"


def _raw(data_dir, name):
    return json.loads((data_dir / name).read_text())["summary"][0]


def test_every_documented_field_is_read(data_dir):
    raw = _raw(data_dir, NKILIB)
    s = load_summary(data_dir / NKILIB, "nkilib", CONFIG)
    assert s.total_time_s == raw["total_time"]
    assert s.total_us == pytest.approx(raw["total_time"] * 1e6)
    for engine in ENGINES:
        key = "dma_active_time" if engine == "dma" else f"{engine}_engine_active_time"
        assert s.engine_active_s(engine) == raw[key]
        assert s.engine_active_percent(engine) == pytest.approx(100 * raw[key] / raw["total_time"])
    for key in ("neuroncore_cycle_count", "hardware_flops", "matmul_instruction_count", "event_count",
                "trace_count", "hbm_read_bytes", "hbm_write_bytes", "inputs_outputs_weights_size_bytes",
                "sbuf_read_bytes", "sbuf_write_bytes"):
        assert getattr(s, key) == raw[key] and isinstance(getattr(s, key), int)
    for key in ("mfu_estimated_percent", "mfu_max_achievable_estimated_percent", "mm_arithmetic_intensity"):
        assert getattr(s, key) == raw[key]


def test_missing_optional_fields_and_numeric_strings(data_dir):
    raw = _raw(data_dir, NEURONXCC)
    s = load_summary(data_dir / NEURONXCC)
    assert s.kernel == "profile_neuronxcc_b1_s128_h1024_i512"  # defaults to the file stem
    assert s.total_time_s == float(raw["total_time"])
    assert s.engine_active_s("dma") == float(raw["dma_active_time"])
    assert s.hardware_flops is None and s.engine_active_us("vector") is None
    assert s.as_dict()["vector_active_percent"] is None


def test_comparison_table_and_speed_ratio(data_dir):
    slow = load_summary(data_dir / NKILIB, "nkilib", CONFIG)
    fast = load_summary(data_dir / NEURONXCC, "neuronxcc", CONFIG)
    rows = comparison_rows([slow, fast])
    assert len(rows) == 1
    row = rows[0]
    assert (row["faster"], row["slower"]) == ("neuronxcc", "nkilib")
    assert row["speed_ratio"] == pytest.approx(slow.total_time_s / fast.total_time_s)
    table = format_comparison([slow, fast])
    for header in ("Kernel", "Config", "Total (μs)", "Tensor (μs)", "DMA (μs)"):
        assert header in table
    assert f"{slow.total_us:.2f}" in table and f"{fast.engine_active_us('dma'):.2f}" in table
    assert f"neuronxcc is {row['speed_ratio']:.2f}x faster than nkilib" in table


def test_no_comparison_across_different_configs(data_dir):
    a = load_summary(data_dir / NKILIB, "nkilib", "cfg A")
    b = load_summary(data_dir / NEURONXCC, "neuronxcc", "cfg B")
    assert comparison_rows([a, b]) == []
    assert "Comparison" not in format_comparison([a, b])


@pytest.mark.parametrize(
    "doc,message",
    [
        ({}, "summary"),
        ({"summary": []}, "summary"),
        ({"summary": [{"dma_active_time": 1e-6}]}, "total_time"),
        ({"summary": [{"total_time": 0}]}, "positive"),
        ({"summary": [{"total_time": "fast"}]}, "not a number"),
        ({"summary": [{"total_time": 1e-5, "hardware_flops": "NaN"}]}, "not finite"),
    ],
)
def test_bad_documents_raise_clear_errors(doc, message):
    with pytest.raises(ProfileJSONError, match=message):
        parse_summary(doc, "k")


def test_invalid_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ProfileJSONError, match="broken.json"):
        load_summary(path)


def test_command_lines_follow_seed_002(tmp_path):
    inputs = {"hidden_tensor": np.arange(6, dtype=np.float32).reshape(2, 3), "w": np.ones(4, dtype=np.float16)}
    bins = save_input_bins(inputs, tmp_path)
    assert bins["hidden_tensor"].name == "inp-hidden_tensor-000.bin"
    hidden = np.frombuffer(bins["hidden_tensor"].read_bytes(), np.float32)
    assert np.array_equal(hidden, inputs["hidden_tensor"].ravel())
    cmd = capture_command("file.neff", bins, num_exec=10)
    assert cmd[:3] == ["neuron-profile", "capture", "--save-output"]
    assert cmd[cmd.index("--neff") + 1] == "file.neff" and "--num-exec=10" in cmd
    assert cmd[-4:] == ["hidden_tensor", str(bins["hidden_tensor"]), "w", str(bins["w"])]
    assert view_json_command("file.neff", "profile.ntff", "profile.json") == [
        "neuron-profile", "view", "-n", "file.neff", "-s", "profile.ntff",
        "--output-format=json", "--output-file=profile.json"]
    assert explorer_capture_command("x.neff")[-1] == "--profile-nth-exec=2"
    assert FRAMEWORK_DEBUG_ENV["NEURON_FRAMEWORK_DEBUG"] == "1"
    with pytest.raises(ValueError):
        capture_command("file.neff", {}, num_exec=0)
