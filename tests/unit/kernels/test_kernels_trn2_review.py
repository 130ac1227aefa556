"""What issue 27's review of the kernels against AWS's docs changed: the fake NKI refuses what real NKI
refuses (one test a rule), the LNC a launch runs at, the MLP's balance at LNC=2, the SBUF budget and
the on-device tolerances. The fake proves the rules are kept here; the first trn2 run proves the rules."""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import lnc as lnc_mod
from siglip_serve.kernels import nki_launch, siglip

X = np.arange(32 * 64, dtype=np.float32).reshape(32, 64) / 100.0


def _launch(fake, body, *args, grid=1):
    kernel = fake.nki.jit(body)
    return (kernel[grid] if grid > 1 else kernel)(*args)


def _tile(fake, x, dtype=None):
    nl, nisa = fake.nl, fake.nisa
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _out(fake, t):
    out = fake.nl.ndarray(t.shape, dtype=t.dtype, buffer=fake.nl.shared_hbm)
    fake.nisa.dma_copy(dst=out, src=t)
    return out


def test_reduce_with_the_reduction_function_instead_of_the_operator_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(x, op):
        t = _tile(fake_nki, x)
        m = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=m, op=op, data=t, axis=1, keepdims=True)
        return _out(fake_nki, m)

    np.testing.assert_allclose(_launch(fake_nki, lambda x: body(x, nl.maximum), X), X.max(axis=1, keepdims=True))
    with pytest.raises(fake_nki.lib.NkiRuleError, match="not in the ISA's operator table"):
        _launch(fake_nki, lambda x: body(x, nl.max), X)


def test_an_activation_that_is_not_an_activation_function_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(x):
        t = _tile(fake_nki, x)
        nisa.activation(dst=t, op=nl.maximum, data=t)
        return _out(fake_nki, t)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="not an activation function"):
        _launch(fake_nki, body, X)


def test_a_transpose_that_changes_the_dtype_is_refused(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(x):
        t = _tile(fake_nki, x)
        p = nl.ndarray((64, 32), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=t)
        return x

    with pytest.raises(fake_nki.lib.NkiRuleError, match="a transpose keeps the dtype"):
        _launch(fake_nki, body, X)


def test_a_launch_grid_that_is_no_lnc_is_refused(fake_nki):
    with pytest.raises(fake_nki.lib.NkiRuleError, match=r"launch grid \[4\]"):
        fake_nki.nki.jit(lambda x: x)[4]


def test_sbuf_and_psum_budgets_count_the_tiles_still_alive(fake_nki):
    nl, lib = fake_nki.nl, fake_nki.lib
    half = lib.SBUF_BUDGET // 2 // 4  # float32 columns filling half the budget

    def body(x):
        kept = [nl.ndarray((128, half), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)]
        del kept  # freed: the next two fit again
        again = [nl.ndarray((128, half), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)]
        nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)  # one more while both are held
        return again

    with pytest.raises(lib.NkiRuleError, match=r"sbuf over budget: 212728 bytes per partition live"):
        _launch(fake_nki, body, X)

    def banks(x):
        held = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        held.append(nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum))
        return held

    with pytest.raises(lib.NkiRuleError, match="psum over budget"):
        _launch(fake_nki, banks, X)


def test_a_dma_that_changes_the_dtype_needs_a_casting_dge_mode(fake_nki):
    nl, nisa = fake_nki.nl, fake_nki.nisa

    def body(x, mode):
        t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, dge_mode=mode)
        return _out(fake_nki, t)

    with pytest.raises(fake_nki.lib.NkiRuleError, match="a DMA moves raw bytes"):
        _launch(fake_nki, lambda x: body(x, nisa.dge_mode.unknown), X)
    cast = _launch(fake_nki, lambda x: body(x, nisa.dge_mode.swdge), X)
    np.testing.assert_allclose(cast, fake_nki.lib.round_to_bf16(X))


def test_at_lnc_2_the_mlp_programs_split_the_tokens_evenly(fake_nki):
    from siglip_serve.kernels import nki_tiles

    spans = []
    for pid in (0, 1):
        fake_nki.state.program_id, fake_nki.state.num_programs = pid, 2
        spans.append(nki_tiles.my_span_tiles(729, 512))
    fake_nki.state.program_id, fake_nki.state.num_programs = 0, 1
    assert spans == [[(0, 365)], [(365, 729)]]  # not 512 + 217 (at best 70 % of the roofline)
    assert nki_tiles.my_span_tiles(1024, 512) == [(0, 512), (512, 1024)]


def test_a_launch_sets_the_lnc_for_nki_jit_and_a_device_launch_never_changes_it(monkeypatch):
    env: dict[str, str] = {}
    lnc_mod.pin_launch_lnc(2, env)
    assert env == {"NEURON_LOGICAL_NC_CONFIG": "2"}  # unset, nki.jit would launch at LNC=1
    with pytest.raises(lnc_mod.KernelLncError, match="NEURON_LOGICAL_NC_CONFIG=2"):
        lnc_mod.pin_launch_lnc(1, env)
    lnc_mod.pin_launch_lnc(1, env, on_device=False)  # the simulator has no runtime to disagree with
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    # Issue 35: the grid repeats the LNC on every NKI version (0.7 included), none at LNC=1.
    assert lnc_mod.launch_grid(2) == 2 and lnc_mod.launch_grid(1) is None


def test_so400m_bf16_mlp_fits_the_usable_sbuf_with_its_margin(monkeypatch):
    from siglip_serve.kernels import hardware

    monkeypatch.setattr(hardware, "sbuf_budget", lambda: hardware.SBUF_USABLE_BYTES_PER_PARTITION)
    assert hardware.SBUF_USABLE_BYTES_PER_PARTITION == 212_728  # nki-library's MAX_AVAILABLE_SBUF_SIZE
    needed = siglip.mlp_sbuf_bytes(siglip.WIDTH, siglip.INTER, 2)
    assert (needed, hardware.check_sbuf_budget(needed, "SO400M mlp")) == (201_036, 11_692)
    with pytest.raises(hardware.TileSizeError, match="more than the 212728 a kernel can use"):
        hardware.check_sbuf_budget(212_729, "one byte over")


def test_on_device_rows_get_their_own_tolerance_and_say_what_they_saw():
    mlp = siglip.small_runs(lnc=1)[1]
    add = nki_launch.prepare_tensor_add_spmd(np.ones((128, 4), np.float32), np.ones((128, 4), np.float32), 1)
    assert nki_launch.kernel_tolerance(mlp, "neuron") > nki_launch.kernel_tolerance(mlp, "simulator") == 2e-3
    assert nki_launch.kernel_tolerance(add, "neuron") == 2e-3  # no ScalarE approximation in an add
    result = nki_launch.CheckResult("k", "nki kernel (neuron, LNC=2)", 3e-3, True, tolerance=1e-2, lnc=2)
    assert result.verdict == "ok within 0.01" and result.as_dict()["lnc"] == 2
