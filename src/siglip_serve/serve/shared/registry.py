"""Which tower replicas (image and text) are alive and what each sees (its tower, backend,
NEURON_RT_VISIBLE_CORES, node, warm-up).

Serve's handle routes to any replica, so the ingress cannot ask each one directly. Instead each
replica writes a record into Ray's GCS key-value store when it has warmed up (serve/towers/tower_replica.py),
keyed by its replica id, which is also its actor name; a record counts only while that actor is alive.
"""

from __future__ import annotations

import json
from typing import Any

import ray
from ray.experimental import internal_kv

_NAMESPACE = "siglip_serve"
# The key of a replica's served model (the name requests' `model` gives) in its record.
SERVED_AS = "served_as"
# The key of a replica's deployment's name: which of a tower's deployments it runs in (`interactive_encoder`).
DEPLOYMENT = "deployment"
_PREFIX = "replica/"


def _key(app_name: str, replica_actor_name: str) -> str:
    return f"{_PREFIX}{app_name}/{replica_actor_name}"


def register_replica(app_name: str, replica_actor_name: str, info: dict[str, Any]) -> None:
    internal_kv._internal_kv_put(
        _key(app_name, replica_actor_name), json.dumps(info), overwrite=True, namespace=_NAMESPACE
    )


def unregister_replica(app_name: str, replica_actor_name: str) -> None:
    internal_kv._internal_kv_del(_key(app_name, replica_actor_name), namespace=_NAMESPACE)


def live_replicas(app_name: str, tower: str | None = None) -> list[dict[str, Any]]:
    """Records of replicas whose actors are alive now (of `tower` only, when given), sorted by replica id."""
    alive = {entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)}
    prefix = f"{_PREFIX}{app_name}/"
    records = []
    for raw_key in internal_kv._internal_kv_list(prefix, namespace=_NAMESPACE):
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        actor_name = key[len(prefix):]
        if actor_name not in alive:
            internal_kv._internal_kv_del(key, namespace=_NAMESPACE)  # a replica that died
            continue
        raw = internal_kv._internal_kv_get(key, namespace=_NAMESPACE)
        if raw is not None:
            records.append(json.loads(raw))
    if tower is not None:
        records = [record for record in records if record_tower(record) == tower]
    return sorted(records, key=lambda r: str(r.get("replica_id")))


# A replica that refused to start (serve/towers/replica_start.py) leaves its one line here, per tower, for
# /readyz to show beside the counts; the tower's next warm replica clears it.
_REFUSED = "refused/"


def record_refusal(app_name: str, tower: str, message: str) -> None:
    internal_kv._internal_kv_put(f"{_REFUSED}{app_name}/{tower}", message, overwrite=True, namespace=_NAMESPACE)


def clear_refusal(app_name: str, tower: str) -> None:
    internal_kv._internal_kv_del(f"{_REFUSED}{app_name}/{tower}", namespace=_NAMESPACE)


def refusal(app_name: str, tower: str) -> str | None:
    """The last refusal of one of `tower`'s replicas since one last warmed up, or None."""
    raw = internal_kv._internal_kv_get(f"{_REFUSED}{app_name}/{tower}", namespace=_NAMESPACE)
    return raw.decode() if isinstance(raw, bytes) else raw


def record_tower(record: dict[str, Any]) -> str:
    """The tower a replica's record is of (records written before text replicas registered: image)."""
    return str(record.get("tower", "image"))


# Graceful shutdown: `siglip-serve run` marks an application draining on SIGTERM; each ingress
# replica sees the mark within a poll period, answers /readyz and new requests with 503, and
# publishes how many accepted requests it still holds, so the runner can stop Serve once all are 0.
_DRAIN = "drain/"


def set_draining(app_name: str) -> None:
    internal_kv._internal_kv_put(f"{_DRAIN}{app_name}", "1", overwrite=True, namespace=_NAMESPACE)


def clear_draining(app_name: str) -> None:
    internal_kv._internal_kv_del(f"{_DRAIN}{app_name}", namespace=_NAMESPACE)
    for key in internal_kv._internal_kv_list(f"{_DRAIN}{app_name}/", namespace=_NAMESPACE):
        internal_kv._internal_kv_del(key, namespace=_NAMESPACE)


def is_draining(app_name: str) -> bool:
    return internal_kv._internal_kv_get(f"{_DRAIN}{app_name}", namespace=_NAMESPACE) is not None


def publish_in_flight(app_name: str, replica: str, requests: int, at: float) -> None:
    internal_kv._internal_kv_put(f"{_DRAIN}{app_name}/{replica}", json.dumps({"requests": requests, "at": at}),
                                 overwrite=True, namespace=_NAMESPACE)


def in_flight(app_name: str) -> list[dict[str, float]]:
    """What each draining ingress replica last published: {"requests": n, "at": time.time()}."""
    out = []
    for key in internal_kv._internal_kv_list(f"{_DRAIN}{app_name}/", namespace=_NAMESPACE):
        raw = internal_kv._internal_kv_get(key, namespace=_NAMESPACE)
        if raw is not None:
            out.append(json.loads(raw))
    return out
