"""The ingress's link to each tower's deployment (image, text), built by one factory for any tower.

A link is the tower's coalescing client (serve/ingress/tower_client.py: its share of the calls in flight, sized from
the tower's replicas and largest bucket), how many replicas the tower has and needs warm, and what its warm
replicas published (serve/towers/tower_replica.py `publish`, read from serve/shared/registry.py): their count
(readiness), their warm-up (which tunes the client's coalescing) and the tower's description (the text tower's logit
scale and bias). `Towers` holds every link an ingress serves and reads the registry once for all of them, and
picks the link of a request's lane: the image replica kept for the interactive lane (`interactive_encoder`) has a
link of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ray.serve.handle import DeploymentHandle

from siglip_serve.core.lanes import Lane
from siglip_serve.serve.ingress.tower_client import TowerClient
from siglip_serve.serve.plan.replica_slices import ModelFront
from siglip_serve.serve.plan.service_plan import TowerPlan
from siglip_serve.serve.shared import registry

# What an ingress reads the registry with: (application) -> every live replica's record.
LiveReplicas = Callable[[str], list[dict[str, Any]]]
# How old a look at the registry may be when an interactive request picks its link: no probe looks for the ingress
# once it is ready (HAProxy checks Serve's /-/healthz), so the lane's own requests look again, in the background.
KEPT_LOOK_S = 1.0


@dataclass
class TowerLink:
    """The ingress's side of one tower (not models/tower.py's Tower, which is the model itself)."""

    tower: str
    client: TowerClient
    plan: TowerPlan
    live: int = 0
    # Once `min_ready` replicas were warm: requests are accepted from then on; a replica that restarts
    # later shows in the counts while the others keep serving.
    accepting: bool = False
    info: dict[str, Any] | None = None  # a warm replica's record: its description and warm-up
    kept: bool = False  # the link to the replica kept for the interactive lane, which counts only that replica

    def mine(self, record: dict[str, Any]) -> bool:
        """Whether a replica's record is this tower's, of this model (a record naming no model: any); a kept
        link's, only its own deployment's."""
        return (registry.record_tower(record) == self.tower
                and record.get(registry.SERVED_AS, self.plan.served_as) == self.plan.served_as
                and (not self.kept or record.get(registry.DEPLOYMENT) == self.plan.deployment.name))

    def observe(self, records: list[dict[str, Any]]) -> bool:
        """Every live replica's record, as the registry has them now: True when enough of this tower's are warm."""
        mine = [record for record in records if self.mine(record)]
        self.live = len(mine)
        ready = self.live >= self.plan.min_ready
        if mine:
            self.info = mine[0]
        if ready:
            self.client.tune(full_batch_seconds(mine, self.plan.largest_bucket))
        self.accepting = self.accepting or ready
        return ready

    def counts(self) -> dict[str, int]:
        return {"replicas": self.live, "replicas_expected": self.plan.replicas,
                "replicas_min_ready": self.plan.min_ready}


def tower_link(handle: DeploymentHandle, front: ModelFront, plan: TowerPlan, ingress_replicas: int,
               retry_after_s: int, kept: bool = False) -> TowerLink:
    """The link to a tower's deployment, sized from its plan (the replicas its deployment runs) and the ingress
    replicas sharing it, calling as its model's `front` says; `kept`: the deployment of the replica kept for the
    interactive lane (`TowerPlan.kept`)."""
    replicas = plan.shared_replicas
    client = TowerClient(handle, replicas, ingress_replicas, plan.largest_bucket, retry_after_s,
                         max_in_flight=replicas * plan.deployment.max_ongoing_requests,
                         model_on_host_cores=front.model_on_host_cores, tower=plan.tower,
                         grpc=front.tower_calls_by_grpc)
    return TowerLink(plan.tower, client, plan, kept=kept)


def full_batch_seconds(records: list[dict[str, Any]], largest_bucket: int) -> float | None:
    """The slowest warm replica's forward time of its largest bucket, from its warm-up."""
    times = [r.get("warmup_seconds", {}).get(str(largest_bucket)) for r in records]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


class RegistryLook:
    """Every live replica's record of one application, read once for all who wait meanwhile: a burst on a
    fresh ingress must not queue a GCS call per request, nor one per model it serves."""

    def __init__(self, app_name: str, live_replicas: LiveReplicas = registry.live_replicas) -> None:
        self.app_name = app_name
        self._live_replicas = live_replicas
        self._look: asyncio.Future[list[dict[str, Any]]] | None = None

    async def replicas(self) -> list[dict[str, Any]]:
        if self._look is None or self._look.done():
            self._look = asyncio.ensure_future(asyncio.to_thread(self._live_replicas, self.app_name))
        return await asyncio.shield(self._look)


class Towers:
    """Every tower of one model this ingress serves, by name ("image" first), and their readiness; `look`
    reads the registry, shared by every model's towers; `kept`: by tower, the link to its replica kept for the
    interactive lane (counted in its tower's readiness, as one of its replicas)."""

    def __init__(self, links: dict[str, TowerLink], look: RegistryLook,
                 kept: dict[str, TowerLink] | None = None) -> None:
        self.links = links
        self.look = look
        self.kept = kept or {}
        self.looked_at = float("-inf")  # time.monotonic() of the last `observe`
        self._looking: asyncio.Task[bool] | None = None

    def __getitem__(self, tower: str) -> TowerLink:
        return self.links[tower]

    def __contains__(self, tower: object) -> bool:
        return tower in self.links

    def __iter__(self) -> Iterator[str]:
        return iter(self.links)

    def items(self) -> list[tuple[str, TowerLink]]:
        return list(self.links.items())

    def info(self, tower: str) -> dict[str, Any] | None:
        """What a warm replica of `tower` published; None with the tower off or none warm yet."""
        link = self.links.get(tower)
        return link.info if link is not None else None

    def observe(self, records: list[dict[str, Any]]) -> bool:
        """Every link observes the records; whether every tower has its `min_ready` replicas warm in them."""
        self.looked_at = time.monotonic()
        for link in self.kept.values():
            link.observe(records)
        return all([link.observe(records) for link in self.links.values()])

    def for_lane(self, tower: str, lane: Lane) -> TowerLink:
        """The link a request of `lane` takes to `tower`: the interactive lane's to the replica kept for it while
        that replica was warm at the last look, every other request the shared one. A look older than KEPT_LOOK_S
        starts a new one in the background (the request does not wait for it), so that the lane leaves a kept
        replica that died and comes back to it once it is warm again."""
        kept = self.kept.get(tower)
        if lane != Lane.INTERACTIVE or kept is None:
            return self.links[tower]
        if time.monotonic() - self.looked_at > KEPT_LOOK_S and (self._looking is None or self._looking.done()):
            self._looking = asyncio.ensure_future(self.ready())
            # A failed look leaves the last one standing; its error is the next probe's to report.
            self._looking.add_done_callback(lambda look: look.cancelled() or look.exception())
        return kept if kept.live > 0 else self.links[tower]

    async def ready(self) -> bool:
        """Whether every tower has its `min_ready` replicas warm now."""
        return self.observe(await self.look.replicas())

    async def accepting(self, tower: str) -> bool:
        """Whether `tower` takes requests: once it was ready, for good."""
        link = self.links[tower]
        if not link.accepting:
            await self.ready()
        return link.accepting
