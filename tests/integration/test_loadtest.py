"""The Locust harness, its summary and thresholds, the metrics cross-check, and the throughput report.

End-to-end tests run `siglip-serve loadtest` (Locust in a subprocess) for a few seconds against
the real application on tiny-siglip; the rest check the pieces on recorded data.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from siglip_serve.loadtest import cli, promtext
from siglip_serve.loadtest.summary import breached_thresholds
from siglip_serve.loadtest.validate import check_response
from siglip_serve.loadtest.windows import hist_diff, percentile_ms, saturation, windows
from siglip_serve.measure import report
from siglip_serve.measure.corpus import CorpusError, build_bodies, folder_corpus, load_corpus, request_name
from siglip_serve.measure.load_results import LatencyMs, LoadTestSummary, Step
from siglip_serve.measure.seed import multicore_seed_by_lnc
from tests.helpers import API_KEY, REPO, ServeCluster, deploy, jpeg_bytes

DATA = REPO / "tests" / "data"


# -- pieces on plain data ------------------------------------------------------------------

def test_percentile_is_nearest_rank_of_the_histogram() -> None:
    rng = np.random.default_rng(1)
    samples = rng.integers(5, 400, size=997)
    hist: dict[int, int] = {}
    for value in samples:
        hist[int(value)] = hist.get(int(value), 0) + 1
    for q in (1, 50, 95, 99, 100):
        assert percentile_ms(hist, q) == float(np.percentile(samples, q, method="inverted_cdf"))
    assert percentile_ms({}, 99) is None
    assert hist_diff({10: 5, 20: 3}, {10: 2}) == {10: 3, 20: 3}


def _snap(t: float, users: int, requests: int, failures: int, hist: dict[int, int], state: str = "running") -> dict:
    return {"t": t, "users": users, "state": state, "requests": requests, "failures": failures, "hist": hist}


def test_windows_group_by_users_drop_settling_and_spawning() -> None:
    timeline = [
        _snap(0, 0, 0, 0, {}, "spawning"),
        _snap(1, 2, 10, 0, {50: 10}),
        _snap(2, 2, 20, 0, {50: 20}),             # settling (first 20 %) ends here
        _snap(6, 2, 60, 0, {50: 50, 90: 10}),
        _snap(7, 4, 70, 0, {50: 50, 90: 20}, "spawning"),
        _snap(8, 4, 90, 5, {50: 50, 90: 35, 400: 5}),
        _snap(10, 4, 130, 5, {50: 50, 90: 75, 400: 5}),
    ]
    found = windows(timeline, images_per_request=3)
    assert [w.users for w in found] == [2, 4]
    first, second = found
    assert first.t_start == 2 and first.requests == 40 and first.images == 120
    assert first.images_per_second == pytest.approx(120 / 4)
    assert first.latency_ms == LatencyMs(p50=50.0, p95=90.0, p99=90.0)
    assert second.failures == 0 and second.images_per_second == pytest.approx(40 * 3 / 2)

    healthy = saturation(found, p99_target_ms=100, step_max_fail_ratio=0.01)
    assert healthy is not None and healthy.users == max(found, key=lambda w: w.images_per_second).users
    assert saturation(found, p99_target_ms=10, step_max_fail_ratio=0.01) is None
    failing = [second.model_copy(update={"fail_ratio": 0.5}), first]
    assert saturation(failing, p99_target_ms=100, step_max_fail_ratio=0.01).users == 2


def test_check_response_names_what_is_wrong() -> None:
    good = json.dumps({"data": [{"embedding": [0.0] * 64}, {"embedding": [0.0] * 64}]}).encode()
    assert check_response(200, good, images=2, dim=64) is None
    assert check_response(200, good, images=3, dim=64) == "expected 3 embeddings, got 2"
    assert check_response(200, good, images=2, dim=1152) == "embedding dimension 64, expected 1152"
    b64 = base64.b64encode(np.zeros(64, "<f4").tobytes()).decode()
    assert check_response(200, json.dumps({"data": [{"embedding": b64}]}).encode(), 1, 64, "base64") is None
    assert check_response(200, b"<html>", 1, 64) == "HTTP 200 with a body that is not JSON"
    error = json.dumps({"error": {"message": "image: corrupt", "type": "invalid_image", "code": 400}}).encode()
    assert check_response(400, error, 1, 64) == "HTTP 400 invalid_image"
    assert check_response(502, b"Bad Gateway", 1, 64) == "HTTP 502 (not the contract's error JSON)"


def test_corpus_and_bodies(tmp_path: Path, photos: list[np.ndarray]) -> None:
    corpus = load_corpus()
    assert len(corpus) >= 6 and all(Image.open(io.BytesIO(i.data)).format == "JPEG" for i in corpus)
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(photos[0]))
    (tmp_path / "notes.txt").write_text("not an image")
    assert [i.name for i in folder_corpus(tmp_path)] == ["a.jpg"]
    with pytest.raises(CorpusError, match="no image files"):
        folder_corpus(_empty(tmp_path))
    with pytest.raises(CorpusError, match="one image per request"):
        build_bodies(corpus, "raw", 2)
    bodies = build_bodies(corpus, "json", 3)
    assert len(bodies) == len(corpus) and all(b.images == 3 and b.path == "/v1/embeddings" for b in bodies)
    sent = json.loads(bodies[1].data)["input"]
    assert [base64.b64decode(uri.split(",", 1)[1]) for uri in sent] == [c.data for c in corpus[1:4]]
    multipart = build_bodies(corpus, "multipart", 2)[0]
    assert multipart.content_type.startswith("multipart/form-data; boundary=")
    assert multipart.data.count(b"Content-Disposition: form-data") == 2 and corpus[0].data in multipart.data


def _empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_thresholds() -> None:
    run = {"requests": 200, "failures": 1, "p99": 120.0}
    assert breached_thresholds(**run, max_fail_ratio=0.01, max_p99_ms=200) == []
    assert len(breached_thresholds(**run, max_fail_ratio=0.001, max_p99_ms=None)) == 1
    assert "p99" in breached_thresholds(**run, max_fail_ratio=None, max_p99_ms=100)[0]
    assert breached_thresholds(0, 0, None, None, None) == ["no requests were made"]


# -- the metrics cross-check on Prometheus text --------------------------------------------

def test_prometheus_counter_summed_over_series() -> None:
    before = (DATA / "ray_metrics_before.prom").read_text()
    after = (DATA / "ray_metrics_after.prom").read_text()
    name = promtext.IMAGES_METRIC
    assert promtext.sum_metric(before, name, {"application": "siglip"}) == 100 + 50 + 30
    assert promtext.sum_metric(after, name, {"application": "siglip"}) == 160 + 90 + 70 + 20
    assert promtext.sum_metric(after, name) == 160 + 90 + 70 + 20 + 1500
    assert promtext.sum_metric(after, name, {"application": "siglip", "endpoint": "multipart"}) == 110
    assert promtext.sum_metric(after, "ray_missing_total") is None
    quoted = [labels for n, labels, _ in promtext.parse_samples(after) if labels.get("note")]
    assert quoted[0]["note"] == 'a "quoted", comma' and quoted[0]["replica"] == "r2"
    # Text that is not Prometheus's is an error that says so, not a count made of what could be read.
    with pytest.raises(promtext.MetricsError, match="not Prometheus text"):
        promtext.sum_metric(after + "ray_broken_line{unterminated 5\n", name)


def test_cross_check_waits_for_late_counts_and_flags_disagreement() -> None:
    before_text = (DATA / "ray_metrics_before.prom").read_text()
    after_text = (DATA / "ray_metrics_after.prom").read_text()
    match = {"application": "siglip"}
    before = promtext.sum_metric(before_text, promtext.IMAGES_METRIC, match)
    delta = promtext.sum_metric(after_text, promtext.IMAGES_METRIC, match) - before
    # Ray exports late: the first scrapes after the run have not seen the last images yet.
    scrapes = iter([before_text, before_text, after_text])
    result = promtext.cross_check("http://metrics", before, int(delta) - 2, match=match, wait_s=60,
                                  read=lambda _url: next(scrapes), sleep=lambda _s: None)
    assert result.agrees is True and result.server_images == delta and result.client_images == delta - 2
    # Nothing counted on either side yet is not agreement: it waits (here: no time) for the export.
    nothing = promtext.cross_check("http://metrics", before, 0, match=match, wait_s=0,
                                   read=lambda _url: before_text, sleep=lambda _s: None)
    assert nothing.server_images == 0 and nothing.waited_s == 0

    off = promtext.cross_check("http://metrics", before, int(delta * 2), match=match, wait_s=0,
                               read=lambda _url: after_text, sleep=lambda _s: None)
    assert off.agrees is False and off.difference_ratio == pytest.approx(0.5)

    def unreachable(url: str) -> str:
        raise promtext.MetricsError(f"could not read metrics from {url}: refused")

    gone = promtext.cross_check("http://metrics", before, 10, wait_s=0, read=unreachable, sleep=lambda _s: None)
    assert gone.agrees is None and "refused" in gone.note


# -- the report from recorded results ------------------------------------------------------

def test_report_builds_from_recorded_results(tmp_path: Path) -> None:
    code = report.main(["--bench-json", str(DATA / "bench.json"), "--multicore-json", str(DATA / "multicore.json"),
                        "--loadtest-summary", str(DATA / "loadtest_summary.json"), "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((DATA / "loadtest_summary.json").read_text())
    multicore = json.loads((DATA / "multicore.json").read_text())
    total = sum(w["images_per_second"] for w in multicore["workers"])
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["missing"] == []
    assert result["serving_efficiency"] == pytest.approx(summary["saturation"]["images_per_second"] / total)
    sources = [row["source"] for row in result["rows"]]
    assert sources == ["seed 000, LNC=2", "seed 000, LNC=1", "(a) this run", "(b) this run", "(c) this run"]
    bench = json.loads((DATA / "bench.json").read_text())
    assert result["rows"][2]["per_core"] == next(r["images_per_second"] for r in bench["encoder"] if r["bucket"] == 1)
    # The host ceiling (250 img/s, no model) against (b), all cores at once: the device is the limit here.
    assert result["bound"]["verdict"] == "device-bound"
    assert result["bound"]["device_images_per_second"] == pytest.approx(total)
    assert result["bound"]["served_images_per_second"] == summary["saturation"]["images_per_second"]
    md = (tmp_path / "report.md").read_text()
    assert f"{result['serving_efficiency']:.1%}" in md and "141.10" in md and "115.00" in md
    assert "DEVICE-BOUND" in md
    assert "Metrics cross-check" in md and str(summary["metrics_check"]["client_images"]) in md
    for name in ("throughput_vs_users", "latency_vs_users", "per_core"):
        png = tmp_path / f"{name}.png"
        assert f"({png.name})" in md
        with Image.open(png) as image:
            assert image.format == "PNG" and image.width > 300


def test_over_target_run_still_shows_its_measured_figure_marked(tmp_path: Path) -> None:
    summary = json.loads((DATA / "loadtest_summary.json").read_text())
    summary["saturation"] = None  # no step met a 50 ms p99 target
    summary["settings"]["p99_target_ms"] = 50.0
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    assert report.main(["--loadtest-summary", str(path), "--out", str(tmp_path / "r")]) == 0
    result = json.loads((tmp_path / "r" / "report.json").read_text())
    row = next(r for r in result["rows"] if r["source"].startswith("(c)"))
    best = max(summary["steps"], key=lambda w: w["images_per_second"])
    assert row["instance"] == pytest.approx(best["images_per_second"]) and "OVER TARGET" in row["source"]
    assert "p99 320 ms > target 50 ms" in row["what"] and result["serving_efficiency"] is None
    assert "(c) served saturation" not in result["missing"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"{best['images_per_second']:.2f}" in md and "OVER the p99 target" in md


def test_user_axes_have_integer_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.measure import plots

    seen = []
    real_finish = plots._finish

    def keep_ticks(fig, ax, title, context, path):  # the real _finish, after noting the user-axis ticks
        seen.append([t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]])
        return real_finish(fig, ax, title, context, path)

    monkeypatch.setattr(plots, "_finish", keep_ticks)
    one_step = [Step(users=4, t_start=1.0, t_end=11.0, seconds=10.0, requests=500, failures=0, images=500,
                     fail_ratio=0.0, images_per_second=50.0, requests_per_second=50.0,
                     latency_ms=LatencyMs(p50=10.0, p95=20.0, p99=30.0))]
    plots.throughput_vs_users(one_step, None, None, None, "ctx", tmp_path / "t.png")
    plots.latency_vs_users(one_step, 100.0, "ctx", tmp_path / "l.png")
    assert len(seen) == 2 and all(ticks and all(float(t).is_integer() for t in ticks) for ticks in seen), seen


def test_a_closed_step_keeps_the_window_it_was_judged_on() -> None:
    """The live step line prints close_window's figure; summary.json's steps come from windows()."""
    from siglip_serve.loadtest.recorder import Recorder

    rec = Recorder(environment=None, request_name="r", method="POST", images_per_request=1)
    rec.timeline = [{"t": float(t), "users": 2, "state": "running", "requests": 10 * t, "failures": 0,
                     "hist": {"10": 10 * t}} for t in range(11)]
    rec.snapshot = lambda: rec.timeline[-1]  # no Locust runner here: the timeline above is the run
    live = rec.close_window(2)
    # Snapshots taken after the step ended, while Locust still reports the old user count.
    rec.timeline += [{"t": 11.0 + t, "users": 2, "state": "running", "requests": 100 + 50 * (t + 1), "failures": 0,
                      "hist": {"10": 100 + 50 * (t + 1)}} for t in range(3)]
    assert [w.images_per_second for w in rec.windows()] == [live.images_per_second] == [10.0]


def test_report_tolerates_missing_parts(tmp_path: Path) -> None:
    assert report.main(["--loadtest-summary", str(DATA / "loadtest_summary.json"), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["serving_efficiency"] is None and len(result["missing"]) == 3 and result["bound"] is None
    assert any("host ceiling" in part for part in result["missing"])
    assert result["figures"]["per_core"] is None and (tmp_path / "throughput_vs_users.png").exists()
    assert report.main(["--out", str(tmp_path / "none")]) == 2
    assert report.main(["--bench-json", str(tmp_path / "absent.json"), "--out", str(tmp_path)]) == 2


def test_seed_reference_is_the_multicore_modules_table() -> None:
    seed = multicore_seed_by_lnc()
    assert seed[2].model_dump() == {
        "cores": 4, "per_core_images_per_second": 35.43, "instance_images_per_second": 141.1, "latency_mean_ms": 28.23,
        "auto_cast": "matmult", "batch": 1, "lnc": 2, "label": "seed LNC=2, 4 cores, matmult"}
    assert seed[1].instance_images_per_second == 115.0 and seed[1].auto_cast == "none" and "fp32" in seed[1].label


def test_report_runs_the_real_multicore_bench_on_cpu(tmp_path: Path) -> None:
    """--run-multicore calls siglip_serve.measure.multicore.run_multicore for real: two pinned CPU workers."""
    code = report.main(["--run-multicore", "cores=2", "model=tiny-siglip", "bucket=2", "warmup=1", "iterations=5",
                        "--out", str(tmp_path)])
    assert code == 0
    recorded = json.loads((tmp_path / "multicore.json").read_text())
    assert recorded["backend"] == "cpu" and recorded["cores"] == 2 and recorded["bucket"] == 2
    assert sorted(w["core"] for w in recorded["workers"]) == ["0", "1"]
    assert all(w["images"] == 2 * 5 for w in recorded["workers"])
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["multi_core"]["instance_images_per_second"] == pytest.approx(
        sum(w["images_per_second"] for w in recorded["workers"]))
    assert result["context"]["model"] == "tiny-siglip" and result["context"]["backend"] == "cpu"
    (row,) = (r for r in result["rows"] if r["source"] == "(b) this run")
    assert row["cores"] == 2 and "batch 2" in row["what"]
    md = (tmp_path / "report.md").read_text()
    assert "un-cast fp32" in md and "not comparable" in md


def test_run_multicore_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cores=N"):
        report.main(["--run-multicore", "model=tiny-siglip", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="could not run"):
        report.main(["--run-multicore", "cores=1", "backend=nonsense", "--out", str(tmp_path)])


# -- end to end against the real app -------------------------------------------------------

@pytest.fixture(scope="module")
def lt_app(serve_cluster: ServeCluster) -> str:
    """tiny-siglip, one replica, with an API key, at /lt: lighter to start than main_app's four."""
    deploy("loadtest", "/lt", replicas=1, api_key=API_KEY, encoder_num_cpus=0.5, batch_wait_timeout_s=0.005,
           torch_threads=1)
    return f"{serve_cluster.base_url}/lt"


