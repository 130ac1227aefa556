"""A service a measurement starts itself (measure/service_process.py): waited for until /readyz answers 200, refused
at once where it exits first, and stopped by the signal asked for, then killed where it ignores it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from siglip_serve.measure.service_process import ServiceFailed, stop, wait_ready
from tests.bounds import scaled


class _ReadyOnThird(BaseHTTPRequestHandler):
    asked = 0

    def do_GET(self) -> None:
        type(self).asked += 1
        self.send_response(200 if type(self).asked >= 3 else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # `format`: the base class names it so
        pass


def test_ready_once_readyz_answers_200_and_refused_once_the_service_exits() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ReadyOnThird)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
        assert wait_ready(alive, url, scaled(30), interval_s=0.05) >= 0 and _ReadyOnThird.asked == 3
        gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        gone.wait()
        with pytest.raises(ServiceFailed, match="exited with code 3 before it was ready"):
            wait_ready(gone, url, scaled(30))
    finally:
        server.shutdown()
        stop(alive, timeout_s=scaled(30))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_sends_its_signal_then_kills_what_ignores_it(signum: signal.Signals) -> None:
    # Its signal's default action set first: a child inherits an ignored SIGINT (a pytest-xdist worker's, say), and
    # Python then installs no KeyboardInterrupt handler of its own.
    default = "signal.default_int_handler" if signum == signal.SIGINT else "signal.SIG_DFL"
    polite = subprocess.Popen([sys.executable, "-c", f"import signal, time; signal.signal({int(signum)}, {default}); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert polite.stdout is not None and polite.stdout.readline() == b"ready\n"
    stop(polite, timeout_s=scaled(30), signum=signum)
    assert polite.returncode == -signum  # an unhandled KeyboardInterrupt exits by SIGINT too
    deaf = subprocess.Popen([sys.executable, "-c", f"import signal, time; signal.signal({int(signum)}, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"
    stop(deaf, timeout_s=0.5, signum=signum)
    assert deaf.returncode == -signal.SIGKILL
    stop(deaf)  # exited already: nothing to do
