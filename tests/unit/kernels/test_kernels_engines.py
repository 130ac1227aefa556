"""Issue 35, B8: the single-column steps run on the engines the NKI engine-selection guide recommends for them
(softmax's [rows, 1] reciprocal on VectorE, LayerNorm's rsqrt on GpSimd), the table of ScalarE functions each
kernel calls matches what the kernels issue, and the on-device tolerance is tightened where no ScalarE
approximation is left. The fake NKI records which engine ran what; it computes every function exactly, so it
says nothing of the engines' precision (the trn2 rows print the error they observe)."""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import nki_launch, siglip


def _scalar_engine_functions(fake) -> set[str]:
    return {name for (instruction, name, _), count in fake.state.engine_ops.items()
            if instruction == "activation" and count}


@pytest.mark.parametrize("index", range(3), ids=["layer_norm", "mlp", "softmax"])
def test_single_column_steps_leave_the_scalar_engine(fake_nki, monkeypatch, index):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    run = siglip.small_runs(lnc=2, seed=4)[index]
    assert nki_launch.check_kernel(run).passed
    ops = fake_nki.state.engine_ops
    if run.kernel == "layer_norm":
        assert ops[("tensor_scalar", "rsqrt", "gpsimd")] > 0
    if run.kernel == "softmax_rows":
        assert ops[("reciprocal", "reciprocal", "vector")] > 0
    assert ("activation", "rsqrt", "scalar") not in ops and ("activation", "reciprocal", "scalar") not in ops


def test_the_scalar_engine_table_is_what_each_kernel_issues(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    for run in nki_launch.default_runs(seed=6) + siglip.small_runs(lnc=1, seed=6):
        fake_nki.state.engine_ops.clear()
        assert nki_launch.check_kernel(run).passed, run.name
        assert _scalar_engine_functions(fake_nki) == set(nki_launch.SCALAR_ENGINE_FUNCTIONS.get(run.kernel, ())), \
            run.name


def test_device_tolerance_is_tightened_where_no_scalar_engine_approximation_is_left():
    ln, mlp, softmax = siglip.small_runs(lnc=1)
    assert nki_launch.kernel_tolerance(ln, "neuron") == nki_launch.SIMULATOR_TOLERANCE == 2e-3
    assert nki_launch.kernel_tolerance(softmax, "neuron") == nki_launch.kernel_tolerance(mlp, "neuron") == 1e-2


def test_the_fake_keeps_the_engine_rules_of_tensor_scalar(fake_nki):
    nl, nisa, lib = fake_nki.nl, fake_nki.nisa, fake_nki.lib

    def body(x, op0, operand0, engine):
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=op0, operand0=operand0, engine=engine)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.full((4, 1), 4.0, np.float32)
    np.testing.assert_allclose(fake_nki.nki.jit(lambda a: body(a, nl.rsqrt, 0.0, nisa.engine.gpsimd))(x), 0.5)
    with pytest.raises(lib.NkiRuleError, match="engine=gpsimd is only allowed for rsqrt"):
        fake_nki.nki.jit(lambda a: body(a, nl.add, 1.0, nisa.engine.gpsimd))(x)
    with pytest.raises(lib.NkiRuleError, match="operand0 must be None or 0 for the unary rsqrt"):
        fake_nki.nki.jit(lambda a: body(a, nl.rsqrt, 1.0, nisa.engine.unknown))(x)
