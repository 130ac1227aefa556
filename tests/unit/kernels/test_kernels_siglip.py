"""SigLIP-SO400M kernels: goldens, the NKI bodies on the fake NKI, validation, rooflines, benchmark plumbing."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from siglip_serve.kernels import nki_launch, references, siglip
from siglip_serve.kernels.cli import main
from siglip_serve.kernels.device import Device
from siglip_serve.kernels.hardware import TileSizeError


def test_goldens_match_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 1152))
    gamma, beta = rng.standard_normal(1152), rng.standard_normal(1152)
    np.testing.assert_allclose(references.layer_norm(x, gamma, beta),
                               F.layer_norm(torch.from_numpy(x), (1152,), torch.from_numpy(gamma),
                                            torch.from_numpy(beta), 1e-6).numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(references.gelu_tanh(x), F.gelu(torch.from_numpy(x), approximate="tanh").numpy(),
                               rtol=1e-12, atol=1e-12)
    p = references.softmax(100 * x, 0.5)  # large logits: the max subtraction keeps it finite
    np.testing.assert_allclose(p.sum(axis=-1), 1.0)
    np.testing.assert_allclose(p, torch.softmax(torch.from_numpy(50 * x), -1).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lnc", [1, 2])
def test_small_siglip_kernels_match_their_goldens_on_the_fake_nki(fake_nki, lnc):
    for run in siglip.small_runs(lnc, seed=lnc):
        out = nki_launch.simulate(run)
        assert not np.isnan(out).any(), run.name
        np.testing.assert_allclose(out, run.expected, rtol=1e-4, atol=1e-4, err_msg=run.name)
    assert fake_nki.state.grids == [lnc] * 3


def test_full_size_layer_norm_and_softmax_on_the_fake_nki(fake_nki):
    rng = np.random.default_rng(7)
    ln = siglip.prepare_layer_norm(rng.standard_normal((729, 1152)).astype(np.float32),
                                   np.ones(1152, np.float32), np.zeros(1152, np.float32), lnc=2)
    scores = (3 * rng.standard_normal((16 * 729, 729))).astype(np.float32)
    sm = siglip.prepare_softmax(scores, siglip.HEAD_DIM ** -0.5, lnc=2)
    for run in (ln, sm):
        np.testing.assert_allclose(nki_launch.simulate(run), run.expected, rtol=1e-4, atol=1e-5, err_msg=run.name)


def test_mlp_covers_the_ragged_intermediate_tile(fake_nki):
    _, mlp, _ = siglip.small_runs(lnc=1)
    d, t = mlp.args[0].shape
    inter = mlp.args[1].shape[1]
    assert inter % 128 == 80  # like SigLIP's 4304 = 33 x 128 + 80
    np.testing.assert_allclose(nki_launch.simulate(mlp), mlp.expected, rtol=1e-4, atol=1e-4)
    n_d, n_i, n_t = d // 128, -(-inter // 128), -(-t // 512)
    assert fake_nki.state.instructions["nc_matmul"] == 2 * n_t * n_d * n_i  # fc1 + fc2


def test_validation_against_the_sbuf_budget():
    siglip.validate_mlp(siglip.WIDTH, siglip.INTER, 2)  # SO400M's MLP fits resident in bf16
    with pytest.raises(TileSizeError, match="SBUF"):
        siglip.validate_mlp(siglip.WIDTH, siglip.INTER, 4)  # ... but not in fp32
    with pytest.raises(ValueError, match="multiple of 128"):
        siglip.validate_mlp(1000, 4304, 2)
    runs = siglip.make_runs(lnc=2, dtype="bfloat16")
    assert [r.name for r in runs] == ["siglip_layer_norm", "siglip_mlp_gelu", "siglip_attention_softmax"]
    with pytest.raises(TileSizeError):
        siglip.make_runs(lnc=2, dtype="float32")


def test_rooflines_put_the_mlp_on_compute_and_the_rest_on_memory():
    from siglip_serve.kernels.tiling import workload_roofline

    ln, mlp, sm = siglip.make_runs(lnc=2, dtype="bfloat16")
    flops, nbytes = siglip.workload(mlp, "bfloat16")
    assert flops == 4 * 729 * 1152 * 4304
    assert workload_roofline(flops, nbytes, "bfloat16", 2).bound == "compute"
    for run in (ln, sm):
        assert workload_roofline(*siglip.workload(run, "bfloat16"), "bfloat16", 2).bound == "memory"
    rows, keys = sm.args[0].shape
    assert siglip.workload(sm, "bfloat16")[1] == 2 * rows * keys * 2


def test_benchmark_plumbing_on_an_eager_double(fake_nki):
    """Runs the benchmark loop, roofline maths and table on the fake NKI; proves nothing about speed."""
    device = Device("neuron", torch.device("cpu"), "eager double of a NeuronCore", lambda: None, lambda: 0)
    results = siglip.benchmark(siglip.small_runs(lnc=2), device, "float32", warmup=1, iterations=2)
    assert [r.kernel for r in results] == ["siglip_layer_norm", "siglip_mlp_gelu", "siglip_attention_softmax"]
    for r in results:
        assert r.lnc == 2 and r.iterations == 2 and r.timing == "wall_clock_including_dispatch"
        assert r.pct_trn2_roofline_at_p50 == pytest.approx(100 * r.trn2_roofline_us / r.latency_p50_us)
    table = siglip.format_table(results)
    assert "%roof" in table and "wall_clock_including_dispatch" in table
    doc = siglip.as_json(results, device)
    json.dumps(doc)
    assert doc["timing"] == "wall_clock_including_dispatch"


def test_siglip_command_off_neuron_is_one_clear_line(capsys):
    assert main(["siglip", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the SigLIP kernel benchmark needs a NeuronCore") and err.count("\n") == 1
