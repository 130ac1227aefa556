"""`siglip-serve trn2-check`: the first-contact command, its steps, summary and failure handling.

Here there is no Neuron SDK: the trace line runs through the torch_neuronx test double
(tests/doubles), which proves the orchestration (each step a real subprocess of the real command,
what is skipped and why, the summary, what a failure does to the steps after it) but not that the
Neuron compiler, runtime or a NeuronCore do anything. `test_trn2_check_on_a_real_trn2` does that.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from siglip_serve.launcher import trn2_check, trn2_probes, trn2_report, trn2_steps
from siglip_serve.launcher.trn2_check import Run, Step, run_step, write_summary
from tests.bounds import TIME_SCALE, cluster_start
from tests.helpers import DOUBLES, PLACEHOLDER, REPO

pytestmark = pytest.mark.own_cluster

PY = sys.executable


def statuses(summary: dict) -> dict[str, tuple[str, str | None]]:
    return {s["name"]: (s["status"], s["reason"]) for s in summary["steps"]}


def test_without_the_sdk_every_neuron_step_is_skipped_with_its_reason(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # PyPI's placeholder first on the path: "no SDK" here and on a trn2 alike.
    monkeypatch.setenv("PYTHONPATH", str(PLACEHOLDER))
    assert trn2_check.main(["--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    got = statuses(summary)
    assert got["versions"] == ("passed", None)
    versions = json.loads((tmp_path / "versions.json").read_text())
    assert "WRONG PACKAGE" in versions["sdk_import_error"] and versions["line"] is None
    assert versions["versions"]["torch"] and versions["lnc"] in (1, 2)
    for line in ("trace", "native"):
        status, reason = got[f"compile-{line}"]
        assert status == "skipped" and f"the {line} line" in reason and "not installed" in reason
        for step in ("accuracy", "determinism", "serve", "multicore"):
            assert got[f"{step}-{line}"] == ("skipped", f"needs compile-{line}, which was skipped")
        assert got[f"report-{line}"] == ("skipped", f"needs multicore-{line}, which was skipped")
    assert summary["ok"] and summary["lines"] == {}
    md = (tmp_path / "summary.md").read_text()
    assert "## What to send back" in md and "- `versions.json`" in md and "- `logs/versions.log`" in md
    assert "SKIPPED" in md and "images/" not in md


def test_steps_fail_time_out_and_skip_what_needs_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trn2_check, "HEARTBEAT_S", 0.3)
    run = Run(tmp_path, [PY])
    steps = [
        Step("ok", "prints", lambda r: [PY, "-c", "print('hello')"], 60, outputs=("absent.json",)),
        Step("boom", "fails", lambda r: [PY, "-c", "import sys; print('the thing broke', file=sys.stderr); "
                                             "sys.exit(3)"], 60),
        Step("slow", "hangs", lambda r: [PY, "-c", "import time; print('pid', flush=True); time.sleep(120)"], 1.5),
        Step("after-boom", "needs boom", lambda r: [PY, "-c", "pass"], 60, needs=("boom",)),
        Step("after-slow", "needs slow", lambda r: [PY, "-c", "pass"], 60, needs=("slow",)),
        Step("checked", "runs but its output is wrong", lambda r: [PY, "-c", "print('42')"], 60,
             after=lambda r, stdout: None if stdout.read_text().strip() == "43" else "printed the wrong answer"),
    ]
    echoed: list[str] = []
    for i, step in enumerate(steps, start=1):
        run.results[step.name] = run_step(step, run, i, len(steps), echoed.append)
    got = {name: (r.status, r.returncode, r.reason) for name, r in run.results.items()}
    assert got["ok"] == ("passed", 0, None) and run.results["ok"].outputs == []
    assert (tmp_path / "logs" / "ok.stdout").read_text() == "hello\n"
    assert got["boom"][:2] == ("failed", 3) and "exit code 3" in got["boom"][2] and "the thing broke" in got["boom"][2]
    assert got["slow"] == ("timeout", None, "no result within 2 s; stopped")
    assert got["after-boom"] == ("skipped", None, "needs boom, which failed")
    assert got["after-slow"] == ("skipped", None, "needs slow, which timed out")
    assert got["checked"] == ("failed", 0, "printed the wrong answer")
    # Progress: one line per step, a heartbeat while the slow one ran, and each outcome.
    assert echoed[0].startswith("[1/6] prints (timeout 60 s; log logs/ok.log)")
    assert any("still running" in line for line in echoed) and any("timeout in" in line for line in echoed)
    summary = write_summary(run, "start")
    assert not summary["ok"] and summary["counts"] == {"passed": 1, "failed": 2, "timeout": 1, "skipped": 2}
    md = (tmp_path / "summary.md").read_text()
    assert "| fails | FAILED |" in md and "| hangs | TIMEOUT |" in md and "`logs/boom.log`" in md


@pytest.mark.timeout(900)  # six subprocesses, each importing torch, one starting Ray: minutes on 2 cores
def test_the_trace_line_end_to_end_through_the_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of the trace line runs its real command (compile, accuracy, `siglip-serve run` under
    its own Ray, the multi-core bench, the report), on the trace double instead of the SDK."""
    monkeypatch.setenv("PYTHONPATH", f"{DOUBLES}{os.pathsep}{REPO}")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    with cluster_start("trn2-check's trace line"):  # its serve step starts a Ray, among other heavy steps
        assert trn2_check.main(["--out", str(tmp_path), "--cores", "2", "--iterations", "5",
                                "--timeout-scale", str(TIME_SCALE)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    got = statuses(summary)
    for step in ("versions", "compile-trace", "accuracy-trace", "determinism-trace", "serve-trace", "multicore-trace",
                 "report-trace"):
        assert got[step] == ("passed", None), (step, got[step])
    assert got["compile-native"][0] == "skipped" and summary["lines"] == {"trace": PY}
    accuracy = json.loads((tmp_path / "accuracy-trace.json").read_text())
    assert accuracy["passed"] and accuracy["b"]["backend"] == "neuron" and accuracy["images"] == 4
    served = json.loads((tmp_path / "serve-trace.json").read_text())
    assert served["embedding_dim"] == 64 and served["embedding_norm"] == pytest.approx(1.0, abs=1e-4)
    multicore = json.loads((tmp_path / "multicore-trace.json").read_text())
    assert multicore["backend"] == "neuron" and multicore["lnc"] == 2 and len(multicore["workers"]) == 2
    assert "Instance throughput" in (tmp_path / "report-trace" / "report.md").read_text()
    sent = (tmp_path / "summary.md").read_text()
    assert "`multicore-trace.json`" in sent and "`report-trace/report.md`" in sent and "artifacts-trace/" not in sent
    # What comes back besides: pip freeze, the cosine, each replica's warm-up, where the NEFFs landed.
    assert "`pip-freeze-1.txt`" in sent and "torch==" in (tmp_path / "pip-freeze-1.txt").read_text()
    found = summary["found"]
    assert found["cosines"]["trace"]["cosine_min"] == accuracy["cosine_min"] and found["cosines"]["native"] is None
    (replica,) = found["warm_starts"]["trace"]["replicas"]
    assert set(replica["warmup_seconds"]) == {"1", "2"}
    assert "## Only hardware can tell" in sent and "`report.json`" in sent


def test_a_refused_lnc_fails_the_steps_that_load_and_the_rest_go_on(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid NEURON_LOGICAL_NC_CONFIG: the compile (given --lnc) still runs, every step that loads
    the artifact fails with the runtime's refusal, and the run goes on to the end."""
    monkeypatch.setenv("PYTHONPATH", f"{DOUBLES}{os.pathsep}{REPO}")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    with cluster_start("trn2-check with a refused LNC"):
        assert trn2_check.main(["--out", str(tmp_path), "--skip", "multicore-trace",
                                "--timeout-scale", str(TIME_SCALE)]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    got = statuses(summary)
    assert got["versions"][0] == "failed" and "not a valid LNC" in got["versions"][1]
    assert got["compile-trace"] == ("passed", None)
    loading = ("accuracy-trace", "determinism-trace", "serve-trace")
    for step in loading:
        assert got[step][0] == "failed" and "exit code" in got[step][1], got[step]
    assert "not a valid LNC" in (tmp_path / "logs" / "accuracy-trace.log").read_text()
    assert got["report-trace"] == ("skipped", "needs multicore-trace, which was skipped")
    assert not summary["ok"] and summary["counts"]["failed"] == 1 + len(loading)  # the versions step and each load
    assert "| serve it and embed a photo (trace line) | FAILED |" in (tmp_path / "summary.md").read_text()


def test_a_native_accuracy_run_starts_with_the_artifacts_environment(tmp_path: Path) -> None:
    """The environment the accuracy step's child process sees at its first line, before anything
    it could import: the artifact's whole recipe and NEFF cache, and one core."""
    artifact = tmp_path / "artifacts-native" / "tiny"
    artifact.mkdir(parents=True)
    recipe = {"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_COMPILER_OPT_LEVEL": "-O3",
              "NEURON_CC_FLAGS": "--target trn2 --lnc 2 --auto-cast=matmult --auto-cast-type=bf16"}
    (artifact / "manifest.json").write_text(json.dumps({"line": "neuron-native", "recipe_env": recipe}))
    # Stands in for the native venv's python: records its environment and arguments, then exits.
    fake = tmp_path / "python"
    fake.write_text(f"#!{PY}\nimport json, os, sys\njson.dump({{'env': dict(os.environ), 'argv': sys.argv}}, "
                    f"open('child.json', 'w'))\n")
    fake.chmod(0o755)
    run = Run(tmp_path, [PY], lines={"native": str(fake)}, artifacts={"native": str(artifact)})
    run.results["compile-native"] = trn2_check.StepResult("compile-native", "compile", "passed")
    (step,) = [s for s in trn2_check.line_steps("native", 1.0, 1) if s.name == "accuracy-native"]
    assert run_step(step, run, 1, 1, echo=lambda _: None).status == "passed"
    child = json.loads((tmp_path / "child.json").read_text())
    want = {**recipe, "TORCH_NEURONX_NEFF_CACHE_DIR": str(artifact.resolve() / "neff"), "NEURON_RT_VISIBLE_CORES": "0"}
    assert {k: child["env"].get(k) for k in want} == want
    assert f"backend=neuron-native,artifact_dir={artifact},buckets=1" in child["argv"]


def test_another_python_without_the_project_is_refused_in_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert trn2_check.main(["--out", str(tmp_path / "out"), "--python", "/bin/false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--python /bin/false: siglip-serve is not importable there" in err
    assert not (tmp_path / "out").exists()


def test_the_kernel_steps_run_in_the_line_found_and_skip_with_the_reason(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, B2/B6: the NeuronCore step runs `kernels check` in TorchNeuron's python, else the trace line's,
    each only with a usable nki, and says why when neither will do; the simulator step is pinned to trn2."""
    trace, native = "/venv-trace/bin/python", "/venv-native/bin/python"
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    steps = {s.name: s for s in trn2_check.plan(Run(tmp_path, [PY]))}
    neuron, simulator = steps["kernels-neuron"], steps["kernels-simulator"]
    run = Run(tmp_path, [PY, trace, native], nki={PY: (False, "nki is not installed")})
    assert neuron.skip_if(run) == (f"no Neuron line in {PY}, {trace}, {native}: neither the 2.31 trace line "
                                   f"(torch-neuronx 2.9 with torch-xla) nor TorchNeuron (torch-neuronx 2.13+) is "
                                   f"installed")
    assert simulator.skip_if(run).startswith(f"no usable nki ({PY}: nki is not installed;")
    run.lines = {"trace": trace, "native": native}
    run.nki.update({trace: (True, "nki 0.5.0"), native: (False, "nki is not installed")})
    assert neuron.skip_if(run) is None and neuron.command(run)[:1] == [trace]
    run.nki[native] = (True, "nki 0.7.0")
    assert neuron.command(run) == [native, "-m", "siglip_serve", "kernels", "check", "--kernels-on", "neuron",
                                   "--json", "kernels-neuron.json"]
    assert simulator.command(run)[0] == native and simulator.env == {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}
    assert simulator.title == "NKI kernels against the references (simulator, target trn2)"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # the user's target stands
    (user,) = [s for s in trn2_steps.kernel_steps(1.0) if s.name == "kernels-simulator"]
    assert user.env == {} and user.title.endswith("(simulator, target trn3)")


@pytest.mark.parametrize("listing, cores, error", [
    ([{"neuron_device": 0, "nc_count": 4}, {"neuron_device": 1, "nc_count": 4}], 8, None),
    ({"instance_type": "trn2.48xlarge", "logical_neuroncore_config": 2,
      "neuron_devices": [{"neuron_device": i, "nc_count": 4} for i in range(16)]}, 64, None),
    ({"neuron_device": 0, "nc_count": 4}, 4, None),
    ({"instance_type": "trn2.3xlarge"}, None,
     "neuron-ls --json-output gave no NeuronCore count (an object with keys ['instance_type'] and no device "
     "list); pass --cores N"),
], ids=["list", "object-48xlarge", "one-device", "no-devices"])
def test_neuron_ls_json_is_read_as_a_list_or_an_object_and_never_guessed(tmp_path: Path, listing: object,
                                                                        cores: int | None, error: str | None) -> None:
    """Issue 35, B9: a trn2.48xlarge has 64 logical cores at LNC=2, not 8 // LNC; no count means --cores."""
    (tmp_path / "neuron-ls.json").write_text(json.dumps(listing))
    run = Run(tmp_path, [PY], lnc=2, lines={"trace": PY})
    assert trn2_steps.count_cores(run, tmp_path / "stdout") == error and run.cores == cores
    (multicore,) = [s for s in trn2_steps.line_steps("trace", 1.0, 5) if s.name == "multicore-trace"]
    assert multicore.skip_if(run) == (None if cores else "no NeuronCore count (neuron-ls gave none); pass --cores N")


def test_stray_neffs_in_torchneurons_default_caches_are_reported(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, B5: TorchNeuron without its variables writes to `neff_cache` and the local tier `local_cache` in
    the temp directory; a NEFF there is one a compile wrote without the artifact's environment."""
    temp, out = tmp_path / "tmp", tmp_path / "out"
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "NEURON_COMPILE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    began = time.time()
    for neff in (temp / "neff_cache" / "ab" / "cd" / "abcd.neff", temp / "local_cache" / "ef.neff",
                 out / "artifacts-native" / "tiny" / "neff" / "12" / "34" / "1234.neff"):
        neff.parent.mkdir(parents=True)
        neff.write_bytes(b"neff")
    window = [(began, time.time() + 1)]  # the files were written during a compile step
    found = trn2_report.neff_files(out, window)
    assert {str(temp / "neff_cache"), str(temp / "local_cache")} <= set(found["outside_the_artifacts"])
    assert str(out.resolve()) not in found["outside_the_artifacts"]
    assert {f["path"] for f in found["files"]} >= {str(temp / "neff_cache" / "ab" / "cd" / "abcd.neff"),
                                                   str(temp / "local_cache" / "ef.neff")}
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "x.neff").parent.mkdir()
    (elsewhere / "x.neff").write_bytes(b"neff")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(elsewhere))  # the local tier's own variable
    assert str(elsewhere) in trn2_report.neff_files(out, window)["outside_the_artifacts"]


def test_only_neffs_the_steps_that_load_an_artifact_wrote_count_as_strays(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41, item 3: a NEFF older than the run is another run's, and the kernel steps, which run last,
    write to their own caches under DIR; only a file written into a default cache during a step that loads an
    artifact (compile, accuracy, serve, multi-core: each may compile what its artifact lacks) is
    reported. The steps here are real subprocesses of run_step, the kernel step with its real
    environment and a stand-in command that writes where a compile would: each cache variable it is given."""
    temp, out = tmp_path / "tmp", tmp_path / "out"
    # This machine's own /tmp and /var/tmp caches are not this test's.
    monkeypatch.setattr(trn2_report, "default_neff_caches", lambda: [temp / "neff_cache", temp / "local_cache"])
    monkeypatch.setattr(trn2_report, "DEFAULT_COMPILE_CACHE", str(temp / "neuron-compile-cache"))
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "NEURON_COMPILE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    old = temp / "neff_cache" / "00" / "old.neff"  # another run's, a day ago
    old.parent.mkdir(parents=True)
    old.write_bytes(b"neff")
    os.utime(old, (time.time() - 86400, time.time() - 86400))
    run = Run(out, [PY])
    out.mkdir()

    def writes(path: Path | str) -> list[str]:
        return [PY, "-c", f"import os, pathlib; p = pathlib.Path(os.path.expandvars({str(path)!r})); "
                          f"p.parent.mkdir(parents=True, exist_ok=True); p.write_bytes(b'neff')"]

    stray = temp / "neff_cache" / "ab" / "cd" / "stray.neff"
    bench_stray = temp / "local_cache" / "ef" / "bench.neff"
    artifact = out / "artifacts-native" / "tiny" / "neff" / "12" / "1234.neff"
    (kernels,) = [s for s in trn2_steps.kernel_steps(1.0) if s.name == "kernels-neuron"]
    caches = ("$NEURON_COMPILE_CACHE_URL/k1.neff", "$TORCH_NEURONX_NEFF_CACHE_DIR/k2.neff",
              "$TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/k3.neff")
    steps = [Step("compile-native", "compile", lambda r: writes(artifact), 60),
             Step("serve-native", "serve", lambda r: writes(stray), 60),
             Step("multicore-native", "bench", lambda r: writes(bench_stray), 60),
             dataclasses.replace(kernels, skip_if=lambda r: None,
                                 command=lambda r: [PY, "-c", "; ".join(writes(c)[2] for c in caches)])]
    for i, step in enumerate(steps, start=1):
        run.results[step.name] = run_step(step, run, i, len(steps), echo=lambda _: None)
    assert {r.status for r in run.results.values()} == {"passed"}
    kernel_cache = out.resolve() / "kernel-caches" / "neuron"
    assert sorted(p.name for p in kernel_cache.rglob("*.neff")) == ["k1.neff", "k2.neff", "k3.neff"]
    assert {p.parent.name for p in kernel_cache.rglob("*.neff")} == {"compile-cache", "neff", "local"}
    # Were the kernel step to write to a default cache after all, it is after the window: not counted.
    late = temp / "local_cache" / "late.neff"
    late.parent.mkdir(parents=True, exist_ok=True)
    late.write_bytes(b"neff")
    summary = write_summary(run, "start")
    found = json.loads((out / "report.json").read_text())["neff_files"]
    assert {f["path"] for f in found["files"]} == {str(stray), str(bench_stray), str(artifact.resolve())}
    assert found["outside_the_artifacts"] == [str(temp / "local_cache"), str(temp / "neff_cache")]
    assert found["not_written_during_the_steps"] == 2  # the old one and the late one; the kernels' not searched
    (answer,) = [a["answer"] for a in summary["found"]["hardware_answers"] if "NEFF cache layout" in a["question"]]
    assert answer == (f"1 NEFF file(s) under artifacts-native; NEFFs the artifact steps wrote outside "
                      f"the artifacts: {temp / 'local_cache'}, {temp / 'neff_cache'}")
    assert "kernel-caches/" not in (out / "summary.md").read_text()


def test_what_ray_makes_of_the_neuron_cores_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, B4: the versions probe records Ray's reading of NEURON_RT_VISIBLE_CORES beside the runtime's,
    and the summary says when a range leaves Ray with fewer cores than the runtime."""
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-1,4")
    view = trn2_probes.versions()["ray_neuron"]
    assert view["runtime_cores"] == [0, 1, 4] and view["ray_visible_ids"] == ["0-1", "4"]
    assert view["ray_sees_fewer_cores_than_the_runtime"] and "ray_detected_neuron_cores" in view
    (tmp_path / "versions.json").write_text(json.dumps({"ray_neuron": view}))
    answer = trn2_report.ray_answer(tmp_path)
    assert answer.startswith("NEURON_RT_VISIBLE_CORES=0-1,4; Ray reads ids ['0-1', '4']")
    assert answer.endswith("FEWER than the runtime's 3: a range, which `ray start` refuses")


@pytest.mark.neuron
def test_trn2_check_on_a_real_trn2(tmp_path: Path) -> None:
    """The whole first contact on the hardware: every installed line compiles, matches the CPU,
    serves, and runs the multi-core bench on every logical core."""
    code = trn2_check.main(["--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert code == 0 and summary["ok"], (tmp_path / "summary.md").read_text()
    got = statuses(summary)
    assert got["neuron-ls"][0] == got["neuron-ls-json"][0] == "passed"
    devices, _ = trn2_steps.neuron_ls_devices(json.loads((tmp_path / "neuron-ls.json").read_text()))
    assert summary["logical_cores"] == sum(d["nc_count"] for d in devices) >= 8 // summary["lnc"]
    for line in summary["lines"]:
        for step in ("compile", "accuracy", "serve", "multicore", "report"):
            assert got[f"{step}-{line}"][0] == "passed", (step, line, got[f"{step}-{line}"])


@pytest.mark.timeout(600)  # two subprocesses importing torch
def test_the_determinism_step_through_the_trace_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace line's compile and determinism steps, their real commands on the double: every comparison but the
    replica's (a NeuronCore held by one process) recorded for the compiled buckets, as compiled and deterministic.
    The double runs on this CPU's threads, so bit-equality here says nothing of a NeuronCore's: hardware tells."""
    monkeypatch.setenv("PYTHONPATH", f"{DOUBLES}{os.pathsep}{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    run = Run(tmp_path, [PY], lnc=2, lines={"trace": PY})
    steps = {s.name: s for s in trn2_check.line_steps("trace", TIME_SCALE, 1)}
    for i, name in enumerate(("compile-trace", "determinism-trace"), start=1):
        run.results[name] = run_step(steps[name], run, i, 2, echo=lambda _: None)
        assert run.results[name].status == "passed", (name, run.results[name].reason)
    result = json.loads((tmp_path / "determinism-trace.json").read_text())
    assert result["backend"] == "neuron" and result["buckets"] == [1, 2]
    for rows in result["comparisons"].values():
        compared = [r["comparison"] for r in rows]
        assert "alone vs batch of 2" in compared and "raw vs url" in compared and "served (alone) vs bulk" in compared
        assert "replica A vs replica B" not in compared and not any(c.startswith("text:") for c in compared)
