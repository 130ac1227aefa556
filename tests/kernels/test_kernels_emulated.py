"""Runs the NKI kernels' Python bodies on a NumPy model of the ISA (see kernels_fake_nki).

This checks their tiling and indexing logic against the golden references on any
machine. It does not replace the NKI simulator or hardware (the neuron-marked tests).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import kernels
from kernels import nki_launch
from kernels.tiling import MatmulConfig


def _load_fake():
    # Loaded by path so the test works under any pytest --import-mode.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("kernels_fake_nki", Path(__file__).with_name("kernels_fake_nki.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels_fake_nki = _load_fake()


@pytest.fixture
def fake_nki(monkeypatch):
    state = kernels_fake_nki.FakeNkiState()
    for name, module in kernels_fake_nki.build(state).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "kernels.nki_kernels", raising=False)
    monkeypatch.delattr(kernels, "nki_kernels", raising=False)
    monkeypatch.setattr(nki_launch, "_JITTED", {})
    yield state
    # Never leave the fake-bound module behind for later tests.
    sys.modules.pop("kernels.nki_kernels", None)
    if hasattr(kernels, "nki_kernels"):
        delattr(kernels, "nki_kernels")


def test_every_kernel_matches_its_reference(fake_nki):
    assert nki_launch.nki_status()[0]
    results = [nki_launch.check_kernel(run) for run in nki_launch.default_runs(seed=5)]
    failed = [(r.name, r.max_abs_err, r.detail) for r in results if not r.passed]
    assert not failed


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_transpose_and_conv(fake_nki, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((257, 130)).astype(np.float32)
    np.testing.assert_array_equal(nki_launch.simulate(nki_launch.prepare_transpose2d(x)), x.T)
    conv = nki_launch.prepare_conv2d(rng.standard_normal((2, 5, 9, 11)).astype(np.float32),
                                     rng.standard_normal((3, 5, 3, 2)).astype(np.float32),
                                     rng.standard_normal(3).astype(np.float32), pool=3)
    np.testing.assert_allclose(nki_launch.simulate(conv), conv.expected, rtol=1e-4, atol=1e-4)


def test_mlp_kernel_issues_the_tile_count_the_tiling_math_predicts(fake_nki):
    tokens, hidden, inter = 600, 256, 384  # 600 tokens = two moving tiles (512 + 88)
    rng = np.random.default_rng(2)
    run = nki_launch.prepare_gated_mlp(rng.standard_normal((tokens, hidden)).astype(np.float32) * 0.5,
                                       *(rng.standard_normal(s).astype(np.float32) * 0.06
                                         for s in ((hidden, inter), (hidden, inter), (inter, hidden))))
    np.testing.assert_allclose(nki_launch.simulate(run), run.expected, rtol=1e-4, atol=1e-4)
    # Weights are the stationary operand (M = output features), tokens stream as N.
    expected = 2 * MatmulConfig(inter, hidden, tokens).total_tiles + MatmulConfig(hidden, inter, tokens).total_tiles
    assert fake_nki.instructions["nc_matmul"] == expected


def test_spmd_kernel_splits_rows_between_two_programs(fake_nki):
    a = np.arange(512 * 600, dtype=np.float32).reshape(512, 600)
    run = nki_launch.prepare_tensor_add_spmd(a, a)
    np.testing.assert_array_equal(nki_launch.simulate(run), 2 * a)
    # Two programs x (256 rows / 128) row tiles x 2 column tiles x (2 loads + 1 store).
    assert fake_nki.instructions["dma_copy"] == 2 * 2 * 2 * 3


def test_model_enforces_the_partition_limit_the_launcher_checks_first(fake_nki):
    a = np.zeros((512, 1), np.float32)
    kernel = nki_launch.jitted_kernel("vector_add_tiled")
    with pytest.raises(ValueError, match="number of partitions 256 exceed architecture limitation of 128"):
        kernel(a, a, 256)


def test_check_command_runs_kernels_when_nki_is_present(fake_nki):
    from kernels.check import run_checks

    report = run_checks(seed=4)
    assert report.kernels and not report.kernels_skipped_reason
    assert report.passed
