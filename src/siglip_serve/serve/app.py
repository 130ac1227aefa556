"""The Ray Serve application: `serve run siglip_serve.serve.app:build_app model=tiny-siglip` or a Serve YAML."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from pydantic import BaseModel
from ray import serve
from ray.serve import Application
from ray.serve.exceptions import RayServeException

from siglip_serve.core.errors import UserError
from siglip_serve.models.model_info import ImageGeometry, ModelInfo, known_geometry
from siglip_serve.models.naflex import served_layout
from siglip_serve.models.source import ModelSource
from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.http_app import Probe, Route
from siglip_serve.serve.ingress.ingress_deployment import IngressDeployment
from siglip_serve.serve.plan.cluster_fit import Growth, check_cluster_fits, cluster_growth, planning_resources
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.policy import policy_of
from siglip_serve.serve.plan.replica_slices import TowerRun
from siglip_serve.serve.plan.service_plan import KEPT_IMAGE, ModelPlan, ServicePlan, TowerPlan
from siglip_serve.serve.shared import tracing
from siglip_serve.serve.towers.image_deployment import ServedImageReplica
from siglip_serve.serve.towers.text_deployment import ServedTextReplica

log = logging.getLogger("siglip_serve")


def plan_on_cluster(config: ServiceConfig, growth: Growth, stop: Callable[[], bool] = lambda: False, *,
                    text_off: str | None = None) -> ServicePlan:
    """The plan against the running Ray cluster, checked to fit it (serve/plan/cluster_fit.py): where the cluster
    grows, `replicas: auto` over a device waits for its count to register and hold, up to `cluster_wait_s`
    or until `stop()`. `text_off`: why the default model's text tower is off (serve/plan/planner.py plan_service)."""
    resources = planning_resources(config, growth, stop)
    plan = plan_service(config, resources, text_off=text_off)
    if not stop():
        check_cluster_fits(plan, growth, resources)
    return plan


def _towers(model: ModelPlan, image_count: int | None = None) -> dict[str, Application]:
    """One model's towers' deployments, each bound with its slice of the plan: "image", and "text" where it has
    one. `image_count`: the image replicas to run for now, in place of the plan's fixed count (a start's first
    wave, serve/plan/start_order.py); the slice it is bound with, and so its version, stay the plan's."""
    options = model.image.deployment.options()
    if image_count is not None:
        options["num_replicas"] = image_count
    image = serve.deployment(**options)(ServedImageReplica)
    towers = {"image": image.bind(model.run, model.image)}
    if (kept := _kept_image(model)) is not None:
        towers[KEPT_IMAGE] = kept
    if model.text is not None:
        towers["text"] = _text(model.run, model.text)
    return towers


def _text(run: TowerRun, text: TowerPlan) -> Application:
    return serve.deployment(**text.deployment.options())(ServedTextReplica).bind(run, text)


def _kept_image(model: ModelPlan) -> Application | None:
    """The image replica kept for the interactive lane (`interactive_encoder`), bound, or None."""
    kept = model.image.kept()
    if kept is None:
        return None
    return serve.deployment(**kept.deployment.options())(ServedImageReplica).bind(model.run, kept)


def loaded_geometry(source: ModelSource) -> ImageGeometry:
    """A model with no config file (one open_clip registered at run time) measured by open_clip itself."""
    from siglip_serve.models.loading import image_geometry

    return image_geometry(source)


