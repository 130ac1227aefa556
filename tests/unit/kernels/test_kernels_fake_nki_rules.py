"""Every rule kernels_fake_nki enforces, each shown by a small kernel that breaks it.

These pin the model itself: if a rule stopped being enforced, a kernel in kernels/ that
broke it would pass the emulated tests. What the model does not prove is in its docstring.
"""
from __future__ import annotations

import numpy as np
import pytest

A = np.arange(128 * 64, dtype=np.float32).reshape(128, 64) / 1000.0
W = np.eye(128, 32, dtype=np.float32)


def _run(fake, body, *args, grid=1):
    kernel = fake.nki.jit(body)
    return (kernel[grid] if grid > 1 else kernel)(*args)


def _load(fake, src, dtype="float32"):
    """src in SBUF as ``dtype``: a DMA in src's dtype, then an engine copy where the dtype changes."""
    nl, nisa = fake.nl, fake.nisa
    tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    if dtype == src.dtype:
        return tile
    converted = nl.ndarray(src.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=converted, src=tile)
    return converted


def _store(fake, tile):
    nl, nisa = fake.nl, fake.nisa
    out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def _matmul_body(fake, accumulate=None, times=1, stationary_from_hbm=False, dst_dtype="float32"):
    nl, nisa = fake.nl, fake.nisa

    def body(w, a):
        st = w if stationary_from_hbm else _load(fake, w)
        mv = _load(fake, a)
        acc = nl.ndarray((32, 64), dtype=dst_dtype, buffer=nl.psum)
        for _ in range(times):
            nisa.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=accumulate)
        res = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        return _store(fake, res)

    return body


def test_a_legal_matmul_runs(fake_nki):
    np.testing.assert_allclose(_run(fake_nki, _matmul_body(fake_nki), W, A), W.T @ A, rtol=1e-6)


def test_matmul_operand_read_from_hbm_is_refused(fake_nki):
    rule = "stationary is in hbm; nc_matmul reads stationary only from sbuf"
    with pytest.raises(fake_nki.lib.NkiRuleError, match=rule):
        _run(fake_nki, _matmul_body(fake_nki, stationary_from_hbm=True), W, A)


def test_matmul_into_a_bf16_psum_tile_is_refused(fake_nki):
    with pytest.raises(fake_nki.lib.NkiRuleError, match="dst must be a float32 PSUM tile"):
        _run(fake_nki, _matmul_body(fake_nki, dst_dtype="bfloat16"), W, A)


def test_matmul_result_into_sbuf_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(w, a):
        acc = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(dst=acc, stationary=_load(fake_nki, w), moving=_load(fake_nki, a))
        return _store(fake_nki, acc)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="nc_matmul writes dst only to psum"):
        _run(fake_nki, body, W, A)


def test_float32_operand_with_a_bf16_partner_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(w, a):
        acc = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=_load(fake_nki, w, "bfloat16"), moving=_load(fake_nki, a))
        return _store(fake_nki, acc)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="float32 operand needs a float32 partner"):
        _run(fake_nki, body, W, A)


@pytest.mark.parametrize("accumulate, expected_factor", [(None, 3), (False, 1)])
def test_accumulate_is_honoured(fake_nki, accumulate, expected_factor):
    # None: the first write overwrites, the next two add; False: every write overwrites.
    out = _run(fake_nki, _matmul_body(fake_nki, accumulate=accumulate, times=3), W, A)
    np.testing.assert_allclose(out, expected_factor * (W.T @ A), rtol=1e-6)


def test_accumulate_true_on_a_fresh_psum_tile_reads_uninitialised_memory(fake_nki):
    out = _run(fake_nki, _matmul_body(fake_nki, accumulate=True), W, A)
    assert np.isnan(out).all()


def test_uninitialised_memory_is_nan(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        t = _load(fake_nki, a)
        partly = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=partly[0:64, 0:64], src=t[0:64, 0:64])  # rows 64..127 never written
        return _store(fake_nki, partly)

    out = _run(fake_nki, body, A)
    np.testing.assert_array_equal(out[:64], A[:64])
    assert np.isnan(out[64:]).all()


def test_dma_from_psum_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=acc, src=_load(fake_nki, a))
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    rule = "src is in psum; dma_copy reads src only from hbm/shared_hbm/sbuf"
    with pytest.raises(fake_nki.lib.NkiRuleError, match=rule):
        _run(fake_nki, body, A)


def test_dma_into_psum_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=acc, src=a)
        return a

    with pytest.raises(fake_nki.lib.NkiRuleError, match="dst is in psum; dma_copy writes only to"):
        _run(fake_nki, body, A)


def test_two_psum_inputs_to_one_op_are_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        t = _load(fake_nki, a)
        p1 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        p2 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p1, src=t)
        nisa.tensor_copy(dst=p2, src=t)
        res = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=p1, data2=p2, op=nl.add)
        return _store(fake_nki, res)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="cannot both reside in PSUM"):
        _run(fake_nki, body, A)


def test_engine_op_on_hbm_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        res = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=a, data2=_load(fake_nki, a), op=nl.add)
        return _store(fake_nki, res)

    rule = "data1 is in hbm; tensor_tensor reads data1 only from sbuf/psum"
    with pytest.raises(fake_nki.lib.NkiRuleError, match=rule):
        _run(fake_nki, body, A)


def test_non_float32_tile_operand_of_tensor_scalar_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a, bias):
        res = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=res, data=_load(fake_nki, a), op0=nl.add, operand0=_load(fake_nki, bias, "bfloat16"))
        return _store(fake_nki, res)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="tile operand must be float32, got bfloat16"):
        _run(fake_nki, body, A, np.ones((128, 1), np.float32))


