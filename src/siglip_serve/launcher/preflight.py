"""Checks `siglip-serve run` makes before it starts Ray, each failing in one line.

Ports: Ray Serve's proxy binds its HTTP port with SO_REUSEPORT by default, so a second instance on
a taken port starts anyway and the kernel splits traffic between the two. Ray's metrics exporter
on a taken port fails only after Ray's node start-up times out (~45 s), with the cause in a log
file. Both are checked here by binding the port on the host that will bind it, with the socket
options its listener binds with, and port sharing is switched off for the proxy this command starts.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
from collections.abc import MutableMapping
from pathlib import Path

from siglip_serve.core.constants import VISIBLE_CORES_ENV, expand_visible_cores
from siglip_serve.core.errors import UserError

log = logging.getLogger("siglip_serve")

# Read by Ray Serve's proxy at import (ray/serve/_private/proxy.py, Ray 2.60; default "1"). Set in
# this process before ray.init, so the local raylet, and the proxy actor it starts, inherit it.
REUSE_PORT_ENV = "SERVE_SOCKET_REUSE_PORT_ENABLED"
# The node IP of a local Ray started by `siglip-serve run`. Its ports do not all stay on it: with
# Ray 2.60 the metrics exporter, GCS, raylet and worker gRPC ports listen on every interface (seen
# with `ss -ltnp`), so the metrics port is checked on all of them.
RAY_HOST = "127.0.0.1"
METRICS_CHECK_HOST = "0.0.0.0"

class VisibleCoresRefused(UserError, ValueError):
    """NEURON_RT_VISIBLE_CORES cannot be what the Ray this command starts declares."""


def ray_visible_cores(neuron_cores: int | None, env: MutableMapping[str, str] | None = None) -> str | None:
    """Make NEURON_RT_VISIBLE_CORES a comma list before Ray starts, or refuse in one line.

    The Neuron runtime takes ranges ("0-3", "0-1,4"), but Ray splits the variable on commas only
    (ray/_private/accelerators/neuron.py, get_current_process_visible_accelerator_ids): "0-3" is one
    core to it, and a raylet declaring more neuron_cores than that list refuses to start
    (resource_and_label_spec.py: "Attempting to start raylet with N neuron_cores, but
    NEURON_RT_VISIBLE_CORES contains [...]"). A range is expanded in place (the same cores for the
    runtime); the new value is returned, None where nothing changed.
    """
    env = os.environ if env is None else env
    raw = env.get(VISIBLE_CORES_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        cores = expand_visible_cores(raw)
    except ValueError as exc:
        raise VisibleCoresRefused(f"{exc}; set it to core indices and ranges like 0-3 or 0,1,4, or unset it") from None
    if neuron_cores and neuron_cores > len(cores):
        raise VisibleCoresRefused(f"--neuron-cores {neuron_cores} declares more NeuronCores than {VISIBLE_CORES_ENV}="
                                  f"{raw} names ({len(cores)}); declare at most {len(cores)} or widen the variable")
    listed = ",".join(map(str, cores))
    if listed == raw.replace(" ", ""):
        return None
    env[VISIBLE_CORES_ENV] = listed
    log.info("%s=%s expanded to %s for Ray, which splits it on commas only", VISIBLE_CORES_ENV, raw, listed)
    return listed


class PortUnavailable(UserError, RuntimeError):
    """A port `siglip-serve run` needs is taken or not allowed; the message says which and what to do."""


def port_in_use(host: str, port: int, reuse_address: bool = True) -> bool:
    """True when `host:port` cannot be bound as its listener binds it: taken.

    `reuse_address`: the listener sets SO_REUSEADDR, as HAProxy does on every listener (src/sock_inet.c,
    sock_inet_bind_receiver) and Ray's metrics exporter does (wsgiref's server, an http.server.HTTPServer:
    allow_reuse_address). Then only a listening socket refuses the bind; the TIME_WAIT sockets of the
    connections a previous run closed first (a burst's, right before a restart) do not, for they carry the
    option of the listener they were accepted from. Without it, a plain bind, as Serve's proxy binds with
    port sharing off (ray/serve/_private/http_util.py, start_asgi_http_server): those sockets refuse it too.
    The check never sets SO_REUSEPORT, so a listener that did still refuses it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise PortUnavailable(f"cannot bind {host}:{port}: {exc.strerror}") from None
    return False


def check_ports(host: str, port: int, metrics_host: str, metrics_port: int | None,
                haproxy_metrics_port: int | None = None, front_end: str = "haproxy") -> None:
    """Refuse a taken HTTP, metrics or HAProxy-metrics port before anything starts. `front_end`: who listens
    on the HTTP port, HAProxy ("haproxy") or Serve's proxy ("python"), which bind it differently."""
    if port_in_use(host, port, reuse_address=front_end != "python"):
        closing = (" or still closing the connections of a run just stopped (up to a minute: Serve's proxy cannot "
                   "bind over them; the default --front-end haproxy can)") if front_end == "python" else ""
        raise PortUnavailable(f"port {port} on {host} is already in use (another siglip-serve or Ray Serve?{closing}); "
                              f"stop it or pass --port N (make serve PORT=N)")
    if metrics_port:
        if metrics_port == port:
            raise PortUnavailable(f"--metrics-port {metrics_port} is the HTTP port; pick another")
        if port_in_use(metrics_host, metrics_port):
            raise PortUnavailable(f"metrics port {metrics_port} is already in use on this host; "
                                  f"pass --metrics-port N (make serve METRICS_PORT=N)")
    if haproxy_metrics_port:
        if haproxy_metrics_port in (port, metrics_port):
            raise PortUnavailable(f"--haproxy-metrics-port {haproxy_metrics_port} is also the HTTP or metrics port; "
                                  "pick another")
        if port_in_use(metrics_host, haproxy_metrics_port):
            raise PortUnavailable(f"HAProxy's metrics port {haproxy_metrics_port} is already in use on this host "
                                  "(another siglip-serve?); pass --haproxy-metrics-port N, or 0 for any free port")


def disable_port_sharing() -> None:
    """No SO_REUSEPORT on the proxy this process's Ray starts: a second instance then fails to bind."""
    os.environ[REUSE_PORT_ENV] = "0"


# A port picked now for a listener that binds seconds later (HAProxy's stats and fallback ports, a test's
# service) must not be one an outgoing connection can take meanwhile: connections take their local port from
# the kernel's ephemeral range (ip(7), ip_local_port_range), and a listener cannot bind a port an established
# connection holds. Ray's workers bind 10002-19999 (`ray start`'s --min/max-worker-port defaults). So the
# pick comes from between the two; the kernel's own pick (port 0) only where that gap is missing.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTENER_PORTS_FROM = 20000


def listener_ports(range_file: Path = EPHEMERAL_RANGE_FILE) -> range | None:
    """The ports free_port picks from: above Ray's worker ports, below the ephemeral range; None where the
    range cannot be read or leaves no gap."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LISTENER_PORTS_FROM, low) if low - LISTENER_PORTS_FROM >= 1000 else None


def free_port(host: str = "127.0.0.1", ports: range | None = None) -> int:
    """A port nothing on `host` listens on or holds now, from listener_ports() (else the kernel's pick)."""
    ports = ports or listener_ports()
    for port in random.sample(ports, min(len(ports), 64)) if ports else ():
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