def build(config: ServiceConfig, plan: ServicePlan, routes: Sequence[Route | Probe] = (),
          live: dict[str, Any] | None = None, pin: bool = False,
          first_wave: Mapping[str, int] | None = None, say: bool = True) -> Application:
    """The application of `plan` (serve/plan/planner.py): each model's towers' deployments and the ingress, serving
    the contract's routes and `routes`; under `model_apps` the ingress alone (each model's towers are
    `build_model_app`'s). `live`: the ingress's user_config (default: the plan's live settings, the config's);
    `pin`: each deployment's version set from the slice it is bound with, for `serve.run` (`pinned`); `first_wave`:
    by served model, the image replicas a start runs first (serve/plan/start_order.py); `say`: log what it runs
    (the start's second wave runs what the first said)."""
    towers: dict[str, dict[str, Application]] = {}
    infos: dict[str, ModelInfo] = {}
    for model in plan.models:
        settings = model.run.settings
        geometry = known_geometry(settings.source) or loaded_geometry(settings.source)
        naflex = served_layout(geometry.naflex, settings.patch_budgets, settings.model)
        infos[model.name] = ModelInfo(model.name, geometry.embed_dim, geometry.size, model.front.weights,
                                      geometry.resample, naflex)
        count = (first_wave or {}).get(model.name)
        if not config.model_apps:
            towers[model.name] = {tower: pinned(bound, pin) for tower, bound in _towers(model, count).items()}
        image = model.image
        if say:
            log.info("model %s: %s on %s, %s encoder replica(s)%s%s%s, buckets %s, %d text replica(s)", model.name,
                     model.model, model.backend,
                     image.replicas if image.min_replicas == image.replicas else
                     f"{image.min_replicas}..{image.replicas} autoscaled",
                     " (one kept for the interactive lane)" if image.interactive is not None else "",
                     f" x {image.torch_threads} torch thread(s)" if image.torch_threads else "",
                     f" ({count} first, the rest once warm)" if count is not None else "", list(model.front.buckets),
                     model.text.replicas if model.text else 0)
    front = plan.ingress
    if say:
        log.info("ingress: %s replica(s) for %d model(s)", front.replicas if front.max_replicas == front.replicas
                 else f"{front.replicas}..{front.max_replicas} autoscaled", len(plan.models))
    # The live settings travel as the ingress's user_config too, so a Serve config's `deployments:` entry for it
    # changes them in place (serve/plan/live_settings.py); the args stay the start's.
    ingress = serve.deployment(IngressDeployment, **front.deployment.options(),
                               user_config=front.front.live.model_dump(mode="json") if live is None else live)
    return pinned(ingress.bind(towers, plan, infos, (*ROUTES, *routes)), pin)


def pinned(app: Application, pin: bool) -> Application:
    """`app`, with `pin` its deployment's version set to a hash of the slice of the plan it is bound with
    (`slice_version`). `serve.run` gives a deployment without one a random code version each time
    (ray/serve/_private/client.py ServeControllerClient.deploy_applications), which restarts its replicas
    (ray/serve/_private/version.py DeploymentVersion.requires_actor_restart). Pinned, a deployment whose slice is
    unchanged keeps its replicas when the application is run again: a change of the ingress's user_config alone
    reconfigures it in place, and a model added or removed leaves every other model's towers running. Serve's
    declarative path (a Serve config) sets its own, from the args (ray/serve/_private/application_state.py)."""
    if not pin:
        return app
    version = slice_version(app._bound_deployment.init_args)
    app._bound_deployment = app._bound_deployment.options(version=version, _internal=True)
    return app


def slice_version(init_args: Sequence[Any]) -> str:
    """A hash of what a deployment is bound with: its parts of the plan (the ingress's live settings left out:
    they travel as its user_config), the models' geometry and the routes' paths; not the other deployments'
    handles, so a model's towers keep their version while the models beside them change."""
    parts: list[str] = []
    for arg in init_args:
        if isinstance(arg, ServicePlan):
            parts.append(arg.model_dump_json(exclude={"ingress": {"front": {"live"}}}))
        elif isinstance(arg, BaseModel):
            parts.append(arg.model_dump_json())
        elif isinstance(arg, Mapping) and all(isinstance(info, ModelInfo) for info in arg.values()):
            parts.append(repr(sorted(arg.items())))
        elif isinstance(arg, tuple):  # the routes
            parts.append(repr([getattr(route, "path", route) for route in arg]))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def text_by_shape(config: ServiceConfig) -> str | None:
    """The text tower's default decided from the config alone: why it is off, or None (as configured). Asked for
    (`text_replicas: N` or `tokenizer: DIR`), or with a tokenizer bundled in the package (the tiny models): as
    configured, and each text replica loads the tokenizer where it runs. Else off, saying how to turn it on:
    whether the workers hold the model's tokenizer or reach the hub is not something the head can see.
    (`siglip-serve run` decides it by looking, serve/plan/model_checks.py preflight_tokenizer.)"""
    from siglip_serve.models.tokenizer_files import BUNDLED_TOKENIZERS

    if (config.text_replicas is not None or config.tokenizer is not None or policy_of(config).text_replicas == 0
            or config.models):  # several models: each entry's text tower as it says (its default on cpu: on)
        return None
    if config.model in BUNDLED_TOKENIZERS:
        return None
    from siglip_serve.serve.plan.model_checks import text_off

    return text_off(config, "a Serve deploy does not look for the tokenizer from the head; set text_replicas: 1 "
                            "(each text replica loads it where it runs)")


