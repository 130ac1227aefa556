"""Golden references against torch, and the check command's reference half."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from siglip_serve.kernels import references
from siglip_serve.kernels.check import run_checks


def _t(x):
    return torch.from_numpy(x).double()


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 2),
    c_in=st.integers(1, 6),
    c_out=st.integers(1, 6),
    fh=st.integers(1, 3),
    fw=st.integers(1, 3),
    extra_h=st.integers(0, 7),
    extra_w=st.integers(0, 7),
    pool=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_conv2d_bias_maxpool_matches_torch(batch, c_in, c_out, fh, fw, extra_h, extra_w, pool, seed):
    height, width = fh - 1 + pool + extra_h, fw - 1 + pool + extra_w
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, c_in, height, width)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in, fh, fw)).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32)
    expected = F.max_pool2d(F.conv2d(_t(x), _t(w), _t(bias)), pool).numpy()
    np.testing.assert_allclose(references.conv2d_bias_maxpool(x, w, bias, pool), expected, rtol=1e-4, atol=1e-4)


def test_bias_after_pool_equals_bias_before_pool():
    rng = np.random.default_rng(1)
    x, w, bias = rng.standard_normal((1, 2, 9, 9)), rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)
    before = references.maxpool2d(references.conv2d_valid(x, w) + bias[None, :, None, None], 2)
    np.testing.assert_allclose(references.conv2d_bias_maxpool(x, w, bias, 2), before, rtol=1e-12)


@pytest.mark.parametrize("tokens,hidden,inter", [(1, 8, 16), (37, 64, 96)])
def test_gated_mlp_matches_torch(tokens, hidden, inter):
    rng = np.random.default_rng(tokens)
    shapes = ((tokens, hidden), (hidden, inter), (hidden, inter), (inter, hidden))
    x, wg, wu, wd = (rng.standard_normal(s) for s in shapes)
    expected = (F.silu(_t(x) @ _t(wg)) * (_t(x) @ _t(wu))) @ _t(wd)
    np.testing.assert_allclose(references.gated_mlp(x, wg, wu, wd), expected.numpy(), rtol=1e-10)


@pytest.mark.parametrize("shape", [(1, 1), (129, 3), (200, 513)])
def test_transpose_and_adds_match_torch(shape):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    np.testing.assert_array_equal(references.transpose2d(a), _t(a).t().numpy())
    np.testing.assert_array_equal(references.vector_add(a, b), torch.add(_t(a), _t(b)).numpy())
    np.testing.assert_array_equal(references.tensor_add(a, b), torch.add(_t(a), _t(b)).numpy())


def test_reference_shape_errors():
    with pytest.raises(ValueError):
        references.vector_add(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        references.conv2d_valid(np.zeros((1, 2, 4, 4)), np.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError):
        references.conv2d_bias_maxpool(np.zeros((1, 1, 4, 4)), np.zeros((2, 1, 2, 2)), np.zeros(3), 1)
    with pytest.raises(ValueError):
        references.gated_mlp(np.zeros((2, 4)), np.zeros((4, 8)), np.zeros((4, 8)), np.zeros((4, 8)))


def test_check_command_references_pass_and_kernel_skip_is_explicit():
    report = run_checks(seed=3)
    assert report.references and all(r.passed for r in report.references)
    names = " ".join(r.name for r in report.references)
    for kernel in ("vector_add", "tensor_add", "transpose2d", "conv2d_bias_maxpool", "gated_mlp"):
        assert kernel in names
    from siglip_serve.kernels.nki_launch import nki_status

    if not nki_status()[0]:
        # Kernels were asked for (the default) and could not run: that is not a pass.
        assert report.kernels == []
        assert report.kernels_skipped_reason
        assert "NKI kernels SKIPPED" in report.format() and not report.passed
        assert not report.mismatches
    references_only = run_checks(seed=3, kernels_on="none")
    assert references_only.passed and not references_only.kernels_skipped_reason


def test_check_reports_a_broken_reference(monkeypatch):
    monkeypatch.setattr(references, "transpose2d", lambda x: np.ascontiguousarray(x))
    report = run_checks(seed=0)
    assert not report.passed
    assert any(not r.passed and r.name.startswith("transpose2d") for r in report.references)
