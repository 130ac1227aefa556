"""How a tower's replica, or a bulk job's embed actor, starts on its own node: the backend's environment
set before torch is imported, then the weights and the tower, every refusal one line naming the node.

The application's builder and a job's driver run on the Ray head, which under KubeRay is a pod of its
own: it need not mount the artifacts, hold the weights' cache or reach the model hub. So they check the
configuration's shape only, and what needs the model's files is read and checked here, where it is
used. A refusal is raised as ReplicaRefused: Serve shows its text in the deployment's status and stops
retrying once the replicas have failed to start `min(max_constructor_retry_count, 3 x replicas)` times
(ray/serve/_private/deployment_state.py: _failed_to_start_threshold, _replica_startup_failing); the
ingress shows it in /readyz's body (serve/shared/registry.py record_refusal).

One refusal is waited out instead: a served replica under KubeRay whose artifact volume is missing,
empty or not yet whole (models/backends/artifact_volume.py). The fix is on the volume, not in the config, and a
deployment Serve has given up on is started again only by a changed config (KubeRay resubmits only a
changed serveConfigV2), so a replica that failed would leave the service down after the volume is
filled. So the served replica waits before it constructs anything (`wait_for_artifact`): Serve sets no
limit on a constructor (deployment_state.py only warns after SLOW_STARTUP_WARNING_S) and counts no
failure while it runs. The wait is a coroutine that sleeps with asyncio: under
RAY_SERVE_THROUGHPUT_OPTIMIZED=1, which both KubeRay manifests set, Serve runs user code on the replica
actor's own event loop (constants.py: RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD defaults to 0 then), and
a blocking wait there would hold up the controller's calls to the replica, its stop included. After
SLOW_STARTUP_WARNING_S Serve shows its own slow-start text in the deployment's status, so the reason is
kept in /readyz and logged every VOLUME_LOG_S.
"""

from __future__ import annotations

import asyncio
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

# How often a replica waiting for its artifact volume looks again (a stat per file the manifest lists),
# and how often it says again why it waits.
VOLUME_POLL_S = 5.0
VOLUME_LOG_S = 60.0


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


def _volume_refusal(settings: ModelSettings) -> str | None:
    from siglip_serve.core.backends import backend_record
    from siglip_serve.models.backends.artifact_volume import volume_refusal

    if settings.artifact_dir is None or not backend_record(settings.backend).reads_artifact:
        return None
    return volume_refusal(Path(settings.artifact_dir).expanduser().resolve())


async def wait_for_artifact(what: str, settings: ModelSettings,
                            on_refusal: Callable[[str], None] | None = None) -> None:
    """Return once this replica's artifact volume is there and whole (at once where it is, or outside
    KubeRay); until then say why, in the log and through `on_refusal`, first and every VOLUME_LOG_S, and
    look again every VOLUME_POLL_S. Each look and each `on_refusal` runs off the event loop."""
    told_at = None
    while (reason := await asyncio.to_thread(_volume_refusal, settings)) is not None:
        if told_at is None or time.monotonic() - told_at >= VOLUME_LOG_S:
            message = f"{what} on node {node_name()} waiting: {' '.join(reason.split())}"
            log.warning("%s", message)
            if on_refusal is not None:
                await asyncio.to_thread(on_refusal, message)
            told_at = time.monotonic()
        await asyncio.sleep(VOLUME_POLL_S)


def volume_unready(settings: ModelSettings) -> bool:
    """The artifact volume is missing, empty or not whole (under KubeRay, for a backend that reads one)."""
    return _volume_refusal(settings) is not None


def start_tower(what: str, settings: ModelSettings, build: Callable[[], T], keep_env: Collection[str] = (),
                on_refusal: Callable[[str], None] | None = None) -> T:
    """`build()` (which imports torch) after this process's backend environment is set and its weights
    are found; any UserError on the way as ReplicaRefused, one line naming `what`, this node and the fix,
    also passed to `on_refusal`. Call it first in the constructor, before anything imports torch."""
    from siglip_serve.models.backends.implementation import apply_replica_env

    try:
        apply_replica_env(settings, keep_env)
        from siglip_serve.serve.plan.model_checks import preflight_weights

        preflight_weights(settings)
        return build()
    except UserError as exc:
        message = f"{what} on node {node_name()} refused to start: {' '.join(str(exc).split())}"
        log.error("%s", message)
        if on_refusal is not None:
            on_refusal(message)
        raise ReplicaRefused(message) from None
