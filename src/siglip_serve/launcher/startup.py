"""The start-up window of `siglip-serve run`: answer probes at once, and say how far loading has got.

Ray takes tens of seconds to start and the replicas as long again to load and warm. Until Serve's
proxy takes the HTTP port over, a placeholder on that port answers every request at once with the
contract's 503 `not_ready` (GET /healthz: 200, the process is up), so a probe gets an answer
instead of a refused or hanging connection. While the application deploys, a line every few
seconds says how many encoder replicas are warm.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("siglip_serve")

PROGRESS_EVERY_S = 5.0
# How long a placeholder connection waits for the client to close first (see _Handler.finish).
_CLIENT_CLOSE_WAIT_S = 1.0


class _StagedServer(ThreadingHTTPServer):
    """The placeholder's server, carrying the start-up stage its 503s name."""

    stage = "starting Ray"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "siglip-serve"
    server: _StagedServer

    def _answer(self) -> None:
        body: dict[str, object]
        headers: dict[str, str]
        if self.path.split("?")[0] == "/healthz":
            status, body, headers = 200, {"status": "starting"}, {}
        else:
            status = 503
            body = {"error": {"message": f"starting: {self.server.stage}; retry later",
                              "type": "not_ready", "code": 503}}
            headers = {"Retry-After": "1"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _answer

    def finish(self) -> None:
        # Let the client close first, so the TIME_WAIT lands on its side: Serve's proxy binds this
        # port afterwards without SO_REUSEADDR, and a TIME_WAIT here would make that bind fail.
        # A client that does not close in time is reset (linger 0), which leaves no TIME_WAIT.
        super().finish()
        try:
            self.connection.settimeout(_CLIENT_CLOSE_WAIT_S)
            while self.connection.recv(4096):
                pass
        except OSError:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def log_message(self, format: str, *args: Any) -> None:  # `format`: the base class names it so
        pass  # probes every second during start-up; not worth a line each


class Placeholder:
    """Binds `host:port` now and answers 503 until `release()` hands the port to Serve's front end.
    `reuse_address`: bind as that front end will (launcher/preflight.py, port_in_use)."""

    def __init__(self, host: str, port: int, reuse_address: bool = False) -> None:
        self.server = _StagedServer((host, port), _Handler, bind_and_activate=False)
        self.server.allow_reuse_address = reuse_address
        self.server.daemon_threads = True
        try:
            self.server.server_bind()
            self.server.server_activate()
        except OSError as exc:
            self.server.server_close()
            from siglip_serve.launcher.preflight import PortUnavailable

            raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror} (pass --port N)") from None
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="startup-placeholder")
        self._thread.start()

    def set_stage(self, stage: str) -> None:
        self.server.stage = stage

    def release(self) -> None:
        if not self._thread.is_alive():
            return
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def replica_progress(app_name: str, expected: int | None) -> str:
    """'encoder 1/4 warm (3 starting)' from Serve's status and the replicas' warm-up records."""
    from ray import serve

    from siglip_serve.serve.shared import registry

    status = serve.status().applications.get(app_name)
    if status is None:
        return "deploying the application"
    parts = []
    for name, deployment in status.deployments.items():
        states = {str(getattr(k, "value", k)): v for k, v in deployment.replica_states.items()}
        running, total = states.get("RUNNING", 0), sum(states.values())
        parts.append(f"{name} {running}/{total} running")
    warm = len(registry.live_replicas(app_name, "image"))
    return f"{warm}/{expected if expected is not None else '?'} encoder replicas warm; " + ", ".join(parts)


def wait_with_progress(deploy: Callable[[], object], app_name: str, expected: int | None,
                       stop: threading.Event, began: float) -> bool:
    """Run `deploy` (blocks until the application runs) in a thread, logging progress every few
    seconds. True once deployed; False when `stop` was set first. Re-raises deploy's error."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            deploy()
        except BaseException as exc:  # broad on purpose: handed to the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=target, daemon=True, name="serve-deploy")
    worker.start()
    while worker.is_alive():
        worker.join(PROGRESS_EVERY_S)
        if worker.is_alive():
            if stop.is_set():
                return False
            try:
                line = replica_progress(app_name, expected)
            except Exception as exc:  # broad on purpose: progress is best effort; the deploy decides
                line = f"deploying ({type(exc).__name__})"
            log.info("%.0f s: %s", time.monotonic() - began, line)
    if errors:
        raise errors[0]
    return True
