"""The gated-MLP benchmark on the CPU compiler path, and the NKI path's preconditions."""
from __future__ import annotations

import json

import numpy as np
import pytest

from siglip_serve.kernels import references
from siglip_serve.kernels.device import resolve_device
from siglip_serve.kernels.hardware import TileSizeError
from siglip_serve.kernels.mlp import SEED_CONFIGS, MLPConfig, benchmark_mlp, format_mlp_table, make_inputs, skip_reason


def test_config_parse_label_and_flops():
    cfg = MLPConfig.parse("1x128x1024x512")
    assert cfg == SEED_CONFIGS[0]
    assert cfg.label == "b=1, s=128, h=1024, i=512"
    assert cfg.tokens == 128 and cfg.flops == 6 * 128 * 1024 * 512
    for bad in ("1x2x3", "ax1x1x1"):
        with pytest.raises(ValueError):
            MLPConfig.parse(bad)
    with pytest.raises(ValueError):
        MLPConfig(0, 1, 1, 1)


def test_cpu_compiler_path_measures_compile_apart_and_matches_reference():
    cfg = MLPConfig(2, 16, 64, 96)
    result = benchmark_mlp(cfg, resolve_device("cpu"), "compiler", "float32", warmup=1, iterations=4)
    assert result.kernel == "torch-cpu" and result.config == cfg.label
    assert result.compile_ms > 0 and result.compilations == 1
    assert 0 < result.latency_p50_ms <= result.latency_p99_ms and result.iterations == 4
    inputs = make_inputs(cfg)
    scale = np.abs(references.gated_mlp(**inputs)).max()
    assert result.max_abs_err <= 1e-5 * max(1.0, scale)
    table = format_mlp_table([result], [("nki", cfg.label, "needs a NeuronCore")])
    assert "torch-cpu" in table and "skipped: needs a NeuronCore" in table
    json.dumps(result.__dict__)  # results serialise as plain numbers/strings


def test_nki_path_is_skipped_off_neuron_with_a_reason():
    device = resolve_device("cpu")
    assert "NeuronCore" in skip_reason("nki", device)
    assert skip_reason("compiler", device) is None
    with pytest.raises(RuntimeError, match="cannot run the nki path"):
        benchmark_mlp(MLPConfig(1, 4, 128, 128), device, "nki")
    with pytest.raises(ValueError):
        skip_reason("xla", device)


def test_nki_path_rejects_bad_shapes_before_compiling():
    with pytest.raises(ValueError, match="multiple of 128"):
        benchmark_mlp(MLPConfig(1, 4, 100, 128), resolve_device("cpu"), "nki")
    with pytest.raises(TileSizeError, match="SBUF"):
        benchmark_mlp(MLPConfig(1, 4, 8192, 8192), resolve_device("cpu"), "nki", dtype="float32")