def test_kernel_output_must_be_in_hbm(fake_nki):
    with pytest.raises(fake_nki.lib.NkiRuleError, match="must be an HBM tensor"):
        _run(fake_nki, lambda a: _load(fake_nki, a), A)


def test_psum_bank_and_partition_limits(fake_nki):
    nl = fake_nki.nl
    with pytest.raises(fake_nki.lib.NkiRuleError, match="exceeds one 2 KiB bank"):
        nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum)
    nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.psum)  # 2 KiB of bf16 fits
    with pytest.raises(fake_nki.lib.NkiRuleError, match="number of partitions 129 exceed"):
        nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)


def test_bf16_writes_round_to_nearest_even(fake_nki):
    lib = fake_nki.lib
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
    values = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.0e38, np.nan], dtype=np.float32)
    rounded = lib.round_to_bf16(values)
    assert rounded[0] == 1.0 and rounded[1] == 1.0 + 2.0 ** -6
    assert np.isfinite(rounded[2]) and rounded[2] == pytest.approx(3.0e38, rel=2.0 ** -8)
    assert np.isnan(rounded[3])
    out = _run(fake_nki, lambda a: _store(fake_nki, _load(fake_nki, a, "bfloat16")), values[:2].reshape(1, 2))
    np.testing.assert_array_equal(out.reshape(-1), rounded[:2])


def test_shared_hbm_is_shared_between_the_programs_of_an_lnc_launch(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        half = a.shape[0] // nl.num_programs(0)
        r0 = nl.program_id(0) * half
        t = _load(fake_nki, a[r0:r0 + half, 0:64])
        nisa.dma_copy(dst=out[r0:r0 + half, 0:64], src=t)
        return out

    np.testing.assert_array_equal(_run(fake_nki, body, A, grid=2), A)
    assert fake_nki.state.grids == [2]


def test_tensor_reduce_across_partitions_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(a):
        total = nl.ndarray((1, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=_load(fake_nki, a), axis=0, keepdims=True)
        return _store(fake_nki, total)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="free axes only"):
        _run(fake_nki, body, A)


def test_memset_writes_on_chip_only(fake_nki):
    nisa = fake_nki.nisa

    def body(a):
        nisa.memset(dst=a, value=0.0)
        return a

    with pytest.raises(fake_nki.lib.NkiRuleError, match="memset: dst is in hbm"):
        _run(fake_nki, body, A)


def _breaking_bodies(fake):
    """One small kernel body per remaining rule, with the message the model must raise."""
    nl, nisa = fake.nl, fake.nisa

    def sbuf(shape, dtype="float32"):
        return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)

    def psum(shape):
        return nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)

    def dma_shape(a):
        nisa.dma_copy(dst=sbuf((128, 32)), src=a)

    def tensor_tensor_shape(a):
        t = _load(fake, a)
        nisa.tensor_tensor(dst=sbuf(a.shape), data1=t, data2=t[0:128, 0:32], op=nl.add)

    def operand_shape(a):
        t = _load(fake, a)
        nisa.tensor_scalar(dst=sbuf(a.shape), data=t, op0=nl.add, operand0=sbuf((128, 2)))

    def moving_too_wide(a):
        nisa.nc_matmul(dst=psum((32, 64)), stationary=sbuf((128, 32)), moving=sbuf((128, 513)))

    def matmul_dst_shape(a):
        nisa.nc_matmul(dst=psum((32, 32)), stationary=sbuf((128, 32)), moving=_load(fake, a))

    def transpose_from_psum(a):
        p = psum((128, 64))
        nisa.tensor_copy(dst=p, src=_load(fake, a))
        nisa.nc_transpose(dst=psum((64, 128)), data=p)

    def transpose_too_big(a):
        nisa.nc_transpose(dst=psum((128, 128)), data=sbuf((128, 129)))

    def fancy_index(a):
        return a[[0, 1], 0:4]

    return [
        (lambda a: nl.ndarray((4, 4), dtype=nl.float32, buffer="l2"), "unknown buffer"),
        (lambda a: sbuf((128,)), "at least 2 dimensions"),
        (lambda a: sbuf((4, 4), dtype="int8"), "dtype int8 is not modelled"),
        (dma_shape, r"dma_copy dst/src: \(128, 32\) != \(128, 64\)"),
        (tensor_tensor_shape, "tensor_tensor inputs"),
        (operand_shape, r"operand \(128, 2\) is not \(128, 1\)"),
        (moving_too_wide, "break tile limits"),
        (matmul_dst_shape, r"dst \(32, 32\) != \(32, 64\)"),
        (transpose_from_psum, "data is in psum; nc_transpose reads data only from sbuf"),
        (transpose_too_big, "exceeds 128x128"),
        (fancy_index, "only ints and slices"),
    ]


@pytest.mark.parametrize("index", range(11))
def test_each_remaining_rule_has_a_kernel_that_breaks_it(fake_nki, index):
    body, message = _breaking_bodies(fake_nki)[index]
    with pytest.raises(fake_nki.lib.NkiRuleError, match=message):
        _run(fake_nki, body, A)


def test_kernel_inputs_must_be_in_hbm(fake_nki):
    tile = fake_nki.nl.ndarray((128, 64), dtype="float32", buffer="sbuf")
    with pytest.raises(fake_nki.lib.NkiRuleError, match="must be in HBM"):
        _run(fake_nki, lambda a: a, tile)
