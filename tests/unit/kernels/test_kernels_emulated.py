"""Runs the NKI kernels' Python bodies on the NumPy model of the ISA (see kernels_fake_nki).

This checks their tiling, indexing, LNC sharding, buffer use and dtypes against the golden
references on any machine. It does not replace the NKI simulator or hardware (the
neuron-marked tests).
"""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import nki_launch, references
from siglip_serve.kernels.lnc import KernelLncError
from siglip_serve.kernels.tiling import MatmulConfig


@pytest.mark.parametrize("lnc", ["1", "2"])
def test_every_kernel_matches_its_reference_at_the_runtime_lnc(fake_nki, monkeypatch, lnc):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    assert nki_launch.nki_status()[0]
    runs = nki_launch.default_runs(seed=5)
    results = [nki_launch.check_kernel(run) for run in runs]
    failed = [(r.name, r.max_abs_err, r.detail) for r in results if not r.passed]
    assert not failed
    # Every launch used the runtime's LNC as its grid, the SPMD kernel included.
    assert fake_nki.state.grids == [int(lnc)] * len(runs)


def test_default_lnc_is_the_trn2_default_when_the_variable_is_unset(fake_nki, monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    run = nki_launch.default_runs(seed=1)[0]
    assert run.lnc == 2
    nki_launch.simulate(run)
    assert fake_nki.state.grids == [2]


def test_a_kernel_written_for_another_lnc_is_refused_with_the_fix(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    run = nki_launch.default_runs(seed=1)[0]
    single_core = nki_launch.dataclasses.replace(run, supported_lnc=(1,))
    with pytest.raises(KernelLncError, match=r"runs only at LNC=1.*LNC=2 \(NEURON_LOGICAL_NC_CONFIG=2\).*"
                                             r"export NEURON_LOGICAL_NC_CONFIG=1"):
        nki_launch.simulate(single_core)
    assert fake_nki.state.grids == []  # refused before launching


def test_each_program_does_its_share_of_the_work(fake_nki):
    a = np.arange(25600, dtype=np.float32)
    one = nki_launch.at_lnc(nki_launch.prepare_vector_add_tiled(a, a, 128), 1)
    two = nki_launch.at_lnc(one, 2)
    np.testing.assert_array_equal(nki_launch.simulate(one), 2 * a)
    loads_one = fake_nki.state.instructions["dma_copy"]
    np.testing.assert_array_equal(nki_launch.simulate(two), 2 * a)
    # Two programs split the 200 chunks: the same DMA count in total, not twice as many.
    assert fake_nki.state.instructions["dma_copy"] == 2 * loads_one


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_transpose_and_conv(fake_nki, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((257, 130)).astype(np.float32)
    np.testing.assert_array_equal(nki_launch.simulate(nki_launch.at_lnc(nki_launch.prepare_transpose2d(x), 2)), x.T)
    conv = nki_launch.prepare_conv2d(rng.standard_normal((2, 5, 9, 11)).astype(np.float32),
                                     rng.standard_normal((3, 5, 3, 2)).astype(np.float32),
                                     rng.standard_normal(3).astype(np.float32), pool=3)
    np.testing.assert_allclose(nki_launch.simulate(nki_launch.at_lnc(conv, 2)), conv.expected, rtol=1e-4, atol=1e-4)


def test_conv_with_bf16_inputs_keeps_its_bias_tile_float32(fake_nki):
    """The bias tile used to take the input dtype; tensor_scalar's tile operand must be float32."""
    lib = fake_nki.lib
    rng = np.random.default_rng(3)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 7, 8), (3, 4, 2, 2), (3,)))
    x16, w16, b16 = (lib.round_to_bf16(v) for v in (x, nki_launch.conv_weights_stationary(w), bias))
    kernel = nki_launch.jitted_kernel("conv2d_bias_maxpool")
    out = kernel(lib.hbm_input(x16, "bfloat16"), lib.hbm_input(w16, "bfloat16"),
                 lib.hbm_input(b16.reshape(-1, 1), "bfloat16"), 2, 2, 2)
    w16_back = w16.reshape(4, 2, 2, 3).transpose(3, 0, 1, 2)
    expected = lib.round_to_bf16(references.conv2d_bias_maxpool(x16, w16_back, b16, 2))
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, expected, rtol=1e-2, atol=1e-2)


def test_bf16_vector_add_rounds_like_bf16(fake_nki):
    lib = fake_nki.lib
    rng = np.random.default_rng(4)
    a, b = (lib.round_to_bf16(rng.standard_normal((128, 64)).astype(np.float32)) for _ in range(2))
    out = nki_launch.jitted_kernel("vector_add_stream")(lib.hbm_input(a, "bfloat16"), lib.hbm_input(b, "bfloat16"), 32)
    np.testing.assert_array_equal(out, lib.round_to_bf16(a + b))
    assert not np.array_equal(out, a + b)  # the fp32 sum is not representable in bf16 everywhere


def test_mlp_kernel_issues_the_tile_count_the_tiling_math_predicts(fake_nki):
    tokens, hidden, inter = 600, 256, 384  # 600 tokens = two moving tiles (512 + 88)
    rng = np.random.default_rng(2)
    run = nki_launch.prepare_gated_mlp(rng.standard_normal((tokens, hidden)).astype(np.float32) * 0.5,
                                       *(rng.standard_normal(s).astype(np.float32) * 0.06
                                         for s in ((hidden, inter), (hidden, inter), (inter, hidden))))
    np.testing.assert_allclose(nki_launch.simulate(nki_launch.at_lnc(run, 2)), run.expected, rtol=1e-4, atol=1e-4)
    # Weights are the stationary operand (M = output features), tokens stream as N; the two
    # programs take one token tile each, so the total is the single-core count.
    expected = 2 * MatmulConfig(inter, hidden, tokens).total_tiles + MatmulConfig(hidden, inter, tokens).total_tiles
    assert fake_nki.state.instructions["nc_matmul"] == expected


def test_spmd_kernel_splits_rows_between_two_programs(fake_nki):
    a = np.arange(512 * 600, dtype=np.float32).reshape(512, 600)
    run = nki_launch.prepare_tensor_add_spmd(a, a, lnc=2)
    np.testing.assert_array_equal(nki_launch.simulate(run), 2 * a)
    # Two programs x (256 rows / 128) row tiles x 2 column tiles x (2 loads + 1 store).
    assert fake_nki.state.instructions["dma_copy"] == 2 * 2 * 2 * 3
    with pytest.raises(ValueError, match=r"2 program\(s\) \(LNC=2\)"):
        nki_launch.prepare_tensor_add_spmd(a[:384], a[:384], lnc=2)
    nki_launch.prepare_tensor_add_spmd(a[:384], a[:384], lnc=1)  # fine on one core


def test_model_enforces_the_partition_limit_the_launcher_checks_first(fake_nki):
    a = np.zeros((512, 1), np.float32)
    kernel = nki_launch.jitted_kernel("vector_add_tiled")
    with pytest.raises(ValueError, match="number of partitions 256 exceed architecture limitation of 128"):
        kernel(a, a, 256)


def test_check_command_runs_kernels_when_nki_is_present(fake_nki):
    from siglip_serve.kernels.check import run_checks

    report = run_checks(seed=4)
    assert report.kernels and not report.kernels_skipped_reason
    assert report.passed
