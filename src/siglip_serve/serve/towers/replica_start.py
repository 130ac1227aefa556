"""How a tower's replica, or a bulk job's embed actor, starts on its own node: the backend's environment
set before torch is imported, then the weights and the tower, every refusal one line naming the node.

The application's builder and a job's driver run on the Ray head, which under KubeRay is a pod of its
own: it need not mount the artifacts, hold the weights' cache or reach the model hub. So they check the
configuration's shape only, and what needs the model's files is read and checked here, where it is
used. A refusal is raised as ReplicaRefused: Serve shows its text in the deployment's status and stops
retrying once the replicas have failed to start `min(max_constructor_retry_count, 3 x replicas)` times
(ray/serve/_private/deployment_state.py: _failed_to_start_threshold, _replica_startup_failing); the
ingress shows it in /readyz's body (serve/shared/registry.py record_refusal).

One refusal is waited out instead: a served replica under KubeRay whose artifact volume is missing or
empty (models/backends/compiled.py volume_refusal). The fix is on the volume, not in the config, and a
deployment Serve has given up on is started again only by a changed config (KubeRay resubmits only a
changed serveConfigV2), so a replica that failed would leave the service down after the volume is
filled. Waiting in the constructor is safe: Serve sets no limit on it (deployment_state.py only warns
after SLOW_STARTUP_WARNING_S) and counts no failure; the refusal stays in /readyz until a replica warms up.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TypeVar

from siglip_serve.core.errors import UserError
from siglip_serve.models.settings import ModelSettings

log = logging.getLogger("siglip_serve.replica")

T = TypeVar("T")

# How often a replica waiting for its artifact volume looks again: a stat of one directory.
VOLUME_POLL_S = 5.0


class ReplicaRefused(UserError, RuntimeError):
    """This replica cannot start on this node: one line saying where, why, and the fix."""


def node_name() -> str:
    """This node as a person finds it: the hostname (a pod's name under KubeRay) and Ray's node IP."""
    host = socket.gethostname()
    try:
        import ray

        address = ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # broad on purpose: only a label; the refusal must still be raised
        address = None
    return f"{host} ({address})" if address and address != host else host


def _volume_missing(settings: ModelSettings) -> bool:
    from siglip_serve.core.backends import backend_record
    from siglip_serve.models.backends.compiled import volume_refusal

    if settings.artifact_dir is None or not backend_record(settings.backend).reads_artifact:
        return False
    return volume_refusal(Path(settings.artifact_dir).expanduser().resolve()) is not None


def start_tower(what: str, settings: ModelSettings, build: Callable[[], T], keep_env: Collection[str] = (),
                on_refusal: Callable[[str], None] | None = None, wait_for_volume: bool = False) -> T:
    """`build()` (which imports torch) after this process's backend environment is set and its weights
    are found; any UserError on the way as ReplicaRefused, one line naming `what`, this node and the fix,
    also passed to `on_refusal`. With `wait_for_volume`, a missing or empty artifact volume under KubeRay
    is refused the same way and then looked at again every VOLUME_POLL_S until it is there. Call it first
    in the constructor, before anything imports torch."""
    from siglip_serve.models.backends.implementation import apply_replica_env

    told = ""
    while True:
        # Looked at before and after the attempt: a volume filled while the attempt ran is tried again.
        was_missing = wait_for_volume and _volume_missing(settings)
        try:
            apply_replica_env(settings, keep_env)
            from siglip_serve.serve.plan.model_checks import preflight_weights

            preflight_weights(settings)
            return build()
        except UserError as exc:
            message = f"{what} on node {node_name()} refused to start: {' '.join(str(exc).split())}"
            if message != told:
                log.error("%s", message)
                if on_refusal is not None:
                    on_refusal(message)
                told = message
            if not (was_missing or (wait_for_volume and _volume_missing(settings))):
                raise ReplicaRefused(message) from None
            time.sleep(VOLUME_POLL_S)
