"""Seed 000's multi-core run: pinned worker processes in parallel, summed; and the seed table."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.multicore_bench import SEED_REFERENCE, format_comparison, run_multicore, seed_rows_for
from models.neuron_compile import CompileOptions, compile_artifact
from tests.helpers import neuronx_double, tiny_settings, worker_pythonpath


def check_run(result: dict, cores: int, bucket: int, iterations: int) -> None:
    workers = result["workers"]
    assert len(workers) == cores and result["cores"] == cores and result["bucket"] == bucket
    assert sorted(w["core"] for w in workers) == [str(i) for i in range(cores)]  # one core each
    assert len({w["pid"] for w in workers}) == cores  # one process each
    assert all(w["images"] == bucket * iterations and w["images_per_second"] > 0 for w in workers)
    total = result["instance_images_per_second"]
    assert total == pytest.approx(sum(w["images_per_second"] for w in workers))
    assert result["per_core_images_per_second"] == pytest.approx(total / cores)
    # The measured windows overlap: the runs were in parallel, not one after another.
    assert max(w["start"] for w in workers) < min(w["end"] for w in workers)
    assert result["wall_images_per_second"] > 0


def test_cpu_workers_run_in_parallel_one_thread_each() -> None:
    # Settings as a plain mapping, as loadtest.report passes them from YAML.
    result = run_multicore({"model": "tiny-siglip"}, cores=2, bucket=2, warmup=1, iterations=30)
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
    assert "seed LNC=1, 8 cores, un-cast fp32" in format_comparison(result)


def figures(row: dict) -> tuple:
    return row["cores"], row["per_core_images_per_second"], row["latency_ms"], row["instance_images_per_second"]


def test_seed_reference_rows() -> None:
    by_label = {row["label"]: row for row in SEED_REFERENCE}
    assert figures(by_label["seed LNC=2, 4 cores, matmult"]) == (4, 35.43, 28.23, 141.1)
    assert figures(by_label["seed LNC=1, 8 cores, un-cast fp32"]) == (8, 14.38, 69.56, 115.0)
    singles = {row["auto_cast"]: row["per_core_images_per_second"] for row in SEED_REFERENCE if row["cores"] == 1}
    assert singles == {"none": 21.6, "matmult": 36.1}
    assert [r["label"] for r in seed_rows_for({"lnc": 2, "cores": 4})] == ["seed LNC=2, 4 cores, matmult"]
    assert {r["auto_cast"] for r in seed_rows_for({"lnc": 2, "cores": 1})} == {"none", "matmult"}
    assert len(seed_rows_for({"lnc": None, "cores": 2})) == len(SEED_REFERENCE)


def test_the_load_test_report_reads_our_results() -> None:
    """loadtest.inputs is the consumer of both the seed table and run_multicore's result."""
    from loadtest.inputs import multi_core, seed_reference

    seed = seed_reference()
    assert seed[2]["instance"] == 141.1 and seed[2]["cores"] == 4 and seed[1]["per_core"] == 14.38
    result = {"backend": "neuron", "model": "m", "lnc": 2, "bucket": 1, "cores": 2, "machine": {"host": "h"},
              "instance_images_per_second": 70.0,
              "workers": [{"core": "0", "images_per_second": 35.0, "latency_ms": 28.0},
                          {"core": "1", "images_per_second": 35.0, "latency_ms": 28.5}]}
    read = multi_core(result)
    assert read["images_per_second"] == 70.0 and read["cores"] == 2 and read["lnc"] == 2
    assert [w["latency_ms"] for w in read["per_core"]] == [28.0, 28.5]
