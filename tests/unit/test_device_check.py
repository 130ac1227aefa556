"""The device check's runner and plan (siglip_serve.measure.device_check), with stub steps: a failure or a
timeout is recorded with its error and the next step still runs; the budget bounds every step; the served
variants differ from the defaults by their one setting; the best-bucket and lanes steps read what the steps
before them wrote; the verdict, the ratio and the price come from the figures (measure/device_figures.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from siglip_serve.measure import device_check, device_figures
from siglip_serve.measure.device_steps import Step, StepResult, run_step
from siglip_serve.measure.prices import Price


def py(code: str) -> Step:
    return Step(code[:12], code, lambda out: [sys.executable, "-c", code], 30)


def test_failure_and_timeout_are_recorded_and_the_next_step_runs(tmp_path: Path) -> None:
    deadline = time.monotonic() + 60
    steps = [py("import sys; print('broken'); sys.exit(3)"),
             Step("slow", "sleeps", lambda out: [sys.executable, "-c", "import time; time.sleep(30)"], 1),
             Step("ok", "writes", lambda out: [sys.executable, "-c", "open('x.json', 'w').write('{}')"], 30,
                  after=lambda out: {"images_per_second": 5.0} if (out / "x.json").exists() else "no x.json"),
             Step("bad-output", "exits 0, no file", lambda out: [sys.executable, "-c", "pass"], 30,
                  after=lambda out: device_figures.read(out, "missing.json"))]
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


STEPS = ["install", "probe", "pytest-cuda", "encoder", "encoder-graphs", "determinism", "served", "host-ceiling",
         "served-nvjpeg", "served-best-bucket", "lanes", "lanes-interactive-encoder", "served-ingress-1"]


def test_the_plan_in_order_and_what_each_variant_changes(tmp_path: Path) -> None:
    steps = plan("--wheels", str(tmp_path))
    assert list(steps) == STEPS
    (tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl").touch()
    install = plan("--wheels", str(tmp_path))["install"].command(tmp_path)
    assert {"--no-index", "--no-deps"} <= set(install) and install[-2:] == ["-e", str(device_check.ROOT)]
    assert str(tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl") in install
    command = {name: steps[name].command(tmp_path) for name in steps if name not in ("install", "served-best-bucket")}
    assert command["encoder"][command["encoder"].index("--model") + 1] == "ViT-B-16-SigLIP"
    assert "--random-weights" in command["encoder"] and "cuda_graphs=false" in command["encoder"]
    assert "cuda_graphs=true" in command["encoder-graphs"]
    determinism = command["determinism"]
    assert determinism[determinism.index("determinism") - 1:determinism.index("determinism") + 1] == [
        "siglip_serve", "determinism"] and "--random-weights" in determinism
    assert determinism[determinism.index("--json") + 1] == "determinism.json" and "--buckets" not in determinism
    # The bare encoder runs past the model's buckets (1-8) on a GPU; the served default serves the model's own.
    for name in ("encoder", "encoder-graphs"):
        assert command[name][command[name].index("--buckets") + 1] == "1,8,16,32"
    served = command["served"]
    assert "--buckets" not in served and served[served.index("--concurrency") + 1] == "32,128"
    assert served[served.index("--requests") + 1] == "1000"
    assert command["served-ingress-1"][:len(served) - 2] == served[:-2] and "ingress_replicas=1" in command[
        "served-ingress-1"]
    # nvJPEG with CUDA graphs on, said on its command line, at the served levels.
    nvjpeg = command["served-nvjpeg"]
    assert nvjpeg[:len(served) - 2] == served[:-2] and {"device_jpeg_decode=true", "cuda_graphs=true"} <= set(nvjpeg)
    assert not any("ingress_replicas" in part for part in served)  # the defaults: auto
    # The host ceiling: no model, at the top concurrency, with the replica counts the served step used.
    (tmp_path / "served.json").write_text('{"replicas": 1, "ingress_replicas": 7}')
    ceiling = steps["host-ceiling"].command(tmp_path)
    assert "zeros-no-model" in ceiling and "ingress_replicas=7" in ceiling
    assert ceiling[ceiling.index("--replicas") + 1] == "1"
    assert ceiling[ceiling.index("--concurrency") + 1] == "128"
    assert ceiling[ceiling.index("--requests") + 1] == "1000" and "text_replicas=0" in ceiling
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
    assert cpu["encoder-graphs"].skip_if(tmp_path) == "backend cpu has no CUDA graphs"
    assert cpu["served-nvjpeg"].skip_if(tmp_path) is None
    assert "--random-weights" not in cpu["encoder"].command(tmp_path)
    # The rehearsal keeps the model's small buckets and has no graphs to ask for.
    assert "--buckets" not in cpu["encoder"].command(tmp_path)
    assert not any("cuda_graphs" in part for part in cpu["served-nvjpeg"].command(tmp_path))


def encoder_json(out: Path, name: str, by_bucket: dict[int, float]) -> None:
    from siglip_serve.measure.results import BenchResult, EncoderRow, Machine

    BenchResult(machine=Machine(host="h"), model="m", backend="cuda", weights="random", buckets=list(by_bucket),
                created_at="2026-12-05T00:00:00Z", encoder=[
                    EncoderRow(bucket=b, images_per_second=ips, latency_mean_ms=1.0, latency_p50_ms=1.0,
                               latency_p99_ms=2.0, warmup=1, iterations=3) for b, ips in by_bucket.items()],
                ).write(out / name)


def test_the_best_bucket_step_serves_the_buckets_up_to_the_served_encoders_best(tmp_path: Path) -> None:
    gpu, cpu = plan(), plan("--backend", "cpu", "--model", "tiny-siglip")
    # Nothing to read yet: the step fails naming the step that writes its input.
    with pytest.raises(ValueError, match="needs encoder-graphs.json, which the encoder-graphs step writes"):
        gpu["served-best-bucket"].command(tmp_path)
    # On cuda the served default captures graphs: the graphed encoder's best bucket, not the eager one's.
    encoder_json(tmp_path, "encoder.json", {1: 100.0, 8: 900.0, 16: 950.0, 32: 1000.0})
    encoder_json(tmp_path, "encoder-graphs.json", {1: 700.0, 8: 3600.0, 16: 3900.0, 32: 3800.0})
    command = gpu["served-best-bucket"].command(tmp_path)
    assert command[command.index("--buckets") + 1] == "1,8,16" and "cuda_graphs=true" in command
    assert command[:len(gpu["served"].command(tmp_path)) - 2] == gpu["served"].command(tmp_path)[:-2]
    assert command[-2:] == ["--json", "served-best-bucket.json"]
    # On cpu (no graphs) the eager encoder's.
    command = cpu["served-best-bucket"].command(tmp_path)
    assert command[command.index("--buckets") + 1] == "1,8,16,32"


def served_json(out: Path, by_concurrency: dict[int, float], client_processes: int) -> None:
    rows = [{"concurrency": c, "images_per_second": ips, "failures": 0, "latency_p50_ms": 1.0, "latency_p99_ms": 2.0,
             "client_cpu": {"client_processes": client_processes}} for c, ips in by_concurrency.items()]
    (out / "served.json").write_text(json.dumps({"served": rows, "replicas": 1, "ingress_replicas": 6}))


def test_the_lanes_steps_load_the_service_as_the_served_steps_best_level(tmp_path: Path) -> None:
    steps = plan()
    # No served.json (the served step failed, or was skipped): the top level and the client processes given.
    command = steps["lanes"].command(tmp_path)
    assert command[2] == "siglip_serve.measure.lanes_service" and command[command.index("--json") + 1] == "lanes.json"
    assert command[command.index("--bulk-clients") + 1] == "128" and command[command.index("--large-clients") + 1] \
        == "128" and command[command.index("--client-processes") + 1] == "auto"
    assert command[command.index("--endpoint") + 1] == "raw"  # the served step's bodies: raw JPEG bytes
    assert command[command.index("--seconds") + 1] == "6" and "--interactive-encoder" not in command
    assert "--random-weights" in command and command[command.index("--model") + 1] == "ViT-B-16-SigLIP"
    # The served step's best level and its client processes, where it wrote them.
    served_json(tmp_path, {32: 500.0, 128: 950.0, 256: 940.0}, client_processes=4)
    command = steps["lanes"].command(tmp_path)
    assert command[command.index("--bulk-clients") + 1] == "128" and command[command.index("--client-processes") +
                                                                              1] == "4"
    kept = steps["lanes-interactive-encoder"].command(tmp_path)
    assert "--interactive-encoder" in kept and kept[kept.index("--windows") + 1] == "interactive-alone,bulk-alone,mixed"
    assert kept[kept.index("--json") + 1] == "lanes-interactive-encoder.json"
    # Each cuda replica holds a whole GPU: with one, the kept replica and another cannot both run.
    assert steps["lanes-interactive-encoder"].skip_if(tmp_path) is None  # no probe: tried (run refuses at once)
    (tmp_path / "probe.json").write_text('{"gpus": 1}')
    assert "the probe found 1" in (steps["lanes-interactive-encoder"].skip_if(tmp_path) or "")
    (tmp_path / "probe.json").write_text('{"gpus": 2}')
    assert steps["lanes-interactive-encoder"].skip_if(tmp_path) is None
    assert plan("--backend", "cpu", "--model", "tiny-siglip")["lanes-interactive-encoder"].skip_if(tmp_path) is None


def test_the_lanes_figures_and_the_backfills_share_of_the_served_ceiling(tmp_path: Path) -> None:
    def row(name: str, rps: float, p50: float, p99: float) -> dict[str, object]:
        return {"name": name, "clients": 2, "answered": int(rps * 8), "failures": 0, "seconds": 8.0,
                "requests_per_second": rps, "p50_ms": p50, "p99_ms": p99}

    windows = {"interactive-alone": [row("interactive", 150.0, 10.0, 20.0)], "bulk-alone": [row("bulk", 900.0, 1, 2)],
               "mixed": [row("interactive", 40.0, 30.0, 60.0), row("bulk", 850.0, 1, 2)]}
    ratios = {"interactive_p99_beside_bulk_over_alone": 3.0, "bulk_kept_of_alone_minus_interactive": 0.99,
              "small_tenant_p99_beside_large_over_alone": None, "large_tenant_requests_per_second": None}
    (tmp_path / "lanes.json").write_text(json.dumps({
        "windows": windows, "ratios": ratios, "bulk_clients": 128, "client_processes": 4, "interactive_encoder": False,
        "server_cpu": {"bulk-alone": {"ms_per_image": 10.5}}}))
    after = device_figures.lanes_figures("lanes.json")
    figures = after(tmp_path)
    assert isinstance(figures, dict) and figures["backfill_of_served"] is None  # no served step to hold it against
    served_json(tmp_path, {32: 500.0, 128: 1000.0}, client_processes=4)
    figures = after(tmp_path)
    assert isinstance(figures, dict)
    assert figures["images_per_second"] == 900.0 and figures["backfill_of_served"] == 0.9
    assert (figures["latency_p50_ms"], figures["latency_p99_ms"]) == (30.0, 60.0)  # interactive, beside the backfill
    assert figures["interactive_p99_beside_bulk_over_alone"] == 3.0 and figures["cpu_ms_per_image"] == 10.5
    assert figures["detail"] == ("interactive p99 beside/alone 3.0; backfill kept 0.99; backfill 128 clients x 4 "
                                 "proc, 0.9 of served's img/s")
    windows["bulk-alone"] = [{**row("bulk", 0.0, 0, 0), "answered": 0, "failures": 7}]
    (tmp_path / "lanes.json").write_text(json.dumps({"windows": windows, "ratios": ratios}))
    assert after(tmp_path) == "lanes.json: the backfill alone got no answer (7 failed)"


def test_skip_names_only_steps_there_are() -> None:
    assert device_check.skipped("install, lanes,price") == {"install", "lanes", "price"}
    with pytest.raises(argparse.ArgumentTypeError, match="no step lane; the steps: install, probe"):
        device_check.skipped("install,lane")
    assert device_check.main(["--out", "x", "--skip", "lane"]) == 2


def test_the_default_gpu_plans_timeouts() -> None:
    """What the default GPU run may take at most, step by step; docs/dev/accelerator-check.md's table."""
    timeouts = {name: step.timeout_s for name, step in plan().items()}
    assert list(timeouts) == STEPS and all(t > 0 for t in timeouts.values())
    scaled = {name: step.timeout_s for name, step in plan("--timeout-scale", "2").items()}
    assert scaled == {name: 2 * t for name, t in timeouts.items()}


