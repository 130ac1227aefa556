"""`interactive_encoder`: one image replica kept for the interactive lane. The plan (serve/plan/planner.py) moves one
of the image tower's replicas into a deployment of its own, the count unchanged; the application binds it; the
ingress's towers (serve/ingress/tower_link.py `Towers.for_lane`) send the interactive lane's chunks to it while it is
warm and every other lane's to the others. The handles and the registry are stand-ins here; Serve's routing to the
real deployments is tested in tests/integration/test_metrics.py (its live app keeps one)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray.serve import Application
from ray.serve._private.handle_options import DynamicHandleOptions

from siglip_serve.core import lanes
from siglip_serve.core.lanes import Lane, Ticket
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.serve import app
from siglip_serve.serve.ingress import tower_link
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.service_plan import KEPT_IMAGE
from siglip_serve.serve.shared import registry
from tests.helpers import ServeResponse as Response

MODEL = ModelInfo("tiny-siglip", 4, (64, 64), "random")


@pytest.fixture
def keys(tmp_path: Path) -> str:
    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nname = "search"\nkey = "search-secret"\nlane = "interactive"\n')
    return str(path)


def _config(keys: str, **args: Any) -> ServiceConfig:
    """tiny-siglip, 3 image replicas, one kept; `args` change or (None) leave out settings."""
    settings = {"model": "tiny-siglip", "random_weights": True, "replicas": 3, "text_replicas": 0,
                "ingress_replicas": 1, "api_keys_file": keys, "interactive_encoder": True, **args}
    return ServiceConfig.from_args({name: value for name, value in settings.items() if value is not None})


def test_the_plan_moves_one_image_replica_into_a_deployment_of_its_own_and_asks_for_nothing_more(keys: str) -> None:
    plan = plan_service(_config(keys))
    image = plan.model.image
    assert (image.replicas, image.deployment.name, image.deployment.num_replicas) == (3, "Encoder", 2)
    assert image.interactive is not None
    assert (image.interactive.name, image.interactive.num_replicas) == ("InteractiveEncoder", 1)
    assert image.interactive.ray_actor_options == image.deployment.ray_actor_options
    kept = image.kept()
    assert kept is not None and (kept.replicas, kept.min_ready, kept.deployment, kept.interactive) == (
        1, 1, image.interactive, None)
    assert image.shared_replicas == 2 and kept.shared_replicas == 1
    assert plan.needs() == plan_service(_config(keys, interactive_encoder=False)).needs()
    several = plan_service(_config(keys, models=[{"name": "a", "model": "tiny-siglip", "replicas": 2},
                                                 {"name": "b", "model": "tiny-siglip", "replicas": 2}]))
    assert [m.image.interactive.name for m in several.models if m.image.interactive] == [
        "InteractiveEncoder-a", "InteractiveEncoder-b"]


def test_the_application_binds_the_kept_replica_with_its_own_plan(keys: str) -> None:
    config = _config(keys)
    ingress = app.build_app(config.model_dump(exclude_none=True, mode="json"))._bound_deployment
    (bound,) = ingress.init_args[0].values()
    assert set(bound) == {"image", KEPT_IMAGE}
    deployments = {b._bound_deployment.name: b._bound_deployment for b in bound.values() if isinstance(b, Application)}
    plan = plan_service(config)
    assert deployments["Encoder"].num_replicas == 2 and deployments["InteractiveEncoder"].num_replicas == 1
    assert deployments["InteractiveEncoder"].init_args[1] == plan.model.image.kept()


@pytest.mark.parametrize(("args", "words"), [
    ({"replicas": 1}, "needs another for the other lanes; this plan has 1"),
    ({"api_keys_file": None}, "interactive_encoder needs api_keys_file"),
    ({"replicas": None, "autoscaling": {"min_replicas": 2, "max_replicas": 3}},
     "interactive_encoder and autoscaling contradict"),
])
def test_what_cannot_keep_a_replica_is_refused_saying_why(keys: str, args: dict[str, Any], words: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=words):
        plan_service(_config(keys, **args))


class ImageHandle:
    """Stands in for one image deployment's handle: `embed_chunks.remote(chunks, deadlines, tickets=...)`, each chunk
    answered with zeros of its length at once; it records the lanes of the chunks it was sent. It does not prove
    Serve's routing, which picks a replica of the deployment the handle names (the integration test's part)."""

    handle_options = DynamicHandleOptions()

    def __init__(self) -> None:
        self.lanes: list[int] = []
        handle = self

        class Method:
            def remote(self, chunks: list[np.ndarray], deadlines: list[float], *traced: Any,
                       tickets: list[tuple[int, str, float]] | None = None) -> Response:
                handle.lanes.extend(lane for lane, _, _ in tickets or [(int(Lane.DEFAULT), "", 1.0)] * len(chunks))
                return Response(handle._answer(chunks))

        self.embed_chunks = Method()

    def options(self, **options: Any) -> ImageHandle:
        self.handle_options = self.handle_options.copy_and_update(**options)
        return self

    async def _answer(self, chunks: list[np.ndarray]) -> list[np.ndarray]:
        return [np.zeros((len(chunk), MODEL.embed_dim), dtype=np.float32) for chunk in chunks]


def _record(deployment: str, replica: str) -> dict[str, Any]:
    return {"tower": "image", "replica_id": replica, "warmup_seconds": {"8": 0.002},
            registry.SERVED_AS: MODEL.name, registry.DEPLOYMENT: deployment}


async def _encode(ingress: Ingress, lane: Lane) -> None:
    """One image in `lane` through the scheduling call's encode step, in a task of its own (its own context)."""
    async def one() -> None:
        lanes.enter(Ticket(tenant="search", lane=lane))
        await ingress.serving(None).scheduler.encode("image", np.zeros((1, 3, 64, 64), dtype=np.uint8),
                                                     time.monotonic() + 30)

    await asyncio.create_task(one())


