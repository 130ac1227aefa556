"""What the HTTP front end and the ingress agree on, with neither importing the other: how many requests an
ingress replica works on at once and how many may wait for it, and when a request's deadline began.

HAProxy (launcher/haproxy_front.py) holds the requests an ingress replica is not yet working on in its
own queue, where waiting costs no Python, and sheds the rest with 503 at once. The limits are the
application's (serve/ingress/front_door.py derives them from its config), so each ingress replica writes them
into a file per HAProxy backend; the HAProxy stand-in reads them each time Ray renders its config.

HAProxy stamps each request with the time it had the request's headers (`X-Request-Start: t=<ms since the
epoch>`); the ingress starts the request's deadline there, so time spent in HAProxy's queue counts.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from siglip_serve.core.constants import HAPROXY_LIMITS_DIR_ENV

# Directory of the per-backend limits files (`<backend>.json`), set by launcher/haproxy_front.py in the
# environment Ray starts with; unset, nothing is written (Serve's proxy, or no front end of ours).
LIMITS_DIR_ENV = HAPROXY_LIMITS_DIR_ENV
# The convention of Heroku's router and New Relic's agents ("t=" then a time since the epoch); HAProxy
# writes milliseconds. HAProxy replaces any value a client sends.
REQUEST_START_HEADER = "x-request-start"
# A client that stops sending (headers at HAProxy, `timeout http-request`; a body at the ingress) is cut
# after this long: a few seconds for what a client sends in one go, plus TCP retransmits (HAProxy's
# configuration manual on `timeout http-request`).
CLIENT_SEND_TIMEOUT_S = 10
# Serve's own request timeout (`http_options.request_timeout_s`), a backstop behind the ingress's deadline:
# it also bounds what Serve's proxy holds before the ingress sees a request (`--front-end python`, KubeRay).
# Serve answers it 408 in plain text; the ingress's 504 comes first for every request it has begun.
FRONT_END_TIMEOUT_MARGIN_S = 1.0
# HAProxy's queue gives a request at most its deadline (`timeout queue`), so a stamp older than that by
# more than this is a clock that disagrees (HAProxy on another node), not a wait: it is ignored.
CLOCK_SKEW_LIMIT_S = 5.0


@dataclass(frozen=True)
class FrontDoorLimits:
    """One application's limits, per ingress replica."""

    max_ongoing_requests: int  # requests it works on at once (HAProxy: each server's `maxconn`)
    max_queued_requests: int  # requests that may wait for it beyond those; past it, 503 at once
    request_timeout_s: float  # the deadline, from the stamp: also the longest wait in HAProxy's queue
    retry_after_s: int  # Retry-After of the 503
    # What one tenant's lane may hold of `max_ongoing_requests` beside others (core/lanes.py OTHERS_HOLD_S); None: no
    # cap. Only the ingress reads it: HAProxy does not know which server a request will meet.
    ongoing_beside_others: int | None = None
    # HAProxy keeps one of the backend's ingress replicas for the interactive lane (launcher/haproxy_front.py).
    interactive_server: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FrontDoorLimits:
        return cls(**json.loads(text))


def haproxy_backend_name(app_name: str) -> str:
    """The name Ray Serve 2.60 gives an HTTP application's HAProxy backend: "http-" + the app's name, made
    safe (ray/serve/_private/haproxy.py, `_generate_backend_name` and `get_safe_name`)."""
    name = f"http-{app_name}".replace("#", "-").replace("/", ".")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def limits_path(directory: str | Path, backend: str) -> Path:
    return Path(directory) / f"{backend}.json"


def lane_map_path(directory: str | Path, backend: str) -> Path:
    """HAProxy's map of each API key's sha256 to its default lane (core/lanes.py), beside the limits."""
    return Path(directory) / f"{backend}.lanes.map"


def write_limits(limits: FrontDoorLimits, app_name: str, directory: str | None = None,
                 lane_map: str | None = None) -> Path | None:
    """Write `limits` for `app_name`'s backend into the limits directory (None: the environment's; unset:
    nothing), and `lane_map` (serve/shared/tenants.py; None: no keys file, so none). Atomically: HAProxy's stand-in
    may read them at any moment."""
    directory = directory if directory is not None else os.environ.get(LIMITS_DIR_ENV)
    if not directory:
        return None
    backend = haproxy_backend_name(app_name)
    path = limits_path(directory, backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    maps = lane_map_path(directory, backend)
    if lane_map is not None:
        _write_atomically(maps, lane_map)
    else:
        maps.unlink(missing_ok=True)
    _write_atomically(path, limits.to_json())
    return path


def _write_atomically(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(text)
    scratch.replace(path)


def read_limits(directory: str | Path, backend: str) -> FrontDoorLimits | None:
    try:
        return FrontDoorLimits.from_json(limits_path(directory, backend).read_text())
    except (OSError, ValueError, TypeError):  # not written (yet), or not ours: the backend keeps Ray's settings
        return None


def waited_seconds(header: str | None, now_s: float, timeout_s: float) -> float | None:
    """Seconds since the front end stamped the request (`t=<ms>`), 0 without a usable stamp. A stamp in the
    future counts as now, so a client that writes its own can only shorten its deadline; None for one older
    than the deadline by more than CLOCK_SKEW_LIMIT_S: a clock that disagrees, which the caller reports."""
    if not header:
        return 0.0
    value = header.strip()
    if value.startswith("t="):
        value = value[2:]
    try:
        stamped_s = int(value) / 1000.0
    except ValueError:
        return 0.0
    waited = now_s - stamped_s
    if waited > timeout_s + CLOCK_SKEW_LIMIT_S:
        return None
    return max(0.0, waited)