def test_verdict_and_ratio_from_the_figures() -> None:
    def passed(name: str, ips: float, **more: object) -> StepResult:
        return StepResult(name, name, "passed", figures={"images_per_second": ips, **more})

    results = {"encoder": passed("encoder", 1000.0), "served": passed("served", 200.0, replicas=1),
               "host-ceiling": passed("host-ceiling", 400.0)}
    verdict, ratio = device_figures.derived(results, on_host_cores=False)
    assert verdict.status == "passed" and verdict.figures["verdict"] == "host-bound"
    assert verdict.figures["served_over_limit"] == 0.5 and ratio.figures["served_over_bare"] == 0.2
    results["host-ceiling"] = StepResult("host-ceiling", "", "timeout")
    verdict, ratio = device_figures.derived(results, on_host_cores=False)
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
        verdict, _ = device_figures.derived(results, on_host_cores=False)
        assert verdict.figures["verdict"] == "client-bound"
        assert verdict.figures["detail"].startswith("client-bound: raise --client-processes")
        assert verdict.figures["client_busiest_core_fraction"] == max(served_busiest, ceiling_busiest)
        row = next(line for line in device_figures.table(list(results.values())) if line.startswith("| served |"))
        assert f"| 1 proc, busiest {served_busiest:.2f} core |" in row
    results["host-ceiling"].figures["client_busiest_core_fraction"] = 0.5
    results["served"].figures["client_busiest_core_fraction"] = 0.5
    assert device_figures.derived(results, on_host_cores=False)[0].figures["verdict"] == "host-bound"


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
    for name, after in (("encoder", device_figures.encoder_figures("encoder.json")),
                        ("served", device_figures.served_figures("served.json")),
                        ("host-ceiling", device_figures.served_figures("host-ceiling.json"))):
        figures = after(tmp_path)
        assert isinstance(figures, dict), figures
        results[name] = StepResult(name, name, "passed", figures=figures)
    assert results["encoder"].figures["best_bucket"] == 8 and results["served"].figures["cpu_ms_per_image"] == 6.0
    assert results["served"].figures["client_processes"] == 2
    assert results["host-ceiling"].figures["client_busiest_core_fraction"] == 0.4
    verdict, ratio = device_figures.derived(results, on_host_cores=False)
    # The ceiling (150) is under the device's 900: host-bound, served at 120 / 150 of it.
    assert verdict.status == "passed" and verdict.figures["verdict"] == "host-bound"
    assert verdict.figures["host_ceiling_images_per_second"] == 150.0
    assert verdict.figures["served_over_limit"] == pytest.approx(0.8)
    assert verdict.figures["client_busiest_core_fraction"] == 0.4  # under a core: the ceilings decide
    assert ratio.figures["served_over_bare"] == pytest.approx(120.0 / 900.0)


