"""A `siglip-serve run` that a measurement starts itself: waited for until ready, and stopped, the same way by every
tool that starts one (measure/lanes_service.py, tools/start_time.py, tools/deadline_burst.py)."""

from __future__ import annotations

import signal
import subprocess

from siglip_serve.core.errors import UserError


class ServiceFailed(UserError, RuntimeError):
    """The service a measurement started exited, or was not ready in time; the message says which."""


def wait_ready(proc: subprocess.Popen[bytes] | subprocess.Popen[str], url: str, timeout_s: float,
               interval_s: float = 0.5) -> float:
    """Seconds until GET `url` (its /readyz) answered 200, asked every `interval_s`; ServiceFailed if the service
    exits first or is not ready within `timeout_s`."""
    import httpx

    from siglip_serve.core.poll import poll

    def ready() -> bool:
        if proc.poll() is not None:
            raise ServiceFailed(f"siglip-serve run exited with code {proc.returncode} before it was ready")
        try:
            return httpx.get(url, timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    _, done, waited = poll(ready, bool, timeout_s, interval_s=interval_s)
    if not done:
        raise ServiceFailed(f"siglip-serve run was not ready within {timeout_s:.0f} s ({url})")
    return waited


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 120,
         signum: signal.Signals = signal.SIGINT) -> None:
    """`signum` (SIGINT: as Ctrl-C stops a service; SIGTERM: as a supervisor does), then SIGKILL after `timeout_s`;
    nothing where it exited already."""
    if proc.poll() is not None:
        return
    proc.send_signal(signum)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
