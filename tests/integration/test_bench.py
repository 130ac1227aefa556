"""`siglip-serve bench` runs every part end to end and writes its JSON (numbers are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siglip_serve.measure.results import BenchResult
from tests.bounds import RUN_S, cluster_start

pytestmark = pytest.mark.own_cluster

BIN = Path(sys.executable).parent


def test_bench_writes_every_part(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    with cluster_start("bench's service"):  # a start, a few seconds of load, a stop: held throughout
        run = subprocess.run(
            [str(BIN / "siglip-serve"), "bench", "--model", "tiny-siglip", "--warmup", "1", "--iterations", "3",
             "--concurrency", "1,2", "--requests", "6", "--images-per-request", "2", "--endpoint", "json",
             "--multicore", "2", "--set", "torch_threads=1", "--json", str(out), "--client-processes", "2",
             "--profile", str(tmp_path / "profiles"), "--profile-seconds", "2", "--price-per-hour", "3.6",
             "--accelerators", "2"],
            capture_output=True, text=True, timeout=RUN_S,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    BenchResult.model_validate(result)  # the file is the model the report reads
    assert result["model"] == "tiny-siglip" and result["backend"] == "cpu"
    assert [row["bucket"] for row in result["encoder"]] == [1, 2, 4, 8]
    assert all(row["images_per_second"] > 0 and row["iterations"] == 3 for row in result["encoder"])
    assert result["preprocess"]["images_per_second"] > 0 and result["preprocess"]["threads"] == 1
    assert [row["concurrency"] for row in result["served"]] == [1, 2]
    assert all(row["failures"] == 0 and row["images_per_request"] == 2 for row in result["served"])
    for row in result["served"]:
        # The service's process tree spent CPU on every image: the encoder and the ingress at least.
        cpu = row["server_cpu"]
        by_kind = cpu["ms_per_image_by_kind"]
        assert cpu["ms_per_image"] == pytest.approx(sum(by_kind.values()))
        assert cpu["ms_per_image"] > 0
        assert cpu["ms_per_image"] == pytest.approx(cpu["seconds"] * 1e3 / (row["requests"] * 2))
        # HAProxy (the "proxy" kind) costs ~0.6 ms per image: a few requests can round it to 0 in
        # psutil's 10 ms ticks, so its presence is checked, not its size.
        assert by_kind["encoder"] > 0 and by_kind["ingress"] > 0 and by_kind["proxy"] >= 0
        # The client's own CPU: its two processes and the bench process, outside the service's.
        client = row["client_cpu"]
        assert client["client_processes"] == 2 and client["processes"] == 3 and client["seconds"] > 0
        assert 0 < client["busiest_process_core_fraction"]
    assert result["multicore"]["cores"] == 2 and len(result["multicore"]["workers"]) == 2
    assert 0 < result["served_over_bare"] and result["front_end"] == "haproxy" and result["endpoint"] == "json"
    # The host ceiling: the same deployment with the model taken out, at the highest concurrency.
    ceiling = result["host_ceiling"]
    assert ceiling["concurrency"] == 2 and ceiling["images_per_second"] > 0
    assert ceiling["images_per_second_per_core"] == pytest.approx(1000 / ceiling["server_cpu"]["ms_per_image"])
    assert ceiling["client_cpu"]["client_processes"] == 2
    assert result["bound"]["verdict"] in ("host-bound", "device-bound", "client-bound")
    assert result["bound"]["client_busiest_core_fraction"] == max(
        ceiling["client_cpu"]["busiest_process_core_fraction"],
        result["served"][-1]["client_cpu"]["busiest_process_core_fraction"])
    assert result["bound"]["host_ceiling_images_per_second"] == ceiling["images_per_second"]
    # replicas: auto (the cpu default) with one thread each: one replica per usable core.
    assert result["replicas"] == len(os.sched_getaffinity(0)) and result["torch_threads"] == 1
    # A flame graph of each Python process of the service, from py-spy, under the highest concurrency.
    made = {profile["kind"]: profile["path"] for profile in result["profiles"] if profile["path"]}
    assert {"ingress", "encoder"} <= set(made), result["profiles"]
    for kind, path in made.items():
        svg = Path(path).read_text()
        assert path.startswith(str(tmp_path / "profiles")) and "<svg" in svg
        assert kind not in ("ingress", "encoder") or "siglip_serve" in svg  # our own frames, sampled
    # $3.60 an hour: a million images cost 1,000 / img/s dollars. The bare encoder's best bucket counts both
    # accelerators given, up to the host ceiling where that is lower.
    assert result["price"] == {"usd_per_hour": 3.6, "accelerators": 2, "instance": None, "region": None, "date": None,
                               "source": None}
    for row in result["served"]:
        assert row["usd_per_million_images"] == pytest.approx(1000 / row["images_per_second"])
    bare, best = result["bare_price"], max(result["encoder"], key=lambda row: row["images_per_second"])
    assert bare["bucket"] == best["bucket"] and bare["per_accelerator_images_per_second"] == best["images_per_second"]
    assert bare["images_per_second"] == min(2 * best["images_per_second"], ceiling["images_per_second"])
    assert bare["capped_by_host_ceiling"] == (ceiling["images_per_second"] < 2 * best["images_per_second"])
    assert bare["usd_per_million_images"] == pytest.approx(1000 / bare["images_per_second"])
    for title in ("flame graphs", "bare encoder", "preprocessing", "served over HTTP", "server CPU-ms per image",
                  "multi-core", "served / bare", "host ceiling", result["bound"]["verdict"], "2 client process(es)",
                  "client_busiest_core", "usd_per_million_images", "priced at $3.6/h (2 accelerators)",
                  f"bare encoder, bucket {best['bucket']}, for the instance"):
        assert title in run.stdout
