"""Seed 000's multi-core run: pinned worker processes in parallel, summed; and the seed table."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.multicore_bench import SEED_REFERENCE, format_comparison, run_multicore, seed_rows_for
from models.neuron_compile import CompileOptions, compile_artifact
from models.settings import ModelSettings
from tests.neuron_helpers import neuronx_double, tiny_settings, worker_pythonpath


def check_run(result: dict, cores: int, bucket: int, iterations: int) -> None:
    workers = result["workers"]
    assert len(workers) == cores and result["cores"] == cores and result["bucket"] == bucket
    assert sorted(w["core"] for w in workers) == [str(i) for i in range(cores)]  # one core each
    assert len({w["pid"] for w in workers}) == cores  # one process each
    assert all(w["images"] == bucket * iterations and w["img_s"] > 0 for w in workers)
    assert result["instance_img_s"] == pytest.approx(sum(w["img_s"] for w in workers))
    assert result["per_core_img_s"] == pytest.approx(result["instance_img_s"] / cores)
    # The measured windows overlap: the runs were in parallel, not one after another.
    assert max(w["start"] for w in workers) < min(w["end"] for w in workers)
    assert result["wall_img_s"] > 0


def test_cpu_workers_run_in_parallel_one_thread_each() -> None:
    result = run_multicore(ModelSettings(model="tiny-siglip"), cores=2, bucket=2, warmup=1, iterations=30)
    check_run(result, cores=2, bucket=2, iterations=30)
    assert result["backend"] == "cpu" and result["lnc"] is None
    table = format_comparison(result)
    assert "141.1" in table and "115.0" in table and "ours: cpu" in table and "not comparable" in table


def test_neuron_workers_get_the_artifacts_lnc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the trace double (no NeuronCore: this checks the pinning environment, not speed)."""
    with neuronx_double():
        artifact = compile_artifact(tiny_settings(buckets=(1,)), CompileOptions(lnc=1), tmp_path).artifact_dir
    monkeypatch.setenv("PYTHONPATH", worker_pythonpath())
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")  # the shell's value; workers must get the artifact's
    result = run_multicore(tiny_settings(backend="neuron", artifact_dir=artifact), cores=2, bucket=1,
                           warmup=1, iterations=5)
    check_run(result, cores=2, bucket=1, iterations=5)
    assert result["lnc"] == 1 and all(w["lnc_env"] == "1" for w in result["workers"])
    assert "seed LNC=1, 8 cores" in format_comparison(result)


def test_seed_reference_rows() -> None:
    by_label = {row.label: row for row in SEED_REFERENCE}
    lnc2 = by_label["seed LNC=2, 4 cores"]
    assert (lnc2.cores, lnc2.per_core_img_s, lnc2.latency_ms, lnc2.instance_img_s) == (4, 35.43, 28.23, 141.1)
    lnc1 = by_label["seed LNC=1, 8 cores"]
    assert (lnc1.cores, lnc1.per_core_img_s, lnc1.latency_ms, lnc1.instance_img_s) == (8, 14.38, 69.56, 115.0)
    singles = {row.auto_cast: row.per_core_img_s for row in SEED_REFERENCE if row.cores == 1}
    assert singles == {"none": 21.6, "matmult": 36.1}
    assert [r.label for r in seed_rows_for({"lnc": 2, "cores": 4})] == ["seed LNC=2, 4 cores"]
    assert {r.auto_cast for r in seed_rows_for({"lnc": 2, "cores": 1})} == {"none", "matmult"}
    assert len(seed_rows_for({"lnc": None, "cores": 2})) == len(SEED_REFERENCE)
