"""Issue 35, B3: every launch at LNC > 1 passes the matching grid, on NKI 0.7 too and in the simulator, with
NEURON_LOGICAL_NC_CONFIG set beside it. Run on the fake NKI (kernels_fake_nki), whose version string each
test sets: it proves what our launcher passes, not what the real NKI 0.7 or its simulator do with it."""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import nki_launch


@pytest.mark.parametrize("fake_nki", ["0.7.0", "0.5.0"], indirect=True)
def test_at_lnc_2_every_launch_passes_the_matching_grid_on_each_nki(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    runs = nki_launch.default_runs(seed=3)
    results = [nki_launch.check_kernel(run) for run in runs]
    assert [r.name for r in results if not r.passed] == []
    assert fake_nki.nki.__version__ in ("0.7.0", "0.5.0")
    assert fake_nki.state.explicit_grids == [2] * len(runs)  # not a plain call that trusts the variable
    assert fake_nki.state.grids == [2] * len(runs)


@pytest.mark.parametrize("fake_nki", ["0.7.0"], indirect=True)
def test_at_lnc_1_the_plain_call_runs_one_program(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    run = nki_launch.default_runs(seed=3, lnc=1)[0]
    np.testing.assert_allclose(nki_launch.simulate(run), run.expected, rtol=2e-3, atol=2e-3)
    assert fake_nki.state.explicit_grids == [None] and fake_nki.state.grids == [1]


@pytest.mark.parametrize("fake_nki", ["0.7.0"], indirect=True)
def test_the_fake_reads_the_lnc_variable_without_a_grid_and_refuses_a_grid_that_differs(fake_nki, monkeypatch):
    kernel = fake_nki.nki.jit(lambda a: _copy(fake_nki, a))
    a = np.ones((256, 4), np.float32)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    np.testing.assert_array_equal(kernel(a), a)
    assert fake_nki.state.grids == [2] and fake_nki.state.explicit_grids == [None]
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    with pytest.raises(fake_nki.lib.NkiRuleError, match=r"launch grid \[2\] differs from the LNC in use"):
        kernel[2](a)


def _copy(fake, a):
    nl, nisa = fake.nl, fake.nisa
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    rows = a.shape[0] // nl.num_programs(0)
    r0 = nl.program_id(0) * rows
    t = nl.ndarray((rows, a.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[r0:r0 + rows, 0:a.shape[1]])
    nisa.dma_copy(dst=out[r0:r0 + rows, 0:a.shape[1]], src=t)
    return out
