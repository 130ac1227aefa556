"""Seed 000's multi-core run: pinned worker processes in parallel, summed; and the seed table."""

from __future__ import annotations

from pathlib import Path

import pytest

from siglip_serve.measure.multicore import format_comparison, run_multicore
from siglip_serve.measure.results import MulticoreResult
from siglip_serve.measure.seed import SEED_REFERENCE, SeedRow, multicore_seed_by_lnc, seed_rows_for
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact
from tests.helpers import neuronx_double, tiny_settings, worker_pythonpath


def check_run(result: MulticoreResult, cores: int, bucket: int, iterations: int) -> None:
    workers = result.workers
    assert len(workers) == cores and result.cores == cores and result.bucket == bucket
    assert sorted(w.core for w in workers) == [str(i) for i in range(cores)]  # one core each
    assert len({w.pid for w in workers}) == cores  # one process each
    assert all(w.images == bucket * iterations and w.images_per_second > 0 for w in workers)
    total = result.instance_images_per_second
    assert total == pytest.approx(sum(w.images_per_second for w in workers))
    assert result.per_core_images_per_second == pytest.approx(total / cores)
    # The measured windows overlap: the runs were in parallel, not one after another.
    assert max(w.start for w in workers) < min(w.end for w in workers)
    assert result.wall_images_per_second > 0


@pytest.fixture(scope="module")
def cpu_run() -> MulticoreResult:
    # Settings as a plain mapping, as siglip_serve.measure.report passes them from YAML.
    return run_multicore({"model": "tiny-siglip"}, cores=2, bucket=2, warmup=1, iterations=30)


def test_cpu_workers_run_in_parallel_one_thread_each(cpu_run: MulticoreResult) -> None:
    result = cpu_run
    check_run(result, cores=2, bucket=2, iterations=30)
    assert result.backend == "cpu" and result.lnc is None
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
    assert result.lnc == 1 and all(w.lnc_env == "1" for w in result.workers)
    assert "seed LNC=1, 8 cores, un-cast fp32" in format_comparison(result)


def figures(row: SeedRow) -> tuple:
    return row.cores, row.per_core_images_per_second, row.latency_mean_ms, row.instance_images_per_second


def test_seed_reference_rows() -> None:
    by_label = {row.label: row for row in SEED_REFERENCE}
    assert figures(by_label["seed LNC=2, 4 cores, matmult"]) == (4, 35.43, 28.23, 141.1)
    assert figures(by_label["seed LNC=1, 8 cores, un-cast fp32"]) == (8, 14.38, 69.56, 115.0)
    singles = {row.auto_cast: row.per_core_images_per_second for row in SEED_REFERENCE if row.cores == 1}
    assert singles == {"none": 21.6, "matmult": 36.1}
    assert [r.label for r in seed_rows_for(lnc=2, cores=4)] == ["seed LNC=2, 4 cores, matmult"]
    assert {r.auto_cast for r in seed_rows_for(lnc=2, cores=1)} == {"none", "matmult"}
    assert len(seed_rows_for(lnc=None, cores=2)) == len(SEED_REFERENCE)


def test_the_load_test_report_reads_our_results(cpu_run: MulticoreResult, tmp_path: Path) -> None:
    """siglip_serve.measure.report reads what run_multicore writes, and the seed's multi-core row per LNC."""
    from siglip_serve.measure.report import build_report

    seed = multicore_seed_by_lnc()
    assert seed[2].instance_images_per_second == 141.1 and seed[2].cores == 4
    assert seed[1].per_core_images_per_second == 14.38
    result = cpu_run
    path = tmp_path / "multicore.json"
    result.write(path)
    read = MulticoreResult.read(path)
    assert read == result and read.seed_reference == list(SEED_REFERENCE)
    report = build_report(tmp_path, None, read, None, None, None, {})
    (row,) = (r for r in report.rows if r.source == "(b) this run")
    assert row.instance == pytest.approx(sum(w.images_per_second for w in result.workers)) and row.cores == 2
    assert row.latency_ms == pytest.approx(sum(w.latency_mean_ms for w in result.workers) / 2)
