"""Metrics end to end: the real app under load, scraped by a real Prometheus with the shipped config.

The app runs in the session's Ray cluster as its own application ("metrics", under /metrics-app),
so other tests' traffic never reaches its series; every query filters on application="metrics".
Prometheus is Debian's package (installed here when missing), scraping Ray's metrics export port
every second; the dashboard's queries are run through its HTTP API exactly as Grafana would.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from siglip_serve.core.lanes import LANE_NAMES
from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from siglip_serve.serve.http.errors import ErrorType
from siglip_serve.serve.shared.metrics import METRIC_NAMES, TENANT_REQUEST_SECONDS
from tests.bounds import SETTLE_S
from tests.helpers import REPO as ROOT
from tests.helpers import ServeCluster, deploy
from tests.integration.prometheus_server import SHIPPED_CONFIG, PrometheusServer, ensure_installed, scrape_config_for

DASHBOARD = ROOT / "deploy" / "grafana" / "siglip-serve.json"
OBSERVABILITY_DOC = ROOT / "docs" / "observability.md"
NEURON_MONITOR_CONFIG = ROOT / "deploy" / "neuron-monitor" / "monitor.json"

APP = "metrics"
ROUTE = "/metrics-app"
KEY = "metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# The key's own lane (interactive), then the default and the bulk lane, as X-Priority moves a request down.
LANE_PRIORITIES: list[dict[str, str]] = [{}, {"X-Priority": "1"}, {"X-Priority": "2"}]
MAX_IMAGES = 4
LOAD_SECONDS = 6.0
LOAD_THREADS = 4
CONVERGE_S = SETTLE_S
SCRAPE_INTERVAL = "3s"
# Grafana's built-in variables, as the test stands in for Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "15s", "$application": APP}
# Ray attaches these to every series it exports (its own ray_serve_* too); they are not ours.
RAY_GLOBAL_LABELS = frozenset({"Component", "NodeAddress", "SessionName", "Version", "WorkerId"})


# -- reading the dashboard and the docs --------------------------------------------------------

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                 "and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects. Not a parser: strings, label matchers, ranges and
    grouping clauses are removed, then every identifier that is not called as a function is a name.
    The integration test checks the result against the names Prometheus really has."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end():].lstrip().startswith("(") or match.group(0).lower() in _PROMQL_WORDS:
            continue
        names.add(match.group(0))
    return names


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str

    @property
    def names(self) -> set[str]:
        return metric_names(self.expr)

    @property
    def from_neuron_monitor(self) -> bool:
        return any(not name.startswith(("ray_", "haproxy_")) for name in self.names)

    @property
    def from_haproxy(self) -> bool:
        """HAProxy's own exporter (the default front end's), scraped by the shipped `haproxy` job."""
        return any(name.startswith("haproxy_") for name in self.names)


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[Query]:
    return [Query(panel["title"], target["expr"]) for panel in dashboard()["panels"]
            for target in panel.get("targets", [])]


def substitute(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${" + name[1:] + "}", value).replace(name, value)
    assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
    return expr


def documented_neuron_monitor_metrics() -> set[str]:
    """The exporter's metric names as docs/observability.md lists them (between the markers)."""
    text = OBSERVABILITY_DOC.read_text()
    block = re.search(r"<!-- neuron-monitor-metrics:begin -->(.*?)<!-- neuron-monitor-metrics:end -->", text, re.S)
    assert block, f"{OBSERVABILITY_DOC} has no neuron-monitor-metrics block"
    return set(re.findall(r"^\|\s*`([a-z_]+)`", block.group(1), re.M))


# -- unit checks of the shipped files (no cluster) ----------------------------------------------