async def _until_kept_is(ingress: Ingress, handle: ImageHandle, used: bool) -> int:
    """Interactive images until the kept replica's handle gets one (`used`) or the last one went elsewhere; how many
    it took (the lane's requests look at the registry again in the background, KEPT_LOOK_S apart)."""
    for sent in range(1, 200):
        before = len(handle.lanes)
        await _encode(ingress, Lane.INTERACTIVE)
        if (len(handle.lanes) > before) == used:
            return sent
        await asyncio.sleep(0.01)
    raise AssertionError(f"the interactive lane never {'reached' if used else 'left'} the kept replica")


def test_the_interactive_lane_goes_to_the_kept_replica_while_it_is_warm_and_the_others_never(
        keys: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tower_link, "KEPT_LOOK_S", 0.0)
    config = _config(keys)
    shared, kept = ImageHandle(), ImageHandle()
    records = [_record("Encoder", "e-1"), _record("Encoder", "e-2")]  # the kept replica still loads
    ingress = Ingress({MODEL.name: {"image": shared, KEPT_IMAGE: kept}},  # type: ignore[dict-item]
                      plan_service(config), {MODEL.name: MODEL}, replica=("test", "ingress-1"),
                      live_replicas=lambda app: list(records), refusal=lambda app, tower: None)
    towers = ingress.towers

    async def run() -> None:
        assert await towers.ready()  # min_ready_replicas: 1, as a readiness probe finds it before any request
        await _encode(ingress, Lane.INTERACTIVE)
        assert (kept.lanes, shared.lanes) == ([], [Lane.INTERACTIVE])  # not warm: the lane meets the others
        records.append(_record("InteractiveEncoder", "k-1"))  # warm now; no probe looks again, the lane does
        await _until_kept_is(ingress, kept, used=True)
        assert towers["image"].live == 3 and towers.kept["image"].live == 1  # readiness counts it as an image replica
        shared.lanes.clear()
        for lane in (Lane.DEFAULT, Lane.BULK, Lane.INTERACTIVE, Lane.DEFAULT):
            await _encode(ingress, lane)
        assert shared.lanes == [Lane.DEFAULT, Lane.BULK, Lane.DEFAULT]  # the other lanes never meet it
        assert set(kept.lanes) == {Lane.INTERACTIVE}
        records.pop()  # the kept replica died: the lane goes back to the others rather than wait for it
        await _until_kept_is(ingress, kept, used=False)
        assert towers.kept["image"].live == 0

    asyncio.run(run())
    assert ingress.modalities == ["image"]
