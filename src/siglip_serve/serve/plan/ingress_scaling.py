"""The ingress's autoscaling signal and policy: scale on the host cores each ingress replica keeps busy.

Serve's default policy scales on the requests a replica holds. For the ingress that misreads a busy
device as a busy ingress: behind a saturated encoder, requests wait at every ingress replica, and more
ingress replicas would only take host cores (on cpu, from the encoders). What limits an ingress is its
own CPU (HTTP, JSON, decoding), so each replica reports the cores its process used since its last
report (Serve 2.60 calls `record_autoscaling_stats` on a replica of an autoscaled deployment:
ray/serve/_private/replica.py) and this policy asks for the replicas that put each at the target.
Serve wraps a custom policy with the config's bounds and delays (ray/serve/autoscaling_policy.py,
_apply_autoscaling_config), as for its own.

Serve pickles this module by value into its controller: it imports nothing of ours and nothing heavy.
"""

from __future__ import annotations

import math
import time
from typing import Any

BUSY_CORES = "busy_cores"
POLICY_PATH = "siglip_serve.serve.plan.ingress_scaling:BusyCoresPolicy"


def policy(target_busy_cores: float) -> dict[str, Any]:
    """The `policy` entry of an ingress's autoscaling_config."""
    return {"policy_function": POLICY_PATH, "policy_kwargs": {"target_busy_cores": target_busy_cores}}


class BusyCores:
    """Cores this process used between two reads (process CPU time over wall time). The first read
    only starts the count: before it the replica was starting (imports, warm-up, Serve's own set-up),
    which is no load and would scale a fresh deployment out at once."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def read(self) -> float:
        now = (time.monotonic(), time.process_time())
        last, self._last = self._last, now
        if last is None:
            return 0.0
        return (now[1] - last[1]) / max(now[0] - last[0], 1e-6)


class BusyCoresPolicy:
    """Desired ingress replicas: the cores all of them keep busy over the target per replica."""

    def __init__(self, target_busy_cores: float) -> None:
        self.target = target_busy_cores

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        busy = (ctx.aggregated_metrics or {}).get(BUSY_CORES) or {}
        if ctx.current_num_replicas == 0 or not busy:
            return ctx.target_num_replicas, {}
        # A replica without a report yet (just started) counts as busy as the average of the others.
        mean = sum(busy.values()) / len(busy)
        total = mean * ctx.current_num_replicas
        if not math.isfinite(total):
            return ctx.target_num_replicas, {}
        return total / self.target, {}
