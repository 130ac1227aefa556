"""Locust users that post images to siglip-serve and check every answer.

    locust -f src/siglip_serve/loadtest/locustfile.py --host http://127.0.0.1:8000 \\
        --endpoint multipart --images-per-request 4

(`siglip-serve loadtest` runs this headless and writes the summary; see docs/loadtest.md.)

Every request carries an X-Request-ID. A response counts as a success only when it is a 200 with
as many embeddings as images sent, each of the served model's dimension (read once from
GET /v1/models, or given with --expect-dim); anything else is a failure with the reason.
Throughput is counted in images: the request's stats name carries the images per request, and
the recorder turns successful requests into images.
"""

# Locust first: its gevent monkey-patching must precede anything that imports ssl or urllib3.
from locust import FastHttpUser, constant, events, task  # isort: skip
from locust import runners  # isort: skip
from locust.runners import MasterRunner, WorkerRunner  # isort: skip

import json
import logging
import random
import uuid
from pathlib import Path
from typing import Any

import httpx

from siglip_serve.core.constants import LOADTEST_API_KEY_ENV
from siglip_serve.loadtest.options import add_options
from siglip_serve.loadtest.recorder import Recorder, rewrite_final_csv
from siglip_serve.loadtest.validate import check_response
from siglip_serve.measure.corpus import RequestBody, build_bodies, load_corpus, request_name

log = logging.getLogger("siglip_loadtest")

METHOD = "POST"
# Workers report to the master every 3 s by default; at 1 s the master's per-step windows are
# not lumpy (a worker's report is a small message).
runners.WORKER_REPORT_INTERVAL = 1.0


class Setup:
    """What every user of this process shares: bodies, expected dimension, auth header."""

    bodies: list[RequestBody] = []
    dim: int | None = None
    headers: dict[str, str] = {}
    error: str | None = None
    recorder: Recorder | None = None


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    group = parser.add_argument_group("siglip-serve")
    add_options(group)
    group.add_argument("--api-key", default="", env_var=LOADTEST_API_KEY_ENV,
                       help="Authorization: Bearer KEY (or env SIGLIP_LOADTEST_API_KEY)")
    group.add_argument("--results-json", default="", help="write the recorder's results here at the end")


def _fetch_model(host: str, headers: dict[str, str]) -> dict[str, Any]:
    response = httpx.get(f"{host}/v1/models", headers=headers, timeout=30)
    if response.status_code != 200:
        raise RuntimeError(f"GET /v1/models answered {response.status_code}: {response.text[:200]}")
    entry = response.json()["data"][0]
    model = {k: entry.get(k) for k in ("id", "embedding_dim", "image_size", "backend", "weights", "lnc", "buckets")}
    replicas = entry.get("replicas")
    model["replicas"] = len(replicas) if isinstance(replicas, list) else replicas
    return model


@events.init.add_listener
def _init(environment: Any, **_kw: Any) -> None:
    options = environment.parsed_options
    if options is None:  # Locust used as a library without our parser
        return
    name = request_name(options.endpoint, options.images_per_request)
    InteractiveUser.fixed_count = options.interactive_users  # beside them, the backfill takes the other users
    if not isinstance(environment.runner, WorkerRunner):
        Setup.recorder = Recorder(environment, name, METHOD, options.images_per_request,
                                  progress_every_s=options.progress_every)
        # The step shape, loaded from its own file, finds the recorder here.
        environment.siglip_recorder = Setup.recorder
    if not isinstance(environment.runner, MasterRunner):
        # Built before the test starts, so that the first step is not shortened by the encoding.
        try:
            corpus = load_corpus(options.images or None)
            Setup.bodies = build_bodies(corpus, options.endpoint, options.images_per_request,
                                        options.encoding_format)
        except Exception as exc:  # reported once the test starts
            Setup.error = f"load-test setup failed: {type(exc).__name__}: {exc}"
            log.error("%s", Setup.error)


@events.test_start.add_listener
def _test_start(environment: Any, **_kw: Any) -> None:
    options = environment.parsed_options
    host = (environment.host or "").rstrip("/")
    Setup.headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    if Setup.error:
        environment.process_exit_code = 2
        return
    try:
        model = None
        if Setup.recorder is not None or not options.expect_dim:
            try:
                model = _fetch_model(host, Setup.headers)
            except Exception as exc:  # with --expect-dim the model info is only for the report
                if not options.expect_dim:
                    raise
                log.warning("GET /v1/models failed (%s); going on with --expect-dim %d", exc, options.expect_dim)
        Setup.dim = options.expect_dim or int(model["embedding_dim"])  # type: ignore[index]
        if Setup.recorder is not None:
            Setup.recorder.model = model
            if options.expect_dim and model and model.get("embedding_dim") != options.expect_dim:
                Setup.recorder.notes.append(f"--expect-dim {options.expect_dim} differs from the served "
                                            f"dimension {model.get('embedding_dim')}")
    except Exception as exc:  # any setup failure ends the test with one message
        Setup.error = f"load-test setup failed: {type(exc).__name__}: {exc}"
        log.error("%s", Setup.error)
        environment.process_exit_code = 2
        return
    log.info("expecting %d-dimensional embeddings from %s; %s endpoint, %d image(s) per request",
             Setup.dim, host, options.endpoint, options.images_per_request)
    if Setup.recorder is not None:
        Setup.recorder.start()


