"""Issue 35, B6 and B7: the simulator is pinned to trn2 unless the user chose a target, and says so in each row
and above them; the SBUF budget asks NKI's current attribute first and says which answered; the PSUM bank count
follows NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE. The fake NKI (kernels_fake_nki) records the target each simulation
saw; it proves what our launcher sets, not what the real simulator models for that target."""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import check, hardware, nki_launch


def test_the_simulator_runs_for_trn2_unless_the_user_set_a_target(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    run = nki_launch.default_runs(seed=2)[0]
    result = nki_launch.check_kernel(run, on="simulator")
    assert fake_nki.state.simulate_targets == ["trn2"]  # unset: trn3 off a trn2, per the simulator's page
    assert result.passed and result.target == "nki kernel (simulator trn2, LNC=2)"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    result = nki_launch.check_kernel(run, on="simulator")
    assert fake_nki.state.simulate_targets[-1] == "trn3"  # the user's choice stands
    assert result.target == "nki kernel (simulator trn3 from NEURON_PLATFORM_TARGET_OVERRIDE, LNC=2)"


def test_the_check_report_says_the_target_and_each_budget_with_its_source(fake_nki, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    monkeypatch.setattr(check, "default_runs", lambda seed, lnc: nki_launch.default_runs(seed, lnc)[:1])
    monkeypatch.setattr("siglip_serve.kernels.siglip.small_runs", lambda lnc, seed: [])
    report = check.run_checks(seed=0, kernels_on="simulator")
    printed = report.format().splitlines()
    assert printed[:3] == [
        "SBUF a kernel can use per partition: 212728 B (nki-library's MAX_AVAILABLE_SBUF_SIZE (no "
        "nki.language.tile_size figure here))",
        "PSUM banks a kernel can use: 8 (NeuronCore-v3: 8 banks of 2 KiB)",
        "NKI simulator target: trn2"]
    assert report.passed and report.as_dict()["setting"]["NKI simulator target"] == "trn2"


def test_sbuf_budget_asks_sbuf_fmax_bytes_before_the_deprecated_attribute(fake_nki):
    tile_size = fake_nki.nl.tile_size
    tile_size.total_available_sbuf_size = 200_000
    assert hardware.sbuf_budget_source() == (200_000, "nl.tile_size.total_available_sbuf_size")
    tile_size.sbuf_fmax_bytes = 196_608  # NKI 0.4+: the per-partition usable size
    assert hardware.sbuf_budget_source() == (196_608, "nl.tile_size.sbuf_fmax_bytes")
    assert hardware.sbuf_budget() == 196_608
    with pytest.raises(hardware.TileSizeError, match="more than the 196608 a kernel can use"):
        hardware.check_sbuf_budget(196_609, "one byte over")


def test_psum_banks_are_7_when_dma_transpose_runs_on_the_pe_array(fake_nki, monkeypatch):
    assert hardware.psum_banks_source()[0] == 8
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    assert hardware.psum_banks_source() == (7, "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true keeps bank 7 for "
                                               "nc_transpose")
    with pytest.raises(hardware.TileSizeError, match="needs 8 PSUM banks per partition live, more than the 7"):
        hardware.check_psum_banks(8, "eight accumulators")
    nl, lib = fake_nki.nl, fake_nki.lib

    def banks(x):
        return [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]

    with pytest.raises(lib.NkiRuleError, match="psum over budget"):  # the fake keeps bank 7 free too
        fake_nki.nki.jit(banks)(lib.hbm_input(np.ones((2, 2)), "float32"))
    fake_nki.nl.tile_size.psum_num_banks = 6  # where NKI answers itself, its figure wins
    assert hardware.psum_banks_source() == (6, "nl.tile_size.psum_num_banks")