class AppRefused(RayServeException):
    """The builder refuses the application; Serve shows the message once and does not retry.

    Serve runs the builder as a task with retries (ray/serve/_private/application_state.py,
    build_serve_application: max_retries=3, retry_exceptions=True), so any other exception is
    retried three times, with a traceback each; a RayServeException is reported as the
    application's DEPLOY_FAILED message instead.
    """


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Serve's application builder (`import_path: siglip_serve.serve.app:build_app`): `args` is the YAML
    `args:` mapping. Serve calls a builder with exactly one parameter and refuses any other signature
    (ray/serve/_private/api.py, call_user_app_builder_with_args_if_necessary)."""
    return build_app_with_routes(args)


def build_model_app(args: dict[str, Any] | None = None) -> Application:
    """Serve's builder of one model's own application under `model_apps` (`import_path:
    siglip_serve.serve.app:build_model_app`, `route_prefix: null`): `args` the service's settings with that model's
    one `models:` entry (serve/plan/served_models.py `model_app_args`). Its image tower is the application's
    ingress, its text tower bound to it; nothing of another model is in its args, so Serve's code version of
    its deployments (ray/serve/_private/deploy_utils.py get_app_code_version) stays as models come and go."""
    try:
        config = ServiceConfig.from_args(args)
        if len(config.models) != 1 or config.model_apps:
            raise ConfigError("build_model_app builds one model: its args hold exactly one models: entry and no "
                              "model_apps (the front application's args hold those)")
        plan = _planned(config)
        model = plan.model
        log.info("model %s: its own application, %d image and %d text replica(s)", model.name,
                 model.image.replicas, model.text.replicas if model.text else 0)
        text = () if model.text is None else (_text(model.run, model.text),)
        kept = () if (bound := _kept_image(model)) is None else (bound,)
        return serve.deployment(**model.image.deployment.options())(ServedImageReplica).bind(
            model.run, model.image, companions=(*text, *kept))
    except UserError as exc:
        log.error("%s", exc)
        raise AppRefused(str(exc)) from None


def build_app_with_routes(args: dict[str, Any] | None, routes: Sequence[Route | Probe] = ()) -> Application:
    """The application of `args` (the YAML `args:` mapping) with `routes`, more routes beside the
    contract's (serve/ingress/endpoints/), each on the same front door and scheduling call (a test's, say).

    It runs where Serve runs it: on the head, which under KubeRay mounts no artifacts, holds no weights'
    cache and may have no route to the hub. So it checks the configuration's shape only, once, before any
    replica starts: the config, the text tower's default (`text_by_shape`), and its plan against the cluster
    (where nodes join later, it warns and deploys instead, and waits for the devices `replicas: auto`
    counts: serve/plan/cluster_fit.py). The artifact, the weights, the tokenizer, an SDK or a
    GPU are checked by each replica on its own node, which refuses in one line naming the node and the
    fix (serve/towers/replica_start.py). `siglip-serve run` checks them before it starts its own Ray
    (launcher/cli.py)."""
    try:
        config = ServiceConfig.from_args(args)
        if config.tracing:
            tracing.check_available()
        return build(config, _planned(config), routes)
    except UserError as exc:  # a config or cluster problem: refused once, not retried
        log.error("%s", exc)
        raise AppRefused(str(exc)) from None


def _planned(config: ServiceConfig) -> ServicePlan:
    """A builder's plan of `config`, its text tower's default decided by its shape (`text_by_shape`): against the
    Ray cluster the builder runs in, where there is one."""
    text_off = text_by_shape(config)
    if ray.is_initialized():
        return plan_on_cluster(config, cluster_growth(config), text_off=text_off)
    return plan_service(config, text_off=text_off)
