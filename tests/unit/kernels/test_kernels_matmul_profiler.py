"""Matmul profiler: shape suites, CPU end to end, CSV/JSON schema, plot, recompile detection."""
from __future__ import annotations

import csv
import json
import logging

import pytest

from siglip_serve.kernels import matmul_profiler as mp
from siglip_serve.kernels.device import CPU_FALLBACK_WARNING, Device, RecompileError, resolve_device
from siglip_serve.kernels.tiling import MatmulConfig

SMALL = [mp.Shape(MatmulConfig(1, 64, 32), "tiny"), mp.Shape(MatmulConfig(129, 130, 513), "ragged")]


@pytest.fixture(scope="module")
def cpu_results():
    device = resolve_device("cpu")
    return device, mp.profile_all(SMALL, device, dtype="float32", warmup=1, iterations=3)


def test_cpu_fallback_warns(caplog):
    with caplog.at_level(logging.WARNING):
        device = resolve_device("cpu")
    assert device.kind == "cpu" and not device.is_npu
    assert CPU_FALLBACK_WARNING in caplog.text


def test_cpu_end_to_end_results(cpu_results):
    _, results = cpu_results
    for shape, r in zip(SMALL, results, strict=True):
        cfg = shape.config
        assert (r.M, r.K, r.N) == (cfg.M, cfg.K, cfg.N)
        assert (r.num_tiles_M, r.num_tiles_K, r.num_tiles_N, r.total_tiles) == (
            cfg.num_tiles_M, cfg.num_tiles_K, cfg.num_tiles_N, cfg.total_tiles)
        assert r.device == "cpu" and r.dtype == "float32" and r.iterations == 3
        assert 0 < r.latency_p50_ms <= r.latency_p99_ms
        assert r.tflops_at_p50 == pytest.approx(cfg.flops / (r.latency_p50_ms / 1e3) / 1e12)
        assert r.pct_trn2_roofline_at_p50 == pytest.approx(100 * r.trn2_roofline_ms / r.latency_p50_ms)


def test_csv_schema(cpu_results, tmp_path):
    _, results = cpu_results
    path = mp.write_csv(results, tmp_path / "out" / "matmul.csv")
    with path.open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames[: len(mp.SEED_COLUMNS)]) == (
            "M", "K", "N", "latency_ms", "num_tiles_M", "num_tiles_K", "num_tiles_N", "total_tiles")
        for column in ("device", "dtype", "latency_p50_ms", "latency_p99_ms", "tflops_at_p50",
                       "pct_trn2_roofline_at_p50"):
            assert column in reader.fieldnames
        rows = list(reader)
    assert len(rows) == len(results)
    for row, r in zip(rows, results, strict=True):
        assert int(row["total_tiles"]) == r.total_tiles
        assert float(row["latency_p99_ms"]) == pytest.approx(r.latency_p99_ms)
        assert row["device"] == "cpu"


def test_json_results_are_numbers(cpu_results, tmp_path):
    device, results = cpu_results
    doc = json.loads(mp.write_json(results, tmp_path / "m.json", device, "custom").read_text())
    assert doc["npu_numbers"] is False and doc["device"] == "cpu"
    for row in doc["results"]:
        for key in ("latency_ms", "latency_p50_ms", "latency_p99_ms", "tflops_at_p50", "total_tiles"):
            assert isinstance(row[key], (int, float))


def test_table_and_plot(cpu_results, tmp_path):
    from siglip_serve.kernels.plotting import plot_matmul

    _, results = cpu_results
    table = mp.format_table(results, "title")
    assert table.splitlines()[0] == "title" and "ragged" in table and "2/2/2" in table
    png = plot_matmul(results, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        plot_matmul([], tmp_path / "empty.png")


def test_shape_suites_cover_the_seed_modes():
    tiling = {(s.config.M, s.config.K, s.config.N) for s in mp.shapes_for_mode("tiling")}
    for m in (127, 128, 129):
        assert (m, 512, 512) in tiling
    for n in (511, 512, 513):
        assert (128, 128, n) in tiling
    scenarios = " ".join(s.scenario for s in mp.shapes_for_mode("llm"))
    assert "prefill" in scenarios and "decode" in scenarios and "ffn" in scenarios
    assert len(mp.shapes_for_mode("sweep")) == 45
    with pytest.raises(ValueError):
        mp.shapes_for_mode("nope")


def test_parse_shapes():
    shapes = mp.parse_shapes("128x256x512, 1x2x3")
    assert [s.config for s in shapes] == [MatmulConfig(128, 256, 512), MatmulConfig(1, 2, 3)]
    for bad in ("", "12x3", "axbxc"):
        with pytest.raises(ValueError):
            mp.parse_shapes(bad)


def test_recompile_during_timed_loop_is_an_error():
    import torch

    counter = {"n": 0}

    def compile_count():
        return counter["n"]

    def sync():
        counter["n"] += 1  # every synchronisation "compiles": the pitfall we must catch

    device = Device("neuron", torch.device("cpu"), "fake recompiling device", sync, compile_count)
    with pytest.raises(RecompileError, match="timed loop"):
        mp.profile_matmul(SMALL[0], device, dtype="float32", warmup=1, iterations=2)


def test_warmup_must_absorb_the_compile():
    with pytest.raises(ValueError, match="warmup"):
        mp.profile_matmul(SMALL[0], resolve_device("cpu"), dtype="float32", warmup=0, iterations=1)
