"""Tile-size violations are caught before any compile, with the compiler's wording."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from siglip_serve.kernels import nki_launch as nl_
from siglip_serve.kernels.hardware import PMAX, TileSizeError, check_partitions


def test_seed_row_chunk_256_error_message():
    a = np.zeros(25600, np.float32)
    with pytest.raises(TileSizeError, match="number of partitions 256 exceed architecture limitation of 128"):
        nl_.prepare_vector_add_tiled(a, a, row_chunk=256)
    run = nl_.prepare_vector_add_tiled(a, a, row_chunk=128)
    assert run.args[0].shape == (25600, 1) and run.args[2] == 128


@pytest.mark.parametrize("n", [0, -1])
def test_nonpositive_partitions(n):
    with pytest.raises(TileSizeError):
        check_partitions(n, "x")


def test_stream_shapes():
    a = np.zeros(25600, np.float32)
    assert nl_.prepare_vector_add_stream(a, a, free_dim=200).args[0].shape == (PMAX, 200)
    with pytest.raises(ValueError, match="multiple of 128"):
        nl_.prepare_vector_add_stream(np.zeros(100, np.float32), np.zeros(100, np.float32), 1)
    with pytest.raises(ValueError, match="not a multiple of FREE_DIM"):
        nl_.prepare_vector_add_stream(a, a, free_dim=30)
    big = np.zeros(PMAX * 40000, np.float32)
    with pytest.raises(TileSizeError, match="SBUF"):
        nl_.prepare_vector_add_stream(big, big, free_dim=40000)


def test_conv_moving_operand_limit_and_layout():
    rng = np.random.default_rng(0)
    with pytest.raises(TileSizeError, match="exceeds architecture limitation of 512"):
        nl_.validate_conv2d((1, 3, 4, 600), (4, 3, 1, 1), pool=1, itemsize=4)
    x, w, bias = rng.standard_normal((1, 3, 6, 6)), rng.standard_normal((4, 3, 2, 3)), rng.standard_normal(4)
    run = nl_.prepare_conv2d(x, w, bias, pool=2)
    w_t = run.args[1]
    assert w_t.shape == (3, 2 * 3 * 4)
    # w_t[ci, (i*fw + j)*c_out + co] == w[co, ci, i, j]
    assert w_t[1, (1 * 3 + 2) * 4 + 3] == w[3, 1, 1, 2]
    with pytest.raises(ValueError, match="smaller than pool"):
        nl_.validate_conv2d((1, 1, 3, 3), (1, 1, 3, 3), pool=2, itemsize=4)


def test_spmd_and_mlp_validation():
    nl_.validate_tensor_add_spmd((512, 700), 2)
    with pytest.raises(ValueError, match=r"2 program\(s\) \(LNC=2\)"):
        nl_.validate_tensor_add_spmd((384, 512), 2)
    nl_.validate_tensor_add_spmd((384, 512), 1)
    nl_.validate_gated_mlp(256, 2048, 1024, 2)  # seed 002's larger config fits SBUF
    with pytest.raises(TileSizeError, match="SBUF"):
        nl_.validate_gated_mlp(128, 8192, 8192, 4)


def test_default_runs_validate_and_carry_references():
    runs = nl_.default_runs(seed=1, lnc=2)
    assert {r.name for r in runs} == {"vector_add_tiled", "vector_add_stream", "transpose2d",
                                      "conv2d_bias_maxpool", "tensor_add_spmd", "gated_mlp"}
    spmd = next(r for r in runs if r.name == "tensor_add_spmd")
    assert {r.lnc for r in runs} == {2}  # every kernel launches at the LNC asked for
    np.testing.assert_array_equal(spmd.expected, spmd.args[0] + spmd.args[1])


def test_nki_status_is_false_for_missing_or_placeholder_package():
    usable, reason = nl_.nki_status()
    try:
        importlib.import_module("nki.language")
        real = True
    except ImportError:
        real = False
    assert usable == real
    if not usable:
        assert reason and "nki" in reason
        with pytest.raises(RuntimeError, match="real NKI package"):
            nl_.simulate(nl_.default_runs()[0])


def test_compare_flags_mismatch_and_shape():
    ok = nl_.compare("x", "ref", np.ones(3), np.ones(3))
    assert ok.passed and ok.max_abs_err == 0
    bad = nl_.compare("x", "ref", np.ones(3), np.zeros(3))
    assert not bad.passed and bad.max_abs_err == 1
    assert not nl_.compare("x", "ref", np.ones(3), np.ones(4)).passed