def test_the_price_step_prices_the_served_steps_and_the_bare_encoder_for_the_instance() -> None:
    def passed(name: str, ips: float, **more: object) -> StepResult:
        return StepResult(name, name, "passed", figures={"images_per_second": ips, **more})

    results = {"encoder-graphs": passed("encoder-graphs", 3600.0, best_bucket=16),
               "served": passed("served", 1000.0), "served-nvjpeg": passed("served-nvjpeg", 1200.0),
               "served-ingress-1": StepResult("served-ingress-1", "", "failed"),
               "host-ceiling": passed("host-ceiling", 1100.0)}
    unpriced = device_figures.priced(results, None, "encoder-graphs")
    assert unpriced.status == "skipped" and "--price-per-hour" in (unpriced.error or "")
    assert "shared/seeds/" in (unpriced.error or "")  # what would fill the empty table
    assert not any("usd_per_million_images" in r.figures for r in results.values())
    step = device_figures.priced(results, Price(usd_per_hour=36.0, accelerators=8), "encoder-graphs")
    # $36 an hour over 1,000 images a second: 36 / 3.6 M images = $10 per million.
    assert results["served"].figures["usd_per_million_images"] == pytest.approx(10.0)
    assert results["served-nvjpeg"].figures["usd_per_million_images"] == pytest.approx(36.0 / (1200 * 3600) * 1e6)
    assert "usd_per_million_images" not in results["served-ingress-1"].figures  # it did not pass
    assert "usd_per_million_images" not in results["host-ceiling"].figures  # no service: the path without a model
    # The bare best bucket: 3,600 per GPU x 8 GPUs, but the host carries 1,100: priced at what it carries.
    assert step.status == "passed" and step.figures["images_per_second"] == 1100.0
    assert step.figures["bare"]["capped_by_host_ceiling"] and step.figures["bare"]["bucket"] == 16
    assert step.figures["usd_per_million_images"] == pytest.approx(36.0 / (1100 * 3600) * 1e6)
    row = next(line for line in device_figures.table(list(results.values())) if line.startswith("| served |"))
    assert "| $10.00 |" in row
    # No host ceiling measured: the accelerators' sum, uncapped.
    results["host-ceiling"] = StepResult("host-ceiling", "", "timeout")
    step = device_figures.priced(results, Price(usd_per_hour=36.0, accelerators=8), "encoder-graphs")
    assert step.figures["images_per_second"] == 8 * 3600.0 and not step.figures["bare"]["capped_by_host_ceiling"]
    # Without the bare step the served steps are still priced, and the step says what it lacked.
    del results["encoder-graphs"]
    step = device_figures.priced(results, Price(usd_per_hour=36.0), "encoder-graphs")
    assert step.status == "skipped" and step.error == "served steps priced; the bare encoder needs encoder-graphs " \
                                                      "(not run)"


