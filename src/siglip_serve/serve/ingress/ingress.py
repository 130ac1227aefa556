"""One ingress replica, composed of its parts (docs/http-api.md is the contract it serves):

- `door` (serve/ingress/front_door.py): the API key, each request's place and its one deadline, the drain;
- `fetcher` (serve/ingress/url_fetch.py): image URLs under `url_fetch_allowlist`, at most `url_fetch_concurrency` at
once; - `cache` (serve/ingress/embedding_cache.py): the embeddings this replica computed, by what was sent and the model
  (`embedding_cache_mib`), one for every model;
- `served`: per model it serves (the plan's models), by the name requests' `model` gives, its parts:
  - `towers` (serve/ingress/tower_link.py): a link per tower (image, text), built by one factory, and their readiness
    from what their warm replicas published;
  - `images` (serve/ingress/image_prep.py): every image checked from its header, then decoded on the fair decode queue;
  - `scheduler` (serve/ingress/schedule.py): the one call every route's work goes through.
  `towers` on the ingress itself is the default model's: it alone decides whether the service is ready.
  Under `model_apps` each model's towers are another Serve application's (serve/plan/service_plan.py
  `model_app_name`): the ingress reaches them by name and reads that application's registry records.

The routes (serve/ingress/endpoints/) are thin functions of this object; serve/ingress/http_app.py puts them on a
FastAPI app behind the front door, and serve/ingress/ingress_deployment.py is the Serve deployment that builds both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from siglip_serve.models.model_info import ModelInfo
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.ingress.embedding_cache import EmbeddingCache, cache_scope
from siglip_serve.serve.ingress.front_door import FrontDoor
from siglip_serve.serve.ingress.image_prep import ImagePrep
from siglip_serve.serve.ingress.item_rows import ItemRows
from siglip_serve.serve.ingress.schedule import Scheduler
from siglip_serve.serve.ingress.tower_link import LiveReplicas, RegistryLook, Towers, tower_link
from siglip_serve.serve.ingress.url_fetch import UrlFetcher
from siglip_serve.serve.plan.replica_slices import FrontSettings
from siglip_serve.serve.plan.service_plan import KEPT_IMAGE, ModelPlan, ServicePlan, model_app_name
from siglip_serve.serve.shared import registry, tracing
from siglip_serve.serve.shared.metrics import EmbeddingCacheMetrics, IngressMetrics
from siglip_serve.serve.shared.replica_grpc import bind_to_node_address
from siglip_serve.serve.shared.replica_logging import configure_replica_logging

log = logging.getLogger("siglip_serve.ingress")


@dataclass
class Served:
    """One model this ingress serves: its name, plan and geometry, its towers' links, its images' checks and
    the scheduling call over them."""

    name: str
    plan: ModelPlan
    model: ModelInfo
    towers: Towers
    images: ImagePrep
    scheduler: Scheduler

    @property
    def modalities(self) -> list[str]:
        return list(self.towers)

    @property
    def text_off_reason(self) -> str | None:
        """Why this model serves no text (null when it does): the setting, or what the start found."""
        if "text" in self.towers:
            return None
        return self.plan.front.text_off_reason or "text_replicas: 0"


class Ingress:
    def __init__(self, towers: Mapping[str, Mapping[str, DeploymentHandle]], plan: ServicePlan,
                 models: Mapping[str, ModelInfo], replica: tuple[str, str] | None = None,
                 live_replicas: LiveReplicas = registry.live_replicas,
                 refusal: Callable[[str, str], str | None] = registry.refusal,
                 endpoints: tuple[Sequence[str], Sequence[str]] = ((), ())) -> None:
        """`towers`: per served model, its towers' handles ("image", and "text" where it has one; none under
        `model_apps`, whose models' applications are found by name); `plan`: the
        service's (serve/plan/planner.py): each tower's replicas, each model's checks, this ingress's limits and
        settings (its slice: serve/plan/replica_slices.py); `models`: each model's
        geometry; `replica`: (application, replica id), read from Serve's replica context when not given;
        `live_replicas`, `refusal`: how the registry is read (every live replica's record; a tower's last
        refusal to start); `endpoints`: the metrics' `endpoint` labels of the routes served
        (serve/ingress/http_app.py `endpoint_labels`)."""
        front = plan.ingress.front
        configure_replica_logging(front.live.log_level)
        bind_to_node_address()
        tracing.configure(front.tracing, "ingress")
        self.front = front
        self.metrics = IngressMetrics(*endpoints, models=[model.name for model in plan.models])
        if replica is None:
            context = serve.get_replica_context()
            replica = (context.app_name, context.replica_id.unique_id)
        self.app_name, self.replica_name = replica
        self._refusal = refusal
        self.plan = plan
        self.door = FrontDoor(front, plan.ingress.limits, self.app_name, self.replica_name,
                              plan.ingress.sharing_replicas)
        self.fetcher = UrlFetcher(front.url_fetch)
        # Built with the cache off too: the contract's metric names are exported by every ingress.
        self.cache = EmbeddingCache(front.live.embedding_cache_bytes, EmbeddingCacheMetrics())
        self.look = RegistryLook(self.app_name, live_replicas)
        self.served = {model.name: self._serve(model, models[model.name], towers.get(model.name), live_replicas)
                       for model in plan.models}

    def _serve(self, own: ModelPlan, model: ModelInfo, handles: Mapping[str, DeploymentHandle] | None,
               live_replicas: LiveReplicas) -> Served:
        name, planned, retry_after_s = own.name, own.towers, self.front.live.retry_after_s
        look = self.look
        if handles is None:  # `model_apps`: the towers are the model's own application's, found by name
            app = model_app_name(self.app_name, name)
            # No existence check: the model's application may be deployed in the same `serve deploy` as this
            # replica; its calls wait for its replicas as any handle's do.
            handles = {tower: DeploymentHandle(plan.deployment.name, app) for tower, plan in planned.items()}
            if (interactive := planned["image"].interactive) is not None:
                handles = {**handles, KEPT_IMAGE: DeploymentHandle(interactive.name, app)}
            look = RegistryLook(app, live_replicas)
        sharing = self.plan.ingress.sharing_replicas
        kept_plan = planned["image"].kept()
        # The interactive lane's ingress replicas: the one kept for it (`interactive_ingress`), or every one.
        senders = 1 if self.plan.ingress.limits.interactive_server else sharing
        kept = ({"image": tower_link(handles[KEPT_IMAGE], own.front, kept_plan, senders, retry_after_s, kept=True)}
                if kept_plan is not None and KEPT_IMAGE in handles else {})
        towers = Towers({tower: tower_link(handle, own.front, planned[tower], sharing, retry_after_s)
                         for tower, handle in handles.items() if tower in planned}, look, kept)
        metrics = self.metrics.of(name)
        images = ImagePrep(own.front, model.image_size, metrics.preprocessed, model.resample, model.naflex)
        scopes = {tower: cache_scope(own, tower, model.image_size) for tower in ("image", "text")}
        rows = ItemRows(images, self.fetcher, self.cache, scopes)
        return Served(name, own, model, towers, images, Scheduler(own.front, model, metrics, self.door, towers, rows))

    def reconfigure(self, front: FrontSettings) -> None:
        """`front` (the plan's, with the deployment's user_config over its live settings:
        serve/plan/live_settings.py) in force for the next request: the front door's keys and limits first, which
        raise ConfigError with nothing changed, then the log level, the cache's bound, the URL fetcher (fetches
        under way finish with the one they began with) and each tower client's Retry-After."""
        live = front.live
        limits = replace(self.plan.ingress.limits, max_queued_requests=live.max_queued_requests,
                         request_timeout_s=live.request_timeout_s, retry_after_s=live.retry_after_s)
        self.door.reconfigure(front, limits)
        configure_replica_logging(live.log_level)
        self.cache.resize(live.embedding_cache_bytes)
        if front.url_fetch != self.fetcher.settings:
            self.fetcher = UrlFetcher(front.url_fetch)
            for served in self.served.values():
                served.scheduler.rows.fetcher = self.fetcher
        for served in self.served.values():
            for link in (*served.towers.links.values(), *served.towers.kept.values()):
                link.client.retry_after_s = live.retry_after_s
        self.front = front

    def serving(self, name: str | None) -> Served:
        """The model a request names (None: the default), or 404 naming the ones served."""
        if name is None:
            return self.served[self.plan.model.name]
        if name not in self.served:
            raise ApiError(404, ErrorType.NOT_FOUND, f"model {name!r} is not served here; this service serves "
                                                     f"{', '.join(repr(served) for served in self.served)}")
        return self.served[name]

    def require(self, *needs: str) -> None:
        """404 before a request's body is read where no model served can do `needs` (a tower's kind of item,
        `score`); the model the request names is checked again by its own scheduling call."""
        if not any(all(need in served.scheduler.capabilities for need in needs) for served in self.served.values()):
            self.serving(None).scheduler.require(*needs)

    @property
    def towers(self) -> Towers:
        """The default model's towers: it alone decides whether the service is ready."""
        return self.serving(None).towers

    @property
    def modalities(self) -> list[str]:
        return self.serving(None).modalities

    @property
    def text_off_reason(self) -> str | None:
        return self.serving(None).text_off_reason

    def count_error(self, error: ApiError) -> None:
        """Every error answer, counted once by siglip_requests_rejected_total and logged."""
        self.metrics.rejected(error.error_type.value)
        # Quiet by default: client errors, not-ready (every probe during start-up) and overload
        # (every shed request) are counted by siglip_requests_rejected_total, logged at DEBUG.
        if error.status == 500:
            level = logging.ERROR
        elif error.status > 500 and error.error_type not in (ErrorType.NOT_READY, ErrorType.OVERLOADED):
            level = logging.WARNING
        else:
            level = logging.DEBUG
        log.log(level, "%d %s: %s", error.status, error.error_type.value, error.message)

    async def readiness(self) -> tuple[ApiError | None, dict[str, Any]]:
        """(why this replica cannot serve now, or None; the counts of every tower it serves)."""
        records = await self._records()  # one read of the registry per application for every model's towers
        ready = self.towers.observe(records[self.towers.look.app_name])
        self.cache.publish_size()
        image = self.towers["image"].counts()
        counts = {**image, "towers": {tower: link.counts() for tower, link in self.towers.items()}}
        if len(self.served) > 1:
            # The default model alone decides; each other model's own requests wait for its own replicas.
            counts["models"] = {name: served.towers.observe(records[served.towers.look.app_name])
                                for name, served in self.served.items()}
        if await self.door.drain_marked():
            return ApiError(503, ErrorType.NOT_READY, "server is shutting down", self.door.retry_after()), counts
        if not ready:
            short = []
            for tower, link in self.towers.items():
                if link.live < link.plan.min_ready:
                    # A replica that refused to start on its node left its line (serve/towers/replica_start.py).
                    refused = await asyncio.to_thread(self._refusal, self.towers.look.app_name, tower)
                    short.append(f"{link.live} of {link.plan.replicas} "
                                 f"{'text encoder' if tower == 'text' else 'encoder'} replicas ready; "
                                 f"{link.plan.min_ready} needed" + (f" ({refused})" if refused else ""))
            return ApiError(503, ErrorType.NOT_READY, ", ".join(short), self.door.retry_after()), counts
        return None, counts

    async def describe(self) -> list[dict[str, Any]]:
        """/v1/models' entries: per model, the default first, its image replicas and its text tower."""
        records = await self._records()
        return [self._describe(served, records[served.towers.look.app_name]) for served in self.served.values()]

    async def _records(self) -> dict[str, list[dict[str, Any]]]:
        """Every live replica's record, by application: each application's read once, all at once."""
        looks = {served.towers.look.app_name: served.towers.look for served in self.served.values()}
        found = await asyncio.gather(*(look.replicas() for look in looks.values()))
        return dict(zip(looks, found, strict=True))

    def _describe(self, served: Served, records: list[dict[str, Any]]) -> dict[str, Any]:
        towers = served.towers
        towers.observe(records)
        images = [r for r in records if towers["image"].mine(r)]
        lnc = next((r.get("lnc") or r.get("neuron_logical_nc_config") for r in images
                    if r.get("lnc") or r.get("neuron_logical_nc_config")), None)
        own, model = served.plan, served.model
        image = towers["image"].plan
        scaling = self.plan.ingress.deployment.autoscaling_config
        return {
            "id": served.name,
            "object": "model",
            "owned_by": "siglip-serve",
            "model": own.model,
            "default": served.name == self.plan.model.name,
            "embedding_dim": model.embed_dim,
            "image_size": list(model.image_size),
            "patch_budgets": list(model.naflex.budgets) if model.naflex else None,
            "backend": own.backend,
            "weights": own.front.weights,
            "lnc": int(lnc) if lnc is not None else None,
            "buckets": list(own.front.buckets),
            "replicas_expected": image.replicas,
            "ingress_replicas": self.plan.ingress.replicas,
            "ingress_autoscaling": ({key: scaling[key] for key in ("min_replicas", "max_replicas")}
                                    if scaling is not None else None),
            "ingress_replica": self.replica_name,
            "replicas_min_ready": image.min_ready,
            "replicas": images,
            "modalities": served.modalities,
            "text_off_reason": served.text_off_reason,
            "text": towers.info("text"),
            "cache": self.cache.stats(),
        }