@events.test_stopping.add_listener
def _test_stopping(environment: Any, **_kw: Any) -> None:
    # Before the users stop, so that the last snapshot still belongs to the running window.
    if Setup.recorder is not None:
        Setup.recorder.stop()


@events.quitting.add_listener
def _quitting(environment: Any, **_kw: Any) -> None:
    options = environment.parsed_options
    if Setup.recorder is not None and options is not None and options.results_json:
        if Setup.error:
            Setup.recorder.notes.append(Setup.error)
        Setup.recorder.write(options.results_json)
    if Setup.recorder is not None and options is not None and options.csv_prefix:
        rewrite_final_csv(environment, options.csv_prefix)
    if Setup.recorder is not None and options is not None and options.results_json and options.interactive_users:
        _write_lanes(environment, Path(options.results_json).with_name("lanes.json"))


def _write_lanes(environment: Any, path: Path) -> None:
    """Each lane's requests, failures, p50/p99 and throughput (the mixed scenario), from Locust's own stats."""
    options = environment.parsed_options
    label = request_name(options.endpoint, options.images_per_request)
    lanes = {}
    for lane, name in (("interactive", f"{label} {INTERACTIVE}"), (f"priority {options.priority}", label)):
        entry = environment.stats.get(name, METHOD)
        ok = entry.num_requests - entry.num_failures
        users = options.interactive_users if lane == INTERACTIVE else options.num_users - options.interactive_users
        lanes[lane] = {"users": users,
                       "requests": entry.num_requests, "failures": entry.num_failures,
                       "p50_ms": entry.get_response_time_percentile(0.5),
                       "p99_ms": entry.get_response_time_percentile(0.99),
                       "requests_per_second": entry.total_rps,
                       "images_per_second": entry.total_rps * options.images_per_request * ok
                       / max(entry.num_requests, 1)}
    path.write_text(json.dumps(lanes, indent=2))


INTERACTIVE = "interactive"


class SiglipUser(FastHttpUser):
    """A closed-loop client: posts the next body as soon as the previous answer is checked, in the lane
    --priority asks for (bulk by default)."""

    wait_time = constant(0)
    network_timeout = 120.0
    connection_timeout = 30.0

    def on_start(self) -> None:
        if Setup.error or not Setup.bodies:
            log.error("stopping: %s", Setup.error or "no request bodies")
            self.environment.process_exit_code = 2
            self.environment.runner.quit()
            return
        options = self.environment.parsed_options
        self.request_label = request_name(options.endpoint, options.images_per_request)
        self.priority = options.priority
        self.encoding = options.encoding_format if options.endpoint == "json" else "float"
        # Users start at different bodies so concurrent requests carry different images.
        self.next_body = random.randrange(len(Setup.bodies))

    @task
    def embed(self) -> None:
        body = Setup.bodies[self.next_body]
        self.next_body = (self.next_body + 1) % len(Setup.bodies)
        request_id = uuid.uuid4().hex
        headers = {**Setup.headers, "Content-Type": body.content_type, "X-Request-ID": request_id,
                   "Accept": "application/json", "X-Priority": str(self.priority)}
        with self.client.request(METHOD, body.path, name=self.request_label, data=body.data,  # type: ignore[arg-type]  # bytes work
                                 headers=headers,
                                 catch_response=True) as response:
            if response.status_code == 0:  # connection error: Locust already records the exception
                return
            reason = check_response(response.status_code, response.content or b"", body.images,
                                    Setup.dim or 0, self.encoding)
            if reason is None:
                echoed = response.headers.get("x-request-id")
                if echoed and request_id not in echoed:
                    reason = "X-Request-ID not echoed back"
            if reason is None:
                response.success()
            else:
                response.failure(reason)


class InteractiveUser(SiglipUser):
    """The mixed scenario's interactive users (--interactive-users): X-Priority 0, counted under their own name.
    `siglip-serve loadtest` picks this class only with --interactive-users (loadtest/cli.py)."""

    def on_start(self) -> None:
        super().on_start()
        self.request_label = f"{self.request_label} {INTERACTIVE}"
        self.priority = 0
