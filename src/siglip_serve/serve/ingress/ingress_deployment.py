"""The ingress's Serve deployment: one `Ingress` (serve/ingress/ingress.py) per replica, and its HTTP app built from the
routes the application gives it: the contract's (serve/ingress/endpoints/) and any it adds (serve/app.py `build`).

`@serve.ingress()` without an app: Serve calls `__serve_build_asgi_app__` on the replica once the constructor ran
and serves what it returns (ray/serve/api.py `ingress`, ray/serve/_private/replica.py
`_initialize_asgi_callable`), so the app and its handlers belong to this replica's objects, with no app frozen
and pickled at import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from siglip_serve.core.errors import ConfigError
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.serve.ingress.http_app import Probe, Route, endpoint_labels, http_app
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.plan.ingress_scaling import BUSY_CORES, BusyCores
from siglip_serve.serve.plan.service_plan import ServicePlan

log = logging.getLogger("siglip_serve.ingress")


@serve.ingress()
class IngressDeployment:
    def __init__(self, towers: Mapping[str, Mapping[str, DeploymentHandle]], plan: ServicePlan,
                 models: Mapping[str, ModelInfo], routes: Sequence[Route | Probe] = ()) -> None:
        """`towers`: per served model, its towers' handles (Serve turns each bound deployment into one); `plan`:
        the service's, the ingress's slice (serve/plan/replica_slices.py); `routes`: every route its app serves."""
        self.routes = tuple(routes)
        self.start = plan.ingress.front
        self.ingress = Ingress(towers, plan, models, endpoints=endpoint_labels(self.routes))
        self._busy_cores = BusyCores()
        self._started = False

    async def reconfigure(self, user_config: Any) -> None:
        """Serve's in-place update: the deployment's user_config, the live settings over the plan's, which are the
        args' (serve/plan/live_settings.py). Serve calls it once after the constructor, where a bad one raises and the
        replica refuses to start, and again on each change of user_config alone, on the running replica
        (ray/serve/_private/replica.py ReplicaBase.reconfigure). There a bad one keeps the settings in force and
        logs why: a raise would make Serve stop the replica and start another with the same user_config
        (ray/serve/_private/deployment_state.py DeploymentState._check_startup_replicas), which refuses in turn."""
        try:
            self.ingress.reconfigure(self.start.with_live(user_config))
        except ConfigError as exc:
            if not self._started:
                raise
            log.error("%s; the live settings in force stay", exc)
        else:
            if self._started:
                log.info("live settings in force: %s", user_config)
        finally:
            self._started = True

    def __serve_build_asgi_app__(self) -> FastAPI:
        return http_app(self.ingress, self.routes)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's controller gets for `ingress_autoscaling` (serve/plan/ingress_scaling.py); Serve calls
        this only on an autoscaled deployment."""
        return {BUSY_CORES: self._busy_cores.read()}
