"""Changing the set of models while serving (`model_apps`: each model's towers in a Serve application of its own):
a third model is added, then removed, by applying the changed Serve config the way `serve deploy` does, while a
bounded load runs against the two that stay; their requests are all answered 200 and their tower replicas are the
same processes throughout. The session's Ray; loopback only."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.models.loading import load_embedder
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.served_models import model_app_name
from siglip_serve.serve.serve_yaml import model_apps_config
from tests.bounds import SETTLE_S, START_S, scaled
from tests.helpers import API_KEY, AUTH, BackgroundLoad, ServeCluster, TinyReference, delete_apps

FRONT = "swap"
ROUTE = "/swap"
STAYING = [{"name": "old", "model": "tiny-siglip", "text_replicas": 1},
           {"name": "new", "model": "tiny-siglip2", "seed": 1, "text_replicas": 0}]
THIRD = {"name": "third", "model": "tiny-siglip", "seed": 2, "text_replicas": 0}
# One ingress replica: only the surge planned for `model_apps` keeps it answering while it rolls.
ARGS = {"replicas": 1, "neuron_cores_per_replica": 0, "encoder_num_cpus": 0.25, "text_num_cpus": 0.25,
        "ingress_replicas": 1, "torch_threads": 1, "batch_wait_timeout_s": 0.01, "api_key": API_KEY}
LOAD_THREADS = 4


def apply(models: list[dict[str, Any]]) -> None:
    """What `serve deploy` does with the YAML (ray/dashboard/modules/serve/serve_head.py put_all_applications):
    start Serve or find it, then the controller's apply_config with the whole config; applications deployed
    declaratively and absent from it are deleted."""
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(model_apps_config(FRONT, ROUTE, {"models": models, **ARGS}))
    serve_start().deploy_apps(config)


def app_statuses() -> dict[str, str]:
    from ray import serve

    return {name: str(app.status) for name, app in serve.status().applications.items()}


def tower_processes(model: str) -> set[tuple[str, int]]:
    """(replica id, pid) of every live tower replica of `model`'s application."""
    from siglip_serve.serve.shared import registry

    return {(str(r["replica_id"]), int(r["pid"])) for r in registry.live_replicas(model_app_name(FRONT, model))}


def listed(client: httpx.Client) -> list[str] | None:
    try:
        answer = client.get("/v1/models")
    except httpx.TransportError:
        return None
    return [m["id"] for m in answer.json()["data"]] if answer.status_code == 200 else None


def settled(client: httpx.Client, names: list[str]) -> bool:
    """Every application of `names` running, no other of this service's, the ingress answering with `names`."""
    ours = {name: status for name, status in app_statuses().items() if name.startswith(FRONT)}
    want = {FRONT, *(model_app_name(FRONT, name) for name in names)}
    return (set(ours) == want and all(status.endswith("RUNNING") for status in ours.values())
            and listed(client) == names
            and client.get("/readyz").json().get("models") == {name: True for name in names})


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster) -> Iterator[httpx.Client]:
    from ray import serve

    apply(STAYING)
    with httpx.Client(base_url=serve_cluster.base_url + ROUTE, headers=AUTH, timeout=60) as client:
        _, done, _ = poll(lambda: settled(client, ["old", "new"]), bool, START_S, interval_s=0.5)
        assert done, app_statuses()
        yield client
    ours = [FRONT, *(model_app_name(FRONT, model["name"]) for model in [*STAYING, THIRD])]
    delete_apps([name for name in ours if name in serve.status().applications])


def test_adding_and_removing_a_model_restarts_and_drops_nothing_of_the_others(
        serve_cluster: ServeCluster, client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[0]).decode()
    before = {model["name"]: tower_processes(model["name"]) for model in STAYING}
    assert all(before.values()), before
    embedder, info = load_embedder(ModelSettings(model="tiny-siglip", seed=2))
    want = TinyReference(embedder, info.image_size).embed(photo_jpegs[0])
    bodies = [(name, {"input": image, "modality": "image", "model": name})
              for name in (STAYING[i % 2]["name"] for i in range(LOAD_THREADS))]
    with BackgroundLoad(serve_cluster.base_url + ROUTE, AUTH, bodies) as load:
        apply([*STAYING, THIRD])
        _, added, _ = poll(lambda: settled(client, ["old", "new", "third"]), bool, START_S, interval_s=0.5)
        assert added, app_statuses()
        answer = client.post("/v1/embeddings", json={"input": image, "modality": "image", "model": "third"})
        assert answer.status_code == 200, answer.text
        got = np.array(answer.json()["data"][0]["embedding"], dtype=np.float32)
        assert float(np.dot(got, want) / (np.linalg.norm(got) * np.linalg.norm(want))) >= 0.9999
        during_add = dict(load.got)

        apply(STAYING)
        _, removed, _ = poll(lambda: settled(client, ["old", "new"]), bool, SETTLE_S, interval_s=0.5)
        assert removed, app_statuses()
        # The replaced ingress replica drains for a while after the roll: the load runs on past it.
        count = load.total()
        poll(load.total, lambda n: n >= count + 20, scaled(10), interval_s=0.2)
    after = {model["name"]: tower_processes(model["name"]) for model in STAYING}
    outcomes = dict(load.got)
    assert {outcome for _, outcome in outcomes} == {"200"}, outcomes
    assert all(outcomes.get((model["name"], "200"), 0) >= 5 for model in STAYING), (during_add, outcomes)
    assert after == before  # the same replicas, the same processes: nothing of old/new restarted
    third = client.post("/v1/embeddings", json={"input": image, "modality": "image", "model": "third"})
    assert third.status_code == 404