@pytest.fixture(scope="module")
def metrics_url(serve_cluster: ServeCluster) -> str:
    return f"http://127.0.0.1:{serve_cluster.metrics_port}/metrics"


def _run(tmp_path: Path, host: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "out"
    code = cli.main(["--host", host, "--api-key", API_KEY, "--out", str(out), "--progress-every", "1", *extra])
    LoadTestSummary.read(out / "summary.json")  # the file is the model the report reads
    return code, json.loads((out / "summary.json").read_text())


def test_constant_load_writes_every_output_and_agrees_with_server_metrics(
        tmp_path: Path, lt_app: str, metrics_url: str) -> None:
    code, summary = _run(tmp_path, lt_app, "--users", "2", "--run-time", "4s", "--endpoint", "multipart",
                         "--images-per-request", "2", "--metrics-url", metrics_url,
                         "--metrics-label", "application=loadtest", "--p99-target-ms", "60000")
    out = tmp_path / "out"
    assert code == 0, summary["thresholds"]
    assert summary["failures"] == 0 and summary["requests"] > 0
    assert summary["images"] == 2 * summary["requests"]
    assert summary["images_per_second"] == pytest.approx(2 * summary["requests_per_second"])
    lat = summary["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
    assert summary["server"]["embedding_dim"] == 64 and summary["server"]["id"] == "tiny-siglip"
    assert summary["steps"] and summary["saturation"]["users"] == 2
    assert summary["settings"]["api_key"] is True and API_KEY not in (out / "summary.json").read_text()
    check = summary["metrics_check"]
    assert check["agrees"] is True, check
    assert abs(check["server_images"] - summary["images"]) <= 0.05 * summary["images"]
    # The service runs on this machine: its process tree's CPU per image is measured, Locust's is not.
    cpu = summary["server_cpu"]
    assert cpu["ms_per_image"] == pytest.approx(cpu["seconds"] * 1e3 / summary["images"])
    assert cpu["ms_per_image_by_kind"]["encoder"] > 0 and cpu["ms_per_image_by_kind"]["proxy"] > 0

    name = request_name("multipart", 2)
    with open(out / "locust_stats.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == name)
    assert int(row["Request Count"]) == summary["requests"]
    # The whole run's percentiles are Locust's own: the summary and Locust's CSV say the same.
    assert [lat[q] for q in ("p50", "p95", "p99")] == [float(row[q]) for q in ("50%", "95%", "99%")]
    assert (out / "locust_stats_history.csv").exists() and (out / "locust_failures.csv").exists()
    assert name in (out / "locust.html").read_text()


def test_step_shape_finds_saturation_and_a_p99_threshold_fails_the_run(tmp_path: Path, lt_app: str) -> None:
    code, summary = _run(tmp_path, lt_app, "--step-users", "1", "--step-time", "3", "--max-users", "3",
                         "--endpoint", "json", "--encoding-format", "base64", "--p99-target-ms", "60000",
                         "--max-p99-ms", "0.5")
    assert code == 1
    assert [step["users"] for step in summary["steps"]] == [1, 2, 3]
    best = max(summary["steps"], key=lambda s: s["images_per_second"])
    assert summary["saturation"]["users"] == best["users"]
    assert summary["failures"] == 0
    assert summary["thresholds"]["breached"] and "p99" in summary["thresholds"]["breached"][0]


def test_bad_responses_are_counted_as_failures(tmp_path: Path, lt_app: str, photo_jpegs: list[bytes],
                                               metrics_url: str) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "good.jpg").write_bytes(photo_jpegs[0])
    (folder / "truncated.jpg").write_bytes(photo_jpegs[1][:1500])
    code, summary = _run(tmp_path, lt_app, "--users", "1", "--run-time", "3s", "--images", str(folder),
                         "--expect-dim", "63", "--metrics-url", metrics_url, "--metrics-label",
                         "application=loadtest", "--metrics-wait", "15")
    assert code == 1
    reasons = summary["failure_reasons"]
    assert summary["failures"] == summary["requests"] > 0 and summary["images"] == 0
    assert "embedding dimension 64, expected 63" in reasons
    assert any(reason.startswith("HTTP 400") for reason in reasons), reasons
    # The server embedded the good image every other request; the load test accepted none: the check sees it.
    check = summary["metrics_check"]
    assert check["server_images"] > 0 and check["client_images"] == 0 and check["agrees"] is False


def test_relative_out_lands_in_the_callers_cwd(tmp_path: Path, lt_app: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the repository root, where Locust runs
    code = cli.main(["--host", lt_app, "--api-key", API_KEY, "--out", "lt", "--users", "1", "--run-time", "2s",
                     "--p99-target-ms", "60000"])
    assert code == 0
    summary = json.loads((elsewhere / "lt" / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["outputs"]["summary"] == str(elsewhere / "lt" / "summary.json")


def test_cannot_run_is_exit_code_2(tmp_path: Path) -> None:
    from siglip_serve.launcher.preflight import free_port

    assert cli.main(["--host", f"http://127.0.0.1:{free_port()}", "--ready-timeout", "0",
                     "--out", str(tmp_path)]) == 2
    assert cli.main(["--endpoint", "raw", "--images-per-request", "2", "--out", str(tmp_path)]) == 2
    assert cli.main(["--images", str(_empty(tmp_path)), "--out", str(tmp_path)]) == 2


def test_report_runs_the_measurements_it_is_not_given(tmp_path: Path, lt_app: str) -> None:
    """(a) by the real `siglip-serve bench`, (b) by the real run_multicore (CPU workers), (c) by a real
    load test."""
    code = report.main(["--run-bench=--model tiny-siglip --torch-threads 1 --warmup 2 --iterations 5",
                        "--run-multicore", "cores=2", "model=tiny-siglip", "warmup=1", "iterations=5",
                        f"--run-loadtest=--host {lt_app} --api-key {API_KEY} --users 1 --run-time 3s",
                        "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "report.json").read_text())
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert "preprocess" not in bench and "served" not in bench
    assert result["single_core"]["batch1_images_per_second"] == next(
        r["images_per_second"] for r in bench["encoder"] if r["bucket"] == 1)
    multicore = json.loads((tmp_path / "multicore.json").read_text())
    assert result["multi_core"]["instance_images_per_second"] == pytest.approx(multicore["instance_images_per_second"])
    served = json.loads((tmp_path / "loadtest" / "summary.json").read_text())
    assert served["requests"] > 0 and result["served"]["images"] == served["images"]
    assert result["serving_efficiency"] == pytest.approx(
        served["saturation"]["images_per_second"] / result["multi_core"]["instance_images_per_second"])
