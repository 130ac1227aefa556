"""The profile summary parser: Neuron Explorer's summary-json (a fixture on the published schema) and the
legacy json layout (fixtures from the fields seed 002 documents)."""
from __future__ import annotations

import json

import pytest

from siglip_serve.kernels.profile_json import (
    ENGINES,
    FRAMEWORK_DEBUG_ENV,
    ProfileJSONError,
    comparison_rows,
    explorer_capture_command,
    format_comparison,
    load_summary,
    parse_summary,
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
        ({}, "neither a summary-json"),
        ({"x": 1}, "neither a summary-json"),
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


def test_the_explorer_capture_command_and_debug_environment():
    assert explorer_capture_command("x.neff")[:2] == ["neuron-explorer", "capture"]
    assert explorer_capture_command("x.neff")[-1] == "--profile-nth-exec=2"
    assert FRAMEWORK_DEBUG_ENV["NEURON_FRAMEWORK_DEBUG"] == "1"


def test_summary_json_is_read_with_the_hardware_counted_utilisation(data_dir):
    raw = json.loads((data_dir / "profile_explorer_summary.json").read_text())["0"]
    s = load_summary(data_dir / "profile_explorer_summary.json", "nki_mlp", CONFIG)
    assert s.total_time_s == raw["total_time"] and s.mfu_estimated_percent == 0.0  # MFU: HLO matmuls only
    assert (s.hfu_estimated_percent, s.mfu_inst_estimated_percent, s.mbu_estimated_percent) == (22.1, 20.4, 30.3)
    legacy = load_summary(data_dir / NKILIB, "nkilib", CONFIG)
    table = format_comparison([s, legacy])
    assert "HFU %" in table and "MBU %" in table and "MFU" not in table
    assert "22.10" in table and "30.30" in table and "n/a" in table  # the legacy file has neither
    assert "note:" not in table  # a utilisation above 1 reads as percent


def test_a_summary_json_of_two_profiles_and_fractions_are_called_out():
    two = {"a": {"total_time": 1e-5}, "b": {"total_time": 2e-5}}
    with pytest.raises(ProfileJSONError, match="2 profiles in one summary-json"):
        parse_summary(two, "k")
    tiny = parse_summary({"0": {"total_time": 1e-5, "hfu_estimated_percent": 0.4}}, "k")
    assert "fractions" in format_comparison([tiny])
