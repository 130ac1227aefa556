"""The device check's runner and plan (siglip_serve.measure.device_check), with stub steps: a failure or a
timeout is recorded with its error and the next step still runs; the budget bounds every step; the served
variants differ from the defaults by their one setting; the verdict and the ratio come from the figures."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from siglip_serve.measure import device_check
from siglip_serve.measure.device_steps import Step, StepResult, run_step


def py(code: str) -> Step:
    return Step(code[:12], code, lambda out: [sys.executable, "-c", code], 30)


def test_failure_and_timeout_are_recorded_and_the_next_step_runs(tmp_path: Path) -> None:
    deadline = time.monotonic() + 60
    steps = [py("import sys; print('broken'); sys.exit(3)"),
             Step("slow", "sleeps", lambda out: [sys.executable, "-c", "import time; time.sleep(30)"], 1),
             Step("ok", "writes", lambda out: [sys.executable, "-c", "open('x.json', 'w').write('{}')"], 30,
                  after=lambda out: {"images_per_second": 5.0} if (out / "x.json").exists() else "no x.json"),
             Step("bad-output", "exits 0, no file", lambda out: [sys.executable, "-c", "pass"], 30,
                  after=lambda out: device_check.read(out, "missing.json"))]
    got = [run_step(s, tmp_path, deadline, frozenset(), {}, echo=lambda line: None) for s in steps]
    assert [r.status for r in got] == ["failed", "timeout", "passed", "failed"]
    assert got[0].returncode == 3 and "exit code 3" in (got[0].error or "") and "broken" in (got[0].error or "")
    assert got[1].error == "no result within 1 s; stopped" and got[1].seconds < 25
    assert got[2].figures == {"images_per_second": 5.0} and (tmp_path / "logs" / "ok.log").exists()
    assert "FileNotFoundError" in (got[3].error or "")


def test_the_budget_bounds_each_step_and_skips_what_cannot_start(tmp_path: Path) -> None:
    sleeper = Step("slow", "sleeps", lambda out: [sys.executable, "-c", "import time; time.sleep(30)"], 300)
    began = time.monotonic()
    assert run_step(sleeper, tmp_path, began + 6, frozenset(), {}, echo=lambda line: None).status == "timeout"
    assert time.monotonic() - began < 25  # the budget's 6 s, not the step's 300
    late = run_step(sleeper, tmp_path, time.monotonic() + 1, frozenset(), {}, echo=lambda line: None)
    assert late.status == "skipped" and "budget" in (late.error or "")
    asked = run_step(sleeper, tmp_path, time.monotonic() + 60, frozenset({"slow"}), {}, echo=lambda line: None)
    assert asked.status == "skipped" and asked.error == "skipped by --skip"


def test_a_stopped_step_leaves_nothing_of_its_session_running(tmp_path: Path) -> None:
    # As Ray's reaper does (os.setpgrp): a child in a process group of its own, outside the step's group.
    code = ("import os, subprocess, sys, time; "
            "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgrp(); time.sleep(120)']); "
            "open('child.pid', 'w').write(str(child.pid)); time.sleep(120)")
    result = run_step(Step("leaves", "leaves a child", lambda out: [sys.executable, "-c", code], 3), tmp_path,
                      time.monotonic() + 60, frozenset(), {}, echo=lambda line: None)
    assert result.status == "timeout"
    child = int((tmp_path / "child.pid").read_text())
    gone = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and open(f"/proc/{child}/stat").read().split()[2] != "Z":
        assert time.monotonic() < gone, "the step's child in a group of its own outlived the step"
        time.sleep(0.1)


def plan(*argv: str) -> dict[str, Step]:
    args = device_check.build_parser().parse_args(["--out", "x", *argv])
    return {step.name: step for step in device_check.plan(args)}


def test_the_plan_in_order_and_what_each_variant_changes(tmp_path: Path) -> None:
    steps = plan("--wheels", str(tmp_path))
    assert list(steps) == ["install", "probe", "pytest-cuda", "encoder", "encoder-graphs", "served",
                           "served-ingress-1", "served-nvjpeg", "host-ceiling"]
    (tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl").touch()
    install = plan("--wheels", str(tmp_path))["install"].command(tmp_path)
    assert {"--no-index", "--no-deps"} <= set(install) and install[-2:] == ["-e", str(device_check.ROOT)]
    assert str(tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl") in install
    command = {name: steps[name].command(tmp_path) for name in steps if name != "install"}
    assert command["encoder"][command["encoder"].index("--model") + 1] == "ViT-B-16-SigLIP"
    assert "--random-weights" in command["encoder"] and "cuda_graphs=false" in command["encoder"]
    assert "cuda_graphs=true" in command["encoder-graphs"]
    served = command["served"]
    assert command["served-ingress-1"][:len(served) - 2] == served[:-2] and "ingress_replicas=1" in command[
        "served-ingress-1"] and "device_jpeg_decode=true" in command["served-nvjpeg"]
    assert not any("ingress_replicas" in part for part in served)  # the defaults: auto
    # The host ceiling: no model, at the top concurrency, with the replica counts the served step used.
    (tmp_path / "served.json").write_text('{"replicas": 1, "ingress_replicas": 7}')
    ceiling = steps["host-ceiling"].command(tmp_path)
    assert "zeros-no-model" in ceiling and "ingress_replicas=7" in ceiling
    assert ceiling[ceiling.index("--replicas") + 1] == "1"
    assert ceiling[ceiling.index("--concurrency") + 1] == "32"
    assert ceiling[ceiling.index("--requests") + 1] == "500" and "text_replicas=0" in ceiling
    assert ceiling[ceiling.index("--skip") + 1] == "encoder,preprocess,host-ceiling"  # bench's own ceiling off
    assert ceiling[ceiling.index("--json") + 1] == "host-ceiling.json"
    # The client processes: bench's auto rule unless given, the same for every served step and the ceiling.
    for name in ("served", "served-ingress-1", "served-nvjpeg", "host-ceiling"):
        assert command[name][command[name].index("--client-processes") + 1] == "auto"
        given = plan("--client-processes", "4")[name].command(tmp_path)
        assert given[given.index("--client-processes") + 1] == "4"
    with pytest.raises(SystemExit):
        plan("--client-processes", "0")
    (tmp_path / "served.json").unlink()  # the served step failed: bench's own counts, not a stale file's
    assert "--replicas" not in steps["host-ceiling"].command(tmp_path)
    cpu = plan("--backend", "cpu", "--model", "tiny-siglip")
    assert cpu["encoder-graphs"].skip_if() == "backend cpu has no CUDA graphs"
    assert cpu["served-nvjpeg"].skip_if() is None
    assert "--random-weights" not in cpu["encoder"].command(tmp_path)


def test_verdict_and_ratio_from_the_figures() -> None:
    def passed(name: str, ips: float, **more: object) -> StepResult:
        return StepResult(name, name, "passed", figures={"images_per_second": ips, **more})

    results = {"encoder": passed("encoder", 1000.0), "served": passed("served", 200.0, replicas=1),
               "host-ceiling": passed("host-ceiling", 400.0)}
    verdict, ratio = device_check.derived(results, on_host_cores=False)
    assert verdict.status == "passed" and verdict.figures["verdict"] == "host-bound"
    assert verdict.figures["served_over_limit"] == 0.5 and ratio.figures["served_over_bare"] == 0.2
    results["host-ceiling"] = StepResult("host-ceiling", "", "timeout")
    verdict, ratio = device_check.derived(results, on_host_cores=False)
    assert verdict.status == "skipped" and "host-ceiling" in (verdict.error or "") and ratio.status == "passed"
    assert verdict.error == "needs host-ceiling (timeout)"


def test_a_busy_client_at_either_top_level_makes_the_verdict_client_bound() -> None:
    def passed(name: str, ips: float, **more: object) -> StepResult:
        return StepResult(name, name, "passed", figures={"images_per_second": ips, **more})

    for served_busiest, ceiling_busiest in ((0.97, 0.5), (0.4, 0.9)):
        results = {"encoder": passed("encoder", 1328.0),
                   "served": passed("served", 190.0, replicas=1, client_processes=1,
                                    client_busiest_core_fraction=served_busiest),
                   "host-ceiling": passed("host-ceiling", 195.0, client_processes=1,
                                          client_busiest_core_fraction=ceiling_busiest)}
        verdict, _ = device_check.derived(results, on_host_cores=False)
        assert verdict.figures["verdict"] == "client-bound"
        assert verdict.figures["detail"].startswith("client-bound: raise --client-processes")
        assert verdict.figures["client_busiest_core_fraction"] == max(served_busiest, ceiling_busiest)
        row = next(line for line in device_check.table(list(results.values())) if line.startswith("| served |"))
        assert f"| 1 proc, busiest {served_busiest:.2f} core |" in row
    results["host-ceiling"].figures["client_busiest_core_fraction"] = 0.5
    results["served"].figures["client_busiest_core_fraction"] = 0.5
    assert device_check.derived(results, on_host_cores=False)[0].figures["verdict"] == "host-bound"


def test_the_verdict_from_the_files_bench_writes(tmp_path: Path) -> None:
    """The chain the CPU rehearsal no longer runs end to end (it skips the host ceiling): bench's result files,
    written by its own models, read by each step's figures, judged by measure/bound.py."""
    from siglip_serve.measure.results import (
        BenchResult,
        ClientCpu,
        CpuMsByKind,
        EncoderRow,
        Machine,
        ServedRow,
        ServerCpuResult,
    )

    def bench(name: str, **parts: object) -> None:
        BenchResult(machine=Machine(host="h"), model="tiny-siglip", backend="cpu", weights="random", buckets=[1, 8],
                    created_at="2026-11-27T00:00:00Z", **parts).write(tmp_path / name)  # type: ignore[arg-type]

    def served(ips: float, cpu_ms: float) -> list[ServedRow]:
        cpu = ServerCpuResult(ms_per_image=cpu_ms, ms_per_image_by_kind=CpuMsByKind(), seconds=3.0, processes=9)
        client = ClientCpu(client_processes=2, processes=3, seconds=1.5, busiest_process_core_fraction=0.4)
        return [ServedRow(concurrency=c, requests=100, failures=0, images_per_request=1, images_per_second=ips * f,
                          latency_p50_ms=4.0 * c, latency_p99_ms=9.0 * c, server_cpu=cpu, client_cpu=client)
                for c, f in ((1, 0.5), (32, 1))]

    bench("encoder.json", encoder=[
        EncoderRow(bucket=b, images_per_second=ips, latency_mean_ms=1.0, latency_p50_ms=1.0, latency_p99_ms=2.0,
                   warmup=1, iterations=3) for b, ips in ((1, 300.0), (8, 900.0))])
    bench("served.json", served=served(120.0, 6.0), replicas=1, ingress_replicas=4)
    bench("host-ceiling.json", served=served(150.0, 5.0), replicas=1, ingress_replicas=4)
    results = {}
    for name, after in (("encoder", device_check.encoder_figures("encoder.json")),
                        ("served", device_check.served_figures("served.json")),
                        ("host-ceiling", device_check.served_figures("host-ceiling.json"))):
        figures = after(tmp_path)
        assert isinstance(figures, dict), figures
        results[name] = StepResult(name, name, "passed", figures=figures)
    assert results["encoder"].figures["best_bucket"] == 8 and results["served"].figures["cpu_ms_per_image"] == 6.0
    assert results["served"].figures["client_processes"] == 2
    assert results["host-ceiling"].figures["client_busiest_core_fraction"] == 0.4
    verdict, ratio = device_check.derived(results, on_host_cores=False)
    # The ceiling (150) is under the device's 900: host-bound, served at 120 / 150 of it.
    assert verdict.status == "passed" and verdict.figures["verdict"] == "host-bound"
    assert verdict.figures["host_ceiling_images_per_second"] == 150.0
    assert verdict.figures["served_over_limit"] == pytest.approx(0.8)
    assert verdict.figures["client_busiest_core_fraction"] == 0.4  # under a core: the ceilings decide
    assert ratio.figures["served_over_bare"] == pytest.approx(120.0 / 900.0)