def test_the_checks_own_code_runs_before_the_projects_dependencies_are_installed() -> None:
    """On a fresh device machine the check must start, and record why steps fail, with the standard library."""
    code = ("import sys\n"
            "for name in ('pydantic', 'numpy', 'torch', 'ray', 'httpx', 'psutil', 'yaml'): sys.modules[name] = None\n"
            "from siglip_serve.measure import device_check\n"
            "print(len(device_check.plan(device_check.build_parser().parse_args(['--out', '.', '--wheels', '.']))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout) == len(STEPS)


def test_the_determinism_step_rehearsed_on_cpu(tmp_path: Path) -> None:
    """The step's own command on the cpu backend with tiny-siglip, as the rehearsal runs it: every comparison
    bit-equal with deterministic: true, and the table's figures read from its JSON."""
    step = plan("--backend", "cpu", "--model", "tiny-siglip")["determinism"]
    assert "--random-weights" not in step.command(tmp_path)
    result = run_step(step, tmp_path, time.monotonic() + 600, frozenset(), {}, echo=lambda line: None)
    assert result.status == "passed", result.error
    equal, total = result.figures["deterministic_bit_equal"].split("/")
    assert equal == total and int(total) > 10 and result.figures["deterministic_max_abs_diff"] == 0.0
    assert "configured_bit_equal" in result.figures and result.figures["detail"].startswith("configured: ")