def test_dashboard_imports_with_a_prometheus_datasource_input() -> None:
    board = dashboard()
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["application"]["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_dashboard_covers_what_users_ask() -> None:
    """img/s, latency per stage, batch fill, queues, rejections, replica health, NeuronCores."""
    used = set().union(*(q.names for q in dashboard_queries()))
    ours = {f"ray_{name}" for name in METRIC_NAMES}
    assert {"ray_siglip_images_embedded_total", "ray_siglip_encoder_images_total"} <= used
    for histogram in ("siglip_preprocess_seconds", "siglip_encoder_forward_seconds", "siglip_request_seconds",
                      "siglip_batch_fill_ratio"):
        assert any(n.startswith(f"ray_{histogram}") for n in used), histogram
    assert "ray_siglip_requests_rejected_total" in used
    assert {"ray_serve_http_request_latency_ms_bucket", "ray_serve_deployment_queued_queries",
            "ray_siglip_batch_queued_inputs", "ray_serve_deployment_replica_healthy"} <= used
    assert {"neuroncore_utilization_ratio", "neuron_runtime_memory_used_bytes"} <= used
    assert all(any(n.startswith(name) for n in used) for name in ours), ours
    exprs = [q.expr for q in dashboard_queries()]
    for quantile in ("0.5", "0.95", "0.99"):
        assert any(f"histogram_quantile({quantile}, " in e and "siglip_request_seconds" in e for e in exprs)


def test_neuron_panels_use_the_exporters_documented_metric_names() -> None:
    # The names come from AWS's exporter, /opt/aws/neuron/bin/neuron-monitor-prometheus.py
    # (aws-neuronx-tools; run as `neuron-monitor | neuron-monitor-prometheus.py --port N`, see the
    # Neuron Monitor User Guide, tools/neuron-sys-tools/neuron-monitor-user-guide.rst in
    # aws-neuron/aws-neuron-sdk), and AWS's own dashboard for it,
    # src/examples/neuron-monitor/neuron-monitor-grafana.json in the same repository.
    # docs/observability.md lists them with that citation; the dashboard may use no other.
    documented = documented_neuron_monitor_metrics()
    assert {"neuroncore_utilization_ratio", "neuron_runtime_memory_used_bytes"} <= documented
    neuron_queries = [q for q in dashboard_queries() if q.from_neuron_monitor]
    assert neuron_queries, "the dashboard has no neuron-monitor panels"
    used = {name for q in neuron_queries for name in q.names if not name.startswith("ray_")}
    assert used <= documented, f"not in the documented exporter metrics: {sorted(used - documented)}"


def test_shipped_prometheus_config_is_valid() -> None:
    ensure_installed()
    done = subprocess.run(["promtool", "check", "config", str(SHIPPED_CONFIG)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {job["job_name"] for job in scrape_config_for({})["scrape_configs"]}
    assert jobs == {"ray", "haproxy", "neuron-monitor"}


def test_neuron_monitor_config_collects_what_the_dashboard_reads() -> None:
    config = json.loads(NEURON_MONITOR_CONFIG.read_text())
    runtime_groups = {m["type"] for r in config["neuron_runtimes"] for m in r["metrics"]}
    assert runtime_groups == {"neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"}
    assert {m["type"] for m in config["system_metrics"]} == {"vcpu_usage", "memory_info", "neuron_hw_counters"}
    assert re.fullmatch(r"\d+s", config["period"])


# -- the integration: app + load + Prometheus ---------------------------------------------------

@pytest.fixture(scope="module")
def metrics_app(serve_cluster: ServeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tiny-siglip, 2 CPU encoder replicas (the test cluster's neuron_cores belong to main_app); its one key a
    tenant of the interactive lane, so the load can travel in every lane (LANE_PRIORITIES), and an ingress replica
    and an encoder replica kept for that lane beside the ones the others share (interactive_ingress,
    interactive_encoder)."""
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "metrics"\nkey = "{KEY}"\nlane = "interactive"\n')
    deploy(APP, ROUTE, replicas=2, neuron_cores_per_replica=0, encoder_num_cpus=0.5, torch_threads=1,
           batch_wait_timeout_s=0.01, max_images_per_request=MAX_IMAGES, api_keys_file=str(keys),
           ingress_replicas=1, interactive_ingress=True, interactive_encoder=True)
    yield serve_cluster.base_url + ROUTE


@pytest.fixture(scope="module")
def prometheus(serve_cluster: ServeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    ensure_installed()
    nothing_there = f"127.0.0.1:{free_port()}"  # no neuron-monitor here; the job stays, its target is down
    haproxy = serve_cluster.haproxy_metrics_port
    # Every 3 s: Prometheus caps a scrape's timeout at its interval, and late in a full test session
    # Ray's exporter carries the series of every replica the session ran, which on a loaded 2-core
    # runner took over 1 s to answer (every scrape failed, every series went stale).
    config = scrape_config_for({"ray": [f"127.0.0.1:{serve_cluster.metrics_port}"], "neuron-monitor": [nothing_there],
                                "haproxy": [f"127.0.0.1:{haproxy}" if haproxy else nothing_there]},
                               scrape_interval=SCRAPE_INTERVAL)
    server = PrometheusServer(config, tmp_path_factory.mktemp("prometheus"), free_port())
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@dataclass
class Traffic:
    images_embedded: int
    good_requests: int
    good_by_endpoint: dict[str, int]
    rejected: collections.Counter[str]
    # Requests HAProxy refused itself (the default front end): header floods, answered 400 before Python.
    front_door_refused: int = 0
    images_by_lane: dict[str, int] = field(default_factory=dict)  # the good requests' images


def _header_flood(port: int) -> bytes:
    """One request with more headers than HAProxy takes (101); the first line of the reply, if any."""
    head = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Flood-%d: 1\r\n" % i for i in range(200))
            + b"Connection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        return sock.recv(64).split(b"\r\n")[0]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _good_requests(jpegs: list[bytes]) -> list[tuple[str, Callable[[httpx.Client], httpx.Response], int]]:
    """(endpoint label, send, images) for each kind of request that should embed."""
    return [
        ("image",
         lambda c: c.post("/v1/embeddings/image", content=jpegs[0], headers={"Content-Type": "image/jpeg"}), 1),
        ("embeddings", lambda c: c.post("/v1/embeddings", json={"input": [_b64(j) for j in jpegs[1:4]]}), 3),
        ("multipart", lambda c: c.post("/v1/embeddings/image",
                                       files=[("file", ("a.jpg", jpegs[3], "image/jpeg")),
                                              ("file", ("b.jpg", jpegs[4], "image/jpeg"))]), 2),
    ]


# (reason, how many, send): a known number of each kind of bad request.
BAD_REQUESTS: list[tuple[str, int, Callable[[httpx.Client, list[bytes]], httpx.Response]]] = [
    ("invalid_image", 3, lambda c, j: c.post("/v1/embeddings/image", content=b"\x00\x01garbage" * 50,
                                             headers={"Content-Type": "image/jpeg"})),
    ("invalid_base64", 2,
     lambda c, j: c.post("/v1/embeddings", json={"input": "data:image/png;base64,not base64 at all!!"})),
    ("too_many_images", 2, lambda c, j: c.post("/v1/embeddings", json={"input": [_b64(j[0])] * (MAX_IMAGES + 1)})),
    ("unsupported_media_type", 2, lambda c, j: c.post("/v1/embeddings/image", content=b"<html></html>",
                                                      headers={"Content-Type": "text/html"})),
    ("empty_body", 1, lambda c, j: c.post("/v1/embeddings/image", content=b"", headers={"Content-Type": "image/png"})),
    ("not_found", 1, lambda c, j: c.get("/v1/nothing-here")),
    ("unauthorized", 2, lambda c, j: c.post("/v1/embeddings/image", content=j[0],
                                            headers={"Content-Type": "image/jpeg", "Authorization": "Bearer wrong"})),
]


@pytest.fixture(scope="module")
def traffic(serve_cluster: ServeCluster, metrics_app: str, prometheus: PrometheusServer,
            photo_jpegs: list[bytes]) -> Traffic:
    """LOAD_SECONDS of concurrent good requests with the bad ones sent in the middle; counts what
    the server answered, as the client saw it."""
    rejected: collections.Counter[str] = collections.Counter()
    with httpx.Client(base_url=metrics_app, headers=AUTH, timeout=60) as client:
        while (ready := client.get("/readyz")).status_code != 200:  # a probe result, not a rejection
            assert ready.json()["error"]["type"] == "not_ready", ready.text
            time.sleep(0.2)

    kinds = _good_requests(photo_jpegs)
    lock = threading.Lock()
    totals = {"images": 0, "requests": 0}
    by_endpoint: collections.Counter[str] = collections.Counter()
    by_lane: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    stop_at = time.monotonic() + LOAD_SECONDS

    def load(worker: int) -> None:
        # Each worker in a lane of its own (the key's, then moved down by X-Priority), so every lane's panel has data.
        lane = LANE_PRIORITIES[worker % len(LANE_PRIORITIES)]
        lane_name = LANE_NAMES[worker % len(LANE_PRIORITIES)]
        with httpx.Client(base_url=metrics_app, headers={**AUTH, **lane}, timeout=60) as client:
            i = worker
            while time.monotonic() < stop_at:
                endpoint, send, images = kinds[i % len(kinds)]
                i += 1
                response = send(client)
                with lock:
                    if response.status_code != 200:
                        failures.append(f"{endpoint}: {response.status_code} {response.text[:200]}")
                        continue
                    got = len(response.json()["data"])
                    if got != images:
                        failures.append(f"{endpoint}: {got} embeddings for {images} images")
                    totals["images"] += got
                    totals["requests"] += 1
                    by_endpoint[endpoint] += 1
                    by_lane[lane_name] += got

    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(LOAD_THREADS)]
    for thread in threads:
        thread.start()
    time.sleep(LOAD_SECONDS / 3)
    with httpx.Client(base_url=metrics_app, headers=AUTH, timeout=60) as client:
        for reason, count, send in BAD_REQUESTS:
            for _ in range(count):
                response = send(client, photo_jpegs)
                assert response.json()["error"]["type"] == reason, response.text
                rejected[reason] += 1
    refused = 0
    if serve_cluster.front_end == "haproxy":
        assert _header_flood(serve_cluster.http_port) == b"HTTP/1.1 400 Bad request"
        refused += 1
    for thread in threads:
        thread.join(timeout=LOAD_SECONDS + 60)
    assert not failures, failures[:5]
    assert totals["requests"] >= 3 * LOAD_THREADS, f"too little load to test with: {totals}"
    return Traffic(totals["images"], totals["requests"], dict(by_endpoint), rejected, refused, dict(by_lane))


def _eventually(read: Callable[[], object], expected: object, what: str, prometheus: PrometheusServer) -> None:
    """Wait until Prometheus has scraped the final values (Ray pushes every 1 s, scrapes every 3 s)."""
    got, _, _ = poll(read, lambda got: got == expected, CONVERGE_S, interval_s=0.5)
    assert got == expected, (f"{what}: Prometheus has {got}, the client saw {expected} "
                             f"(scrapes: {prometheus.scrape_health()})")


def _count(prometheus: PrometheusServer, promql: str) -> int | None:
    value = prometheus.scalar(promql)
    return None if value is None else int(round(value))


def test_prometheus_counts_what_the_client_saw(prometheus: PrometheusServer, traffic: Traffic) -> None:
    sel = f'application="{APP}"'
    _eventually(lambda: _count(prometheus, f"sum(ray_siglip_images_embedded_total{{{sel}}})"),
                traffic.images_embedded, "images embedded", prometheus)

    def by_reason() -> dict[str, int]:
        query = f"sum by (reason) (ray_siglip_requests_rejected_total{{{sel}}})"
        return {r["metric"]["reason"]: int(float(r["value"][1])) for r in prometheus.query(query)["result"]}

    # Every reason is exported from the start, at 0 until it happens (or rate() would miss it).
    expected = {reason.value: traffic.rejected.get(reason.value, 0) for reason in ErrorType}
    assert set(traffic.rejected) <= set(expected)
    _eventually(by_reason, expected, "rejections by reason", prometheus)

    # The other series agree with the same traffic.
    endpoints = {r["metric"]["endpoint"]: int(float(r["value"][1])) for r in prometheus.query(
        f'sum by (endpoint) (ray_siglip_request_seconds_count{{{sel}, status="200"}})')["result"]}
    assert endpoints == traffic.good_by_endpoint
    _eventually(lambda: _count(prometheus, f"sum(ray_siglip_encoder_images_total{{{sel}}})"),
                traffic.images_embedded, "images through the encoders", prometheus)
    _eventually(lambda: _count(prometheus, f"sum(ray_siglip_preprocess_seconds_count{{{sel}}})"),
                traffic.images_embedded, "images preprocessed (every accepted image, once)", prometheus)
    forwards = _count(prometheus, f"sum(ray_siglip_encoder_forward_seconds_count{{{sel}}})")
    assert forwards == _count(prometheus, f"sum(ray_siglip_batch_fill_ratio_count{{{sel}}})")
    assert forwards is not None and forwards <= traffic.images_embedded
    cores = {r["metric"]["neuron_core"] for r in prometheus.query(
        f"ray_siglip_encoder_images_total{{{sel}}}")["result"]}
    assert cores == {"none"}  # CPU replicas here; on Neuron it is NEURON_RT_VISIBLE_CORES


def test_the_interactive_lane_meets_one_ingress_replica_and_the_other_lanes_the_other(
        serve_cluster: ServeCluster, prometheus: PrometheusServer, traffic: Traffic) -> None:
    """interactive_ingress: HAProxy sends the key's own lane to the replica it keeps and the lanes X-Priority moves
    the key's requests down to (LANE_PRIORITIES) to the other, as Ray labels each replica's series."""
    if serve_cluster.front_end != "haproxy":
        pytest.skip("Serve's proxy keeps no ingress replica apart (`run` refuses interactive_ingress with it)")
    query = (f'sum by (lane, replica) (ray_{TENANT_REQUEST_SECONDS}_count{{application="{APP}", status="200"}})')

    def replicas_by_lane() -> dict[str, set[str]]:
        found: dict[str, set[str]] = collections.defaultdict(set)
        for row in prometheus.query(query)["result"]:
            found[row["metric"]["lane"]].add(row["metric"]["replica"])
        return dict(found)

    lanes, _, _ = poll(replicas_by_lane, lambda got: set(got) == set(LANE_NAMES), CONVERGE_S, interval_s=0.5)
    assert set(lanes) == set(LANE_NAMES), lanes
    assert len(lanes["interactive"]) == 1 and len(lanes["default"] | lanes["bulk"]) == 1
    assert lanes["interactive"].isdisjoint(lanes["default"] | lanes["bulk"])


def test_the_interactive_lane_meets_the_kept_encoder_replica_and_no_other_lane_does(
        prometheus: PrometheusServer, traffic: Traffic) -> None:
    """interactive_encoder: every image of the interactive lane ran on the replica kept for it, and every other
    lane's on the other, as Ray labels each deployment's series (the ingress picks by lane, Serve routes within the
    deployment its handle names)."""
    query = f'sum by (deployment) (ray_siglip_encoder_images_total{{application="{APP}"}})'
    interactive = traffic.images_by_lane.get("interactive", 0)
    expected = {"InteractiveEncoder": interactive, "Encoder": traffic.images_embedded - interactive}
    assert min(expected.values()) > 0, traffic.images_by_lane

    def by_deployment() -> dict[str, int]:
        return {r["metric"]["deployment"]: int(float(r["value"][1])) for r in prometheus.query(query)["result"]}

    _eventually(by_deployment, expected, "images by encoder deployment", prometheus)


def test_every_dashboard_query_runs_and_ours_return_data(serve_cluster: ServeCluster, prometheus: PrometheusServer,
                                                         traffic: Traffic) -> None:
    _eventually(lambda: _count(prometheus, f'sum(ray_siglip_images_embedded_total{{application="{APP}"}})'),
                traffic.images_embedded, "images embedded", prometheus)
    exported = set(prometheus.client.get("/api/v1/label/__name__/values").json()["data"])
    problems = []
    queries = dashboard_queries()
    for query in queries:
        expr = substitute(query.expr)
        try:
            result = prometheus.query(expr)["result"]  # a parse error raises here, neuron-monitor's too
        except ValueError as exc:
            problems.append(f"{query.panel}: {exc}")
            continue
        if query.from_neuron_monitor or (query.from_haproxy and serve_cluster.front_end != "haproxy"):
            continue  # no neuron-monitor on this machine (no HAProxy with the python front end): it must parse
        missing = {name for name in query.names if name not in exported}
        values = [float(r["value"][1]) for r in result]
        if missing:
            problems.append(f"{query.panel}: metrics Prometheus does not have: {sorted(missing)}")
        elif not any(math.isfinite(v) for v in values):
            problems.append(f"{query.panel}: no data ({values}) for {expr}")
    assert not problems, "\n".join([*problems, f"scrapes: {prometheus.scrape_health()}"])
    assert sum(q.from_neuron_monitor for q in queries) >= 2 and sum(q.from_haproxy for q in queries) >= 4
    if serve_cluster.front_end == "haproxy":
        # The header flood the traffic sent was refused by HAProxy itself, and its exporter counted it.
        refused = prometheus.scalar('sum(haproxy_frontend_request_errors_total{proxy="http_frontend"})')
        assert refused is not None and refused >= traffic.front_door_refused > 0

    variable = dashboard()["templating"]["list"][0]["definition"]
    selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable).groups()
    values = prometheus.client.get(f"/api/v1/label/{label}/values", params={"match[]": selector}).json()["data"]
    assert APP in values


def _families(text: str, prefix: str) -> str:
    """The exposition lines (HELP, TYPE, samples) of the metric families named prefix*."""
    keep = [line for line in text.splitlines()
            if re.match(rf"^(?:# (?:HELP|TYPE) )?{prefix}\w*", line)]
    return "\n".join(keep) + "\n"


def _drop_labels(text: str, labels: frozenset[str]) -> str:
    pair = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

    def rewrite(match: re.Match[str]) -> str:
        kept = [m.group(0) for m in pair.finditer(match.group(1)) if m.group(1) not in labels]
        return "{" + ",".join(kept) + "}"

    return re.sub(r"\{(.*)\}", rewrite, text)


def test_promtool_finds_no_problems_in_our_series(serve_cluster: ServeCluster, traffic: Traffic) -> None:
    exposition = httpx.get(f"http://127.0.0.1:{serve_cluster.metrics_port}/metrics", timeout=30).text
    ours = _families(exposition, "ray_siglip_")
    present = set(re.findall(r"^# TYPE (ray_siglip_\w+) ", ours, re.M))
    assert present == {f"ray_{name}" for name in METRIC_NAMES}, present

    # Ray adds camelCase labels of its own to every series it exports, Ray Serve's included.
    camel = {k for k in re.findall(r'(\w+)="', ours) if re.search(r"[a-z][A-Z]", k)}
    serve_labels = set(re.findall(r'(\w+)="', _families(exposition, "ray_serve_num_http_requests")))
    assert camel <= RAY_GLOBAL_LABELS & serve_labels, camel

    done = subprocess.run(["promtool", "check", "metrics"], input=_drop_labels(ours, RAY_GLOBAL_LABELS),
                          capture_output=True, text=True)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr
