"""tools/device_check.sh's CPU rehearsal, for real: tiny-siglip on the cpu backend, short bounds. Every step
of the GPU run gets a status, the measured ones their numbers, and the bundle is the three files a device
machine sends back. Each served step starts a Ray (or a `siglip-serve run`) of its own, tens of seconds on 2
cores, so each kind of step runs once: the first test runs the served default, priced, and the second the lanes
step. The steps that differ from those by their command line alone (served-nvjpeg, served-best-bucket,
served-ingress-1, lanes-interactive-encoder) and the host ceiling are left to tests/unit/test_device_check.py
(their commands, and the verdict from a ceiling's figures); what they set is served for real by the suite's other
tests (tests/integration/test_host_path.py: device decode and two ingress replicas; test_metrics.py: the kept
interactive replica). Here each says it was skipped, and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from siglip_serve.measure.client_pool import auto_client_processes
from tests.bounds import TIME_SCALE, cluster_start, scaled

pytestmark = pytest.mark.own_cluster

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["install", "probe", "pytest-cuda", "encoder", "encoder-graphs", "determinism", "served", "host-ceiling",
         "served-nvjpeg", "served-best-bucket", "lanes", "lanes-interactive-encoder", "served-ingress-1", "verdict",
         "ratio", "price"]
LANES = {"lanes", "lanes-interactive-encoder"}
# Steps that are another step's command with other settings: their command lines are tested by the unit tests.
BY_COMMAND_LINE = ["host-ceiling", "served-nvjpeg", "served-best-bucket", "served-ingress-1"]


def rehearse(tmp_path: Path, *argv: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The check on the cpu backend (the shared 2-core machine: its timeouts tripled, and times the suite's factor,
    as a Ray start alone can take a minute), its summary and its steps by name. Its services start one after
    another inside it: the whole run holds the cluster-start lock."""
    with cluster_start("the device check's rehearsal"):
        run = subprocess.run(
            [str(ROOT / "tools" / "device_check.sh"), "--out", str(tmp_path / "dc"), "--bundle",
             str(tmp_path / "back"), "--backend", "cpu", "--model", "tiny-siglip", "--warmup", "1", "--iterations",
             "3", "--budget-s", str(int(scaled(540))), "--timeout-scale", str(3 * TIME_SCALE), *argv],
            capture_output=True, text=True, timeout=scaled(570), env={**os.environ, "PYTHON": sys.executable},
        )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = json.loads((tmp_path / "dc" / "summary.json").read_text())
    steps = {step["name"]: step for step in summary["steps"]}
    assert list(steps) == STEPS and summary["ok"]
    return summary, steps


