"""`siglip-serve loadtest`: Locust headless against a running service, then `OUT/summary.json`.

    siglip-serve loadtest --host http://127.0.0.1:8000 --users 16 --run-time 60s --out lt
    siglip-serve loadtest --host ... --step-users 8 --step-time 30 --max-users 64 --p99-target-ms 250
    siglip-serve loadtest report ...          (= siglip-serve report, the instance-throughput report: measure/report.py)

Locust runs in a subprocess: its gevent monkey-patching must come before ssl is imported, which
this process cannot promise. Exit code: 0 passed, 1 a threshold (--max-fail-ratio, --max-p99-ms)
was breached, 2 the test could not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import psutil

from siglip_serve.core.cli import key_value, run_main, setup_logging
from siglip_serve.core.constants import LOADTEST_API_KEY_ENV
from siglip_serve.core.errors import UserError
from siglip_serve.core.poll import poll
from siglip_serve.loadtest.options import OPTIONS, STEP_OPTIONS, add_options, locust_arguments, parse_duration
from siglip_serve.loadtest.promtext import IMAGES_METRIC, MetricsError, cross_check, scrape, sum_metric
from siglip_serve.loadtest.summary import EXIT_ERROR, build_summary, format_summary
from siglip_serve.measure.corpus import CorpusError, image_files
from siglip_serve.measure.load_results import RunResults
from siglip_serve.measure.prices import add_price_arguments, price_from_args
from siglip_serve.measure.server_cpu import ServerCpu

log = logging.getLogger("siglip_loadtest")
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per readiness poll and scrape is noise

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parent
API_KEY_ENV = LOADTEST_API_KEY_ENV


class NotReady(UserError, RuntimeError):
    """The service did not answer GET /readyz with 200 in time."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_argument_group("target")
    target.add_argument("--host", default="http://127.0.0.1:8000", help="base URL of the service (with route prefix)")
    target.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"Authorization: Bearer KEY (default: env {API_KEY_ENV})")
    target.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for GET /readyz")
    load = parser.add_argument_group("load")
    load.add_argument("--users", type=int, default=8, help="concurrent closed-loop clients (constant load)")
    load.add_argument("--spawn-rate", type=float, default=10.0, help="users started per second")
    load.add_argument("--run-time", type=parse_duration, help="e.g. 60s, 5m (default 60s; step shape: no cap)")
    load.add_argument("--processes", type=int, default=0, help="Locust worker processes (0: one process)")
    load.add_argument("--stop-timeout", type=parse_duration, default=60.0,
                      help="at the end, seconds to wait for the requests in flight to be answered and counted")
    add_options(load, [o.flag for o in OPTIONS if o.flag not in STEP_OPTIONS])
    step = parser.add_argument_group("step shape (finds the saturation point)")
    add_options(step, STEP_OPTIONS)
    limits = parser.add_argument_group("thresholds (set the exit code)")
    limits.add_argument("--max-fail-ratio", type=float, default=0.01,
                        help="the run fails above this share of failed requests (default 0.01)")
    limits.add_argument("--max-p99-ms", type=float, help="whole-run p99 limit (default none)")
    metrics = parser.add_argument_group("metrics cross-check")
    metrics.add_argument("--metrics-url", help="Ray's Prometheus export, e.g. http://127.0.0.1:8080/metrics")
    metrics.add_argument("--metrics-name", default=IMAGES_METRIC)
    metrics.add_argument("--metrics-label", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                         help="only series with this label, e.g. application=siglip (repeatable)")
    metrics.add_argument("--metrics-wait", type=float, default=30.0, help="seconds to wait for the count to land")
    metrics.add_argument("--metrics-tolerance", type=float, default=0.05)
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="loadtest-results", help="folder for summary.json, CSV and HTML")
    add_price_arguments(parser.add_argument_group("price (dollars per million images)"))
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Fail here, before Locust starts, on what Locust's workers would only fail on one by one."""
    args.price = price_from_args(args)
    if args.images:
        image_files(args.images)
        args.images = str(Path(args.images).resolve())  # Locust's cwd may differ
    if args.endpoint == "raw" and args.images_per_request != 1:
        raise CorpusError("--endpoint raw carries one image per request; use multipart or json for more")
    if args.images_per_request < 1 or args.users < 1:
        raise CorpusError("--images-per-request and --users must be at least 1")
    if args.step_users < 0:
        raise CorpusError("--step-users must be at least 1 (0: constant load)")
    if args.step_users:
        args.max_users = args.max_users or 8 * args.step_users
        if args.max_users < args.step_users:
            raise CorpusError("--max-users must be at least --step-users")
    elif args.run_time is None:
        args.run_time = 60.0


def wait_ready(host: str, timeout_s: float) -> None:
    """Poll GET /readyz until 200: a test that starts while replicas load measures the loading."""
    def probe() -> str:
        try:
            return f"HTTP {httpx.get(f'{host}/readyz', timeout=10).status_code}"
        except httpx.HTTPError as exc:
            return str(exc) or type(exc).__name__

    last, ready, _ = poll(probe, lambda answer: answer == "HTTP 200", timeout_s, interval_s=1.0)
    if not ready:
        raise NotReady(f"{host}/readyz not ready after {timeout_s:g} s ({last})")


