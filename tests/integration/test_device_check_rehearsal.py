"""tools/device_check.sh's CPU rehearsal, for real: tiny-siglip on the cpu backend, short bounds. Every step
of the GPU run gets a status, the measured ones their numbers, and the bundle is the three files a device
machine sends back. One Ray start only (a minute on 2 cores): the two served variants and the host ceiling
are skipped here, their commands and the verdict from a ceiling's figures being
tests/unit/test_device_check.py's; here the verdict says it was skipped, and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from siglip_serve.measure.client_pool import auto_client_processes

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["install", "probe", "pytest-cuda", "encoder", "encoder-graphs", "served", "served-ingress-1",
         "served-nvjpeg", "host-ceiling", "verdict", "ratio"]


@pytest.mark.timeout(600)  # four subprocesses importing torch, one starting Ray
def test_cpu_rehearsal_records_every_step(tmp_path: Path) -> None:
    out, bundle = tmp_path / "dc", tmp_path / "back"
    run = subprocess.run(
        [str(ROOT / "tools" / "device_check.sh"), "--out", str(out), "--bundle", str(bundle), "--backend", "cpu",
         "--model", "tiny-siglip", "--skip", "install,served-ingress-1,served-nvjpeg,host-ceiling",
         "--concurrency", "1,4", "--requests", "12", "--warmup", "1", "--iterations", "3", "--budget-s", "540",
         "--timeout-scale", "3"],  # the shared 2-core machine: a Ray start alone can take a minute
        capture_output=True, text=True, timeout=570, env={**os.environ, "PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {step["name"]: step for step in summary["steps"]}
    assert list(steps) == STEPS and summary["ok"]
    assert {n for n, s in steps.items() if s["status"] == "skipped"} == {
        "install", "encoder-graphs", "served-ingress-1", "served-nvjpeg", "host-ceiling", "verdict"}
    assert steps["encoder-graphs"]["error"] == "backend cpu has no CUDA graphs"
    assert steps["probe"]["figures"]["cuda_available"] is False and steps["probe"]["figures"]["usable_cpus"] >= 1
    # On the CPU every cuda test is skipped, and the step says so rather than failing.
    assert steps["pytest-cuda"]["figures"]["skipped"] > 0 and steps["pytest-cuda"]["figures"]["failures"] == 0
    assert set(steps["encoder"]["figures"]["by_bucket"]) == {"1", "2", "4", "8"}
    for name in ("encoder", "served"):
        assert steps[name]["figures"]["images_per_second"] > 0 and steps[name]["figures"]["latency_p99_ms"] > 0
    figures = steps["served"]["figures"]
    assert figures["cpu_ms_per_image"] > 0 and figures["failures"] == 0 and figures["concurrency"] == 4
    assert figures["ingress_replicas"] >= 1  # what the ceiling's command takes from served.json
    # --client-processes auto, resolved by bench on this machine; its busiest process's share of a core.
    assert figures["client_processes"] == auto_client_processes(len(os.sched_getaffinity(0)))
    assert figures["client_busiest_core_fraction"] > 0
    assert steps["verdict"]["error"] == "needs host-ceiling (skipped: skipped by --skip)"
    assert steps["ratio"]["figures"]["served_over_bare"] == pytest.approx(
        steps["served"]["figures"]["images_per_second"] / steps["encoder"]["figures"]["images_per_second"])
    table = (out / "summary.md").read_text()
    assert all(f"| {name} |" in table for name in STEPS) and "| served | PASSED |" in table
    assert "| client CPU |" in table and " proc, busiest " in table
    assert sorted(p.name for p in bundle.iterdir()) == ["device-check.tgz", "summary.json", "summary.md"]
    with tarfile.open(bundle / "device-check.tgz") as tar:
        assert "device-check/logs/served.log" in tar.getnames()