@pytest.mark.timeout(600)  # subprocesses importing torch, three starting Ray
def test_cpu_rehearsal_records_every_step(tmp_path: Path) -> None:
    summary, steps = rehearse(tmp_path, "--skip", ",".join(["install", *BY_COMMAND_LINE, *LANES]),
                              "--concurrency", "1,4", "--requests", "12", "--price-per-hour", "3.6")
    assert {n for n, s in steps.items() if s["status"] == "skipped"} == {
        "install", "encoder-graphs", "verdict", *BY_COMMAND_LINE, *LANES}
    assert steps["encoder-graphs"]["error"] == "backend cpu has no CUDA graphs"
    assert steps["probe"]["figures"]["cuda_available"] is False and steps["probe"]["figures"]["usable_cpus"] >= 1
    # On the CPU every cuda test is skipped, and the step says so rather than failing.
    assert steps["pytest-cuda"]["figures"]["skipped"] > 0 and steps["pytest-cuda"]["figures"]["failures"] == 0
    assert set(steps["encoder"]["figures"]["by_bucket"]) == {"1", "2", "4", "8"}  # the model's buckets on cpu
    # The CPU guarantee (docs/reproducibility.md): every comparison bit-equal with deterministic: true.
    equal, total = steps["determinism"]["figures"]["deterministic_bit_equal"].split("/")
    assert steps["determinism"]["status"] == "passed" and equal == total and int(total) > 10
    for name in ("encoder", "served"):
        assert steps[name]["figures"]["images_per_second"] > 0 and steps[name]["figures"]["latency_p99_ms"] > 0
    figures = steps["served"]["figures"]
    assert figures["cpu_ms_per_image"] > 0 and figures["failures"] == 0 and figures["concurrency"] == 4
    assert figures["ingress_replicas"] >= 1  # what the ceiling's command takes from served.json
    # --client-processes auto, resolved by bench on this machine; its busiest process's share of a core.
    assert figures["client_processes"] == auto_client_processes(len(os.sched_getaffinity(0)))
    assert figures["client_busiest_core_fraction"] > 0
    assert steps["served-best-bucket"]["error"] == "skipped by --skip"
    assert steps["verdict"]["error"] == "needs host-ceiling (skipped: skipped by --skip)"
    assert steps["ratio"]["figures"]["served_over_bare"] == pytest.approx(
        steps["served"]["figures"]["images_per_second"] / steps["encoder"]["figures"]["images_per_second"])
    # $3.60 an hour: a million images cost 1,000 / img/s dollars; the bare encoder uncapped (no host ceiling here).
    assert figures["usd_per_million_images"] == pytest.approx(1000.0 / figures["images_per_second"])
    price = steps["price"]
    assert price["status"] == "passed" and summary["price"]["usd_per_hour"] == 3.6
    assert price["figures"]["usd_per_million_images"] == pytest.approx(
        1000.0 / steps["encoder"]["figures"]["images_per_second"])
    out, bundle = tmp_path / "dc", tmp_path / "back"
    table = (out / "summary.md").read_text()
    assert all(f"| {name} |" in table for name in STEPS) and "| served | PASSED |" in table
    assert "| client CPU |" in table and " proc, busiest " in table and "| $/1M img |" in table
    assert sorted(p.name for p in bundle.iterdir()) == ["device-check.tgz", "summary.json", "summary.md"]
    with tarfile.open(bundle / "device-check.tgz") as tar:
        assert "device-check/logs/served.log" in tar.getnames()


@pytest.mark.timeout(600)  # a `siglip-serve run` start, a few seconds of windows
def test_cpu_rehearsal_of_the_lanes_step(tmp_path: Path) -> None:
    others = [name for name in STEPS if name != "lanes"]
    _, steps = rehearse(tmp_path, "--skip", ",".join(others), "--concurrency", "4", "--lanes-seconds", "2")
    assert {n for n, s in steps.items() if s["status"] == "passed"} == {"lanes"}
    assert steps["price"]["error"].startswith("no price: give --price-per-hour")
    figures = steps["lanes"]["figures"]
    assert figures["images_per_second"] > 0 and figures["failures"] == 0 and figures["latency_p99_ms"] > 0
    # No served step ran: the backfill is the top --concurrency, over --client-processes (auto), and has no
    # served figure to be held against.
    assert figures["bulk_clients"] == 4 and figures["backfill_of_served"] is None
    assert figures["interactive_p99_beside_bulk_over_alone"] > 0
    # The backfill's share of what the interactive stream leaves it, from the windows' rates: there is a share only
    # where the backfill alone outran the interactive stream. Its size is not held: two-second windows on two cores
    # shared with the rest of the suite promise none (a window the machine stalls through can count nothing).
    lanes = json.loads((tmp_path / "dc" / "lanes.json").read_text())
    rate = {(window, row["name"]): row["requests_per_second"]
            for window, rows in lanes["windows"].items() for row in rows}
    room = rate["bulk-alone", "bulk"] - rate["mixed", "interactive"]
    kept = figures["bulk_kept_of_alone_minus_interactive"]
    assert kept == (pytest.approx(rate["mixed", "bulk"] / room, abs=0.006) if room > 0 else None)
    assert figures["small_tenant_p99_beside_large_over_alone"] > 0 and figures["interactive_encoder"] is False
    assert lanes["interactive_encoder"] is False and "interactive_encoder" not in lanes["service"]
    assert list(lanes["windows"]) == ["interactive-alone", "bulk-alone", "mixed", "small-alone", "tenants"]