def locust_command(args: argparse.Namespace, out: Path) -> list[str]:
    files = [str(HERE / "locustfile.py")] + ([str(HERE / "stepshape.py")] if args.step_users else [])
    cmd = [sys.executable, "-m", "locust", "-f", ",".join(files), "--headless", "--only-summary",
           "--host", args.host, "--spawn-rate", f"{args.spawn_rate:g}",
           "--csv", str(out / "locust"), "--html", str(out / "locust.html"),
           # Pass and fail are decided here from the thresholds, not by Locust's "any failure".
           "--exit-code-on-error", "0",
           # Users finish the request in flight when the run ends: the server embeds it either way, and a
           # request the client dropped would be counted by the server alone (the metrics cross-check).
           "--stop-timeout", f"{args.stop_timeout:g}",
           "--results-json", str(out / "results.json"), *locust_arguments(args)]
    if not args.step_users:
        cmd += ["--users", str(args.users + args.interactive_users)]
    # The user classes: the backfill's, and the interactive users' only in the mixed scenario (a fixed count).
    cmd += ["SiglipUser", *(["InteractiveUser"] if args.interactive_users else [])]
    if args.run_time:
        cmd += ["--run-time", f"{int(args.run_time)}s"]
    if args.processes:
        cmd += ["--processes", str(args.processes)]
    return cmd


def expected_seconds(args: argparse.Namespace) -> float:
    planned = args.run_time or 0.0
    if args.step_users:
        steps = -(-args.max_users // args.step_users)
        planned = min(planned, steps * args.step_time) if planned else steps * args.step_time
    return planned


def local_server(host: str) -> ServerCpu | None:
    """The service's process tree when it runs on this machine (its CPU per image is then measured)."""
    url = urllib.parse.urlsplit(host)
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        return ServerCpu.listening_on(port)
    except (LookupError, psutil.AccessDenied) as exc:
        log.info("server CPU will not be measured: %s", exc)
        return None


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    settings = {k: v for k, v in vars(args).items() if k not in ("api_key", "func", "price")}
    settings["api_key"] = bool(args.api_key)
    settings["prices"] = str(args.prices) if args.prices else None
    settings["shape"] = "step" if args.step_users else "constant"
    return settings


def format_lanes(lanes: dict[str, dict[str, Any]]) -> str:
    """The mixed scenario's table: each lane's users, p50/p99 and throughput."""
    lines = [f"{'lane':<14} {'users':>5} {'req/s':>8} {'img/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'fail':>6}"]
    for lane, row in lanes.items():
        lines.append(f"{lane:<14} {row['users']:>5} {row['requests_per_second']:>8.1f} "
                     f"{row['images_per_second']:>8.1f} {row['p50_ms'] or 0:>8.0f} {row['p99_ms'] or 0:>8.0f} "
                     f"{row['failures']:>6}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    args.host = args.host.rstrip("/")
    # Absolute before Locust starts: it runs with cwd=PROJECT_ROOT, this process in the user's cwd.
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results_path.unlink(missing_ok=True)
    wait_ready(args.host, args.ready_timeout)

    labels = dict(args.metrics_label)
    before = None
    if args.metrics_url:
        try:
            before = sum_metric(scrape(args.metrics_url), args.metrics_name, labels)
        except MetricsError as exc:
            log.warning("%s; the cross-check will be unavailable", exc)

    server = local_server(args.host)
    cpu_before = server.snapshot() if server else None

    cmd = locust_command(args, out)
    env = dict(os.environ)
    if args.api_key:
        env[API_KEY_ENV] = args.api_key  # not on the command line, where `ps` shows it
    planned = expected_seconds(args)
    log.info("running Locust for about %.0f s (%s load, %s endpoint, %d image(s)/request); output in %s",
             planned, "stepped" if args.step_users else f"{args.users}-user", args.endpoint,
             args.images_per_request, out)
    try:
        limit = planned + args.stop_timeout + 120
        completed = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        log.error("Locust did not finish within %.0f s; stopped it", limit)
        return EXIT_ERROR
    if not results_path.exists():
        log.error("Locust exited with %d and wrote no results (see its log above)", completed.returncode)
        return EXIT_ERROR
    results = RunResults.read(results_path)  # written by the recorder inside Locust (loadtest/recorder.py)

    check = None
    if args.metrics_url:
        check = cross_check(args.metrics_url, before, results.images, args.metrics_name, labels,
                            args.metrics_tolerance, args.metrics_wait)
    outputs = {"summary": str(out / "summary.json"), "results": str(results_path), "html": str(out / "locust.html"),
               "csv": sorted(str(p) for p in out.glob("locust_*.csv"))}
    server_cpu = None
    if server and cpu_before is not None:
        server_cpu = ServerCpu.between(cpu_before, server.snapshot()).result(results.images)
    summary = build_summary(results, settings_of(args), outputs, check, args.max_fail_ratio, args.max_p99_ms,
                            args.p99_target_ms, args.step_max_fail_ratio, server_cpu, args.price)
    if completed.returncode not in (0, 1):
        summary.notes.append(f"Locust exited with {completed.returncode}")
        summary.exit_code = EXIT_ERROR
    summary.write(out / "summary.json")
    print(format_summary(summary))
    if (lanes := out / "lanes.json").exists():
        print(format_lanes(json.loads(lanes.read_text())))
    print(f"summary: {out / 'summary.json'}   report: {out / 'locust.html'}")
    return summary.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        from siglip_serve.measure import report

        return report.main(argv[1:])
    setup_logging("INFO")
    args = build_parser().parse_args(argv)
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    raise SystemExit(main())
