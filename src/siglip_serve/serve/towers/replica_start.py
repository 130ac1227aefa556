"""How a tower's replica, or a bulk job's embed actor, starts on its own node: the backend's environment
set before torch is imported, then the weights and the tower, every refusal one line naming the node.

The application's builder and a job's driver run on the Ray head, which under KubeRay is a pod of its
own: it need not mount the artifacts, hold the weights' cache or reach the model hub. So they check the
configuration's shape only, and what needs the model's files is read and checked here, where it is
used. A refusal is raised as ReplicaRefused: Serve shows its text in the deployment's status and stops
retrying once the replicas have failed to start `min(max_constructor_retry_count, 3 x replicas)` times
(ray/serve/_private/deployment_state.py: _failed_to_start_threshold, _replica_startup_failing); the
ingress shows it in /readyz's body (serve/shared/registry.py record_refusal).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Collection
from typing import TypeVar

from siglip_serve.core.errors import UserError
from siglip_serve.models.settings import ModelSettings

log = logging.getLogger("siglip_serve.replica")

T = TypeVar("T")


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
