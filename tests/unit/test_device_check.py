"""The device check's runner and plan (siglip_serve.measure.device_check), with stub steps: a failure or a
timeout is recorded with its error and the next step still runs; the budget bounds every step; the served
variants differ from the defaults by their one setting; the verdict and the ratio come from the figures."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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
