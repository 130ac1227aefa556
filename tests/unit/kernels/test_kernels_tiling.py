"""Tiling math, FLOPs, bytes and the trn2 roofline."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siglip_serve.kernels.hardware import GEMM_MOVING_FMAX, PMAX, TRN2_CORE
from siglip_serve.kernels.tiling import (
    MatmulConfig,
    achieved_tflops,
    dtype_bytes,
    percent_of_roofline,
    roofline,
)

dims = st.integers(min_value=1, max_value=20_000)
dtypes = st.sampled_from(["float32", "bfloat16", "float16"])


@given(dims, dims, dims)
def test_tile_counts_cover_each_dim_with_no_spare_tile(m, k, n):
    cfg = MatmulConfig(m, k, n)
    axes = ((m, cfg.num_tiles_M, 128), (k, cfg.num_tiles_K, PMAX), (n, cfg.num_tiles_N, GEMM_MOVING_FMAX))
    for size, tiles, tile in axes:
        assert (tiles - 1) * tile < size <= tiles * tile
    assert cfg.total_tiles == cfg.num_tiles_M * cfg.num_tiles_K * cfg.num_tiles_N


@given(dims, dims, dims, st.sampled_from(["M", "K", "N"]))
def test_growing_a_dimension_never_reduces_tiles(m, k, n, which):
    cfg = MatmulConfig(m, k, n)
    bigger = MatmulConfig(**{**{"M": m, "K": k, "N": n}, which: {"M": m, "K": k, "N": n}[which] + 1})
    assert bigger.total_tiles >= cfg.total_tiles


@given(st.integers(min_value=1, max_value=64))
def test_one_past_a_boundary_costs_exactly_one_more_tile(t):
    assert MatmulConfig(128 * t + 1, 1, 1).num_tiles_M == MatmulConfig(128 * t, 1, 1).num_tiles_M + 1
    assert MatmulConfig(1, 128 * t + 1, 1).num_tiles_K == t + 1
    assert MatmulConfig(1, 1, 512 * t + 1).num_tiles_N == MatmulConfig(1, 1, 512 * t).num_tiles_N + 1


@given(dims, dims, dims)
def test_tile_utilization_is_one_only_on_exact_multiples(m, k, n):
    cfg = MatmulConfig(m, k, n)
    assert 0 < cfg.tile_utilization <= 1
    exact = m % 128 == 0 and k % 128 == 0 and n % 512 == 0
    assert (cfg.tile_utilization == 1) == exact


def test_seed_boundary_shapes():
    assert [MatmulConfig(x, 128, 512).num_tiles_M for x in (127, 128, 129)] == [1, 1, 2]
    assert [MatmulConfig(128, 128, x).num_tiles_N for x in (511, 512, 513)] == [1, 1, 2]


@given(dims, dims, dims, dtypes)
def test_flops_and_minimum_bytes(m, k, n, dtype):
    cfg = MatmulConfig(m, k, n)
    assert cfg.flops == 2 * m * k * n
    assert cfg.min_bytes(dtype) == (m * k + k * n + m * n) * dtype_bytes(dtype)
    assert cfg.arithmetic_intensity(dtype) == pytest.approx(cfg.flops / cfg.min_bytes(dtype))


@settings(max_examples=50)
@given(dims, dims, dims, dtypes, st.sampled_from([1, 2]))
def test_roofline_is_the_slower_bound_compute_scales_with_lnc_and_hbm_does_not(m, k, n, dtype, lnc):
    cfg = MatmulConfig(m, k, n)
    roof = roofline(cfg, dtype, lnc=lnc)
    assert roof.compute_s == pytest.approx(cfg.flops / (TRN2_CORE.tflops(dtype) * 1e12 * lnc))
    # One HBM stack's bandwidth at either LNC, as Neuron Explorer's MBU counts it.
    assert roof.memory_s == pytest.approx(cfg.min_bytes(dtype) / (TRN2_CORE.hbm_gbytes_per_s * 1e9))
    assert roof.time_s == max(roof.compute_s, roof.memory_s)
    doubled = roofline(cfg, dtype, lnc=2 * lnc)
    assert doubled.compute_s == pytest.approx(roof.compute_s / 2) and doubled.memory_s == roof.memory_s
    # Measuring exactly the roofline time is 100 %; twice as slow is 50 %.
    assert percent_of_roofline(cfg, dtype, roof.time_s, lnc) == pytest.approx(100.0)
    assert percent_of_roofline(cfg, dtype, 2 * roof.time_s, lnc) == pytest.approx(50.0)


def test_the_roofline_takes_the_higher_of_the_two_pages_figures_and_names_them():
    from siglip_serve.kernels.hardware import ARCH_GUIDE_CORE, ROOFLINE_SOURCE

    # Trainium2 page: 667 BF16 / 181 FP32 TFLOPS per chip of 8 cores; NKI arch guide: 79 / 20 per core.
    assert TRN2_CORE.tflops("bf16") == pytest.approx(83.375) and ARCH_GUIDE_CORE.tflops("bf16") == 79.0
    assert TRN2_CORE.tflops("fp32") == pytest.approx(22.625) and ARCH_GUIDE_CORE.tflops("fp32") == 20.0
    assert TRN2_CORE.hbm_gbytes_per_s == 725.0  # 2.9 TB/s over 4 HBM stacks
    assert "667" in ROOFLINE_SOURCE["tflops"] and "725" in ROOFLINE_SOURCE["hbm"]
    assert any("trainium2_arch" in page for page in ROOFLINE_SOURCE["pages"])


def test_decode_is_memory_bound_and_big_square_is_compute_bound():
    assert roofline(MatmulConfig(1, 4096, 4096), "bfloat16").bound == "memory"
    assert roofline(MatmulConfig(4096, 4096, 4096), "bfloat16").bound == "compute"


def test_fp32_peak_is_lower_than_bf16():
    cfg = MatmulConfig(4096, 4096, 4096)
    assert roofline(cfg, "float32").compute_s > roofline(cfg, "bfloat16").compute_s


def test_achieved_tflops():
    cfg = MatmulConfig(1024, 1024, 1024)
    assert achieved_tflops(cfg, 1e-3) == pytest.approx(2 * 1024**3 / 1e-3 / 1e12)
    with pytest.raises(ValueError):
        achieved_tflops(cfg, 0)


@pytest.mark.parametrize("bad", [(0, 1, 1), (1, -3, 1), (1, 1, 2.5), (True, 1, 1)])
def test_invalid_config_rejected(bad):
    with pytest.raises(ValueError):
        MatmulConfig(*bad)


def test_unknown_dtype_rejected():
    with pytest.raises(ValueError, match="unsupported dtype"):
        MatmulConfig(1, 1, 1).min_bytes("int4")
    with pytest.raises(ValueError):
        roofline(MatmulConfig(1, 1, 1), "bfloat16", lnc=0)
    assert math.isclose(TRN2_CORE.tflops("bf16"), TRN2_CORE.tflops("float16"))
