"""A configuration becomes the service's plan (serve/plan/service_plan.py) here, once: every count, thread, limit and
Serve option, from the config, the backend's record (through serve/plan/placement.py, what one replica asks
Ray for) and, where a count depends on it, the Ray cluster's resources.

`replicas: auto` counts the device the image replicas hold (the record's `ray_resource`: neuron_cores,
GPU, a registered backend's own), less what the text replicas hold of it; where the replicas hold no
device and the model runs on the host's cores (cpu), the host's cores and memory (serve/plan/cpu_plan.py).
Without a cluster (`resources` None: `siglip-serve run` before it starts its own Ray, sized from this
plan; `--print-plan`) a device count must be named, or declared (`--neuron-cores`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from siglip_serve.core.backends import backend_record, extra_backends_env
from siglip_serve.core.constants import NEURON_CORES, VISIBLE_CORES_ENV
from siglip_serve.core.front_door import FrontDoorLimits
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan import cpu_plan
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.ingress_scaling import policy
from siglip_serve.serve.plan.live_settings import LIVE_KEYS, LiveSettings
from siglip_serve.serve.plan.placement import ReplicaAsks, declare_hint, replica_asks
from siglip_serve.serve.plan.policy import Policy, policy_of
from siglip_serve.serve.plan.replica_slices import FrontSettings, ModelFront, TowerRun
from siglip_serve.serve.plan.served_models import ServedModel, served_models
from siglip_serve.serve.plan.service_plan import (
    DeploymentPlan,
    IngressPlan,
    ModelPlan,
    ReplicaAsk,
    ServicePlan,
    TowerPlan,
)
from siglip_serve.serve.shared import tracing

# Serve's health check of a tower replica; its timeout stays Serve's default.
HEALTH_CHECK_PERIOD_S = 10.0

# On an accelerator one call runs on each replica while the next waits in its batch queue, so the
# device never waits for the round trip to the ingress between batches. On cpu the model runs on the
# host's own cores: a replica that waits gives its core back to the ingress, and the fewer, larger
# calls cost less CPU per image (tiny-siglip, c=32, alternating: 6.2 vs 7.0-8.5 ms per image).
CALLS_IN_FLIGHT_PER_REPLICA = 2
CALLS_IN_FLIGHT_PER_CPU_REPLICA = 1
# Fewer than this and a burst of multi-image requests would leave decode threads idle.
MIN_ONGOING_REQUESTS = 8


def calls_per_replica(model_on_host_cores: bool) -> int:
    return CALLS_IN_FLIGHT_PER_CPU_REPLICA if model_on_host_cores else CALLS_IN_FLIGHT_PER_REPLICA


def calls_in_flight(replicas: int, ingress_replicas: int, model_on_host_cores: bool = False) -> int:
    """This ingress's share of the calls the encoder replicas should have in flight (HAProxy spreads
    requests evenly over the ingress replicas: `balance leastconn`, Ray Serve 2.60's
    RAY_SERVE_HAPROXY_BALANCE_ALGORITHM), at least one call per replica's worth."""
    per_replica = calls_per_replica(model_on_host_cores)
    wanted = per_replica * max(replicas, 1)
    return max(per_replica, math.ceil(wanted / max(ingress_replicas, 1)))


def ingress_max_ongoing(config: ServiceConfig, replicas: int, ingress_replicas: int) -> int:
    """Requests one of `ingress_replicas` works on at once: as set, or twice the images its share of the
    calls in flight to `replicas` image replicas carries (one set running, the next gathering while it runs:
    serve/ingress/tower_client.py) plus one per decode thread, so single-image requests keep every encoder busy."""
    if config.ingress_max_ongoing_requests != "auto":
        return config.ingress_max_ongoing_requests
    calls = calls_in_flight(replicas, ingress_replicas, backend_record(config.backend).host_cores)
    largest_bucket = config.buckets[-1]
    return max(MIN_ONGOING_REQUESTS, 2 * calls * largest_bucket + config.decode_threads)


def front_door_limits(config: ServiceConfig, replicas: int, ingress_replicas: int) -> FrontDoorLimits:
    """Each ingress replica's limits (serve/plan/planner.py puts them in the plan). `ingress_replicas`: those that
    share the traffic, not the one `interactive_ingress` adds, which sees only a lane's few requests."""
    ongoing = ingress_max_ongoing(config, replicas, ingress_replicas)
    share = config.share_beside_others
    return FrontDoorLimits(max_ongoing_requests=ongoing, max_queued_requests=config.max_queued_requests,
                           request_timeout_s=config.request_timeout_s, retry_after_s=config.retry_after_s,
                           ongoing_beside_others=max(1, round(ongoing * share)) if share < 1 else None,
                           interactive_server=config.interactive_ingress)


def max_ongoing(largest_bucket: int) -> int:
    """Calls one tower replica takes at once: one batch runs while the next gathers, a full batch of
    single-item calls queued behind it."""
    return 2 * largest_bucket


def image_replicas(config: ServiceConfig, asks: ReplicaAsks, resources: Mapping[str, float] | None,
                   rules: Policy | None = None) -> int:
    """The image tower's count: as named, the most autoscaling allows, or `auto` counted (module doc)."""
    rules = rules or policy_of(config)
    setting = rules.replica_setting
    if setting != "auto":
        return setting
    device = asks.device_resource
    if device is None and not rules.model_on_host_cores:
        raise ConfigError(f"replicas: auto counts the device each image replica holds (or cores on cpu); on "
                          f"{config.backend} replicas hold none: set neuron_cores_per_replica: 1, or name a count")
    if device is None:
        cpus = None if resources is None else resources.get("CPU")
        return cpu_plan.auto_cpu_replicas(config, rules.text_replicas, cpus)
    if resources is None:
        raise ConfigError(f"replicas: auto counts the {device} a Ray cluster declares, and there is none yet; "
                          f"name replicas: N (siglip-serve run: --neuron-cores N declares its Ray's NeuronCores)")
    have = float(resources.get(device, 0))
    count = asks.image_replicas_on(have, rules.text_replicas)
    if count < 1:
        raise ConfigError(f"replicas: auto found {have:g} {device} in the Ray cluster, too few for one image "
                          f"replica beside {rules.text_replicas} text replica(s); start Ray with "
                          f"{declare_hint(device)} (trn2.3xlarge LNC=2 -> 4 neuron_cores, LNC=1 -> 8)")
    return count


def _autoscaling(config: ServiceConfig, rules: Policy) -> dict[str, Any] | None:
    """Serve's `autoscaling_config` for the image tower, or None for a fixed count."""
    if config.autoscaling is None:
        return None
    options = config.autoscaling.model_dump()
    if options["target_ongoing_requests"] is None:
        options["target_ongoing_requests"] = calls_per_replica(rules.model_on_host_cores)
    return options


def visible_devices_env(asks: ReplicaAsks, ask: ReplicaAsk) -> tuple[str, ...]:
    """The variables that name a replica's devices: its backend's own (the record's; set by Ray where the
    replica holds that resource, or by the operator in env_vars), and NEURON_RT_VISIBLE_CORES wherever it
    holds neuron_cores (Ray's Neuron accelerator manager sets it whatever runs there: the tests place cpu
    replicas on declared cores)."""
    found = [asks.backend.visible_devices_env] if asks.backend.visible_devices_env else []
    if NEURON_CORES in ask.devices:
        found.append(VISIBLE_CORES_ENV)
    return tuple(dict.fromkeys(found))


def _tower(config: ServiceConfig, rules: Policy, asks: ReplicaAsks, tower: str, model: str, name: str, ask: ReplicaAsk,
           replicas: int, fewest: int, largest_bucket: int, threads: int | None,
           autoscaling: dict[str, Any] | None) -> TowerPlan:
    options = ask.actor_options()
    # Nothing read from the model's files: the plan is made in the builder, on the head, which may not see
    # them. The backend's own environment (neuron-native: the artifact's recipe) is set by the replica
    # itself, before it imports torch (serve/towers/replica_start.py); a config env_var that contradicts it is
    # refused there, naming both.
    env_vars = {**extra_backends_env(), **rules.tower_mode_env(), **tracing.replica_env(config.tracing),
                **config.env_vars}
    if env_vars:
        options["runtime_env"] = {"env_vars": env_vars}
    deployment = DeploymentPlan(
        name=name,
        # Serve takes either a count or an autoscaling_config (ray/serve/api.py deployment()).
        num_replicas=None if autoscaling else replicas,
        autoscaling_config=autoscaling,
        ray_actor_options=options,
        # No max_queued_requests: what waits is bounded in the ingress, by the requests it works on
        # (serve/ingress/front_door.py) and the calls its clients keep in flight (serve/ingress/tower_client.py).
        max_ongoing_requests=max_ongoing(largest_bucket),
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        # Scale-in drains too: Serve stops routing to the replica, waits while it still has calls
        # (graceful_shutdown_wait_loop_s, default 2 s) up to this timeout, then kills it.
        graceful_shutdown_timeout_s=max(5.0, config.request_timeout_s),
    )
    return TowerPlan(tower=tower, served_as=model, deployment=deployment, ask=ask, replicas=replicas,
                     min_replicas=fewest, min_ready=min(config.min_ready_replicas, replicas, fewest),
                     largest_bucket=largest_bucket, torch_threads=threads,
                     visible_devices_env=visible_devices_env(asks, ask))


# Under `model_apps` adding or removing a model changes the front application's args (under `run`, the ingress's
# slice), and so restarts every ingress replica (ray/serve/_private/version.py
# DeploymentVersion.requires_actor_restart). With a surge Serve starts each replacement before it stops the replica
# it replaces (ray/serve/_private/deployment_state.py _surge_replicas_to_start), so a single ingress replica is never
# gone while the towers stay.
INGRESS_SURGE_PERCENT = 100


def _ingress(config: ServiceConfig, image_replicas: int, surge: bool = False) -> IngressPlan:
    shared = cpu_plan.ingress_replicas_for(config, image_replicas)
    count = shared + 1 if config.interactive_ingress else shared
    scaling = config.ingress_autoscaling
    limits = front_door_limits(config, image_replicas, shared)
    options: dict[str, Any] = {"num_cpus": config.ingress_num_cpus}
    # Where to find a backend registered at run time too: the ingress asks its record (host cores or not).
    if env := {**policy_of(config).ingress_mode_env(), **tracing.replica_env(config.tracing), **extra_backends_env()}:
        options["runtime_env"] = {"env_vars": env}
    autoscaling = None
    if scaling is not None:
        autoscaling = {**scaling.model_dump(exclude={"target_busy_cores"}), "policy": policy(scaling.target_busy_cores)}
    # Every request the ingress may hold reaches its handler, whose places (serve/ingress/front_door.py) say 503 in
    # the contract's JSON; past those, Serve's proxy holds as many again, then answers its own 503. Not
    # fewer: under HAProxy a replica counts each arriving request as queued until it takes a slot
    # (ray/serve/_private/replica.py, _track_queued_request), so a small bound here would refuse part of a
    # burst HAProxy already bounded.
    held = limits.max_ongoing_requests + limits.max_queued_requests
    deployment = DeploymentPlan(name="Ingress", num_replicas=None if autoscaling else count,
                                autoscaling_config=autoscaling, ray_actor_options=options,
                                max_ongoing_requests=held, max_queued_requests=held,
                                max_surge_percent=INGRESS_SURGE_PERCENT if surge else None)
    return IngressPlan(deployment=deployment, ask=ReplicaAsk(num_cpus=config.ingress_num_cpus), replicas=count,
                       max_replicas=scaling.max_replicas if scaling is not None else count, limits=limits,
                       front=front_settings(config))


def _model(served: ServedModel, resources: Mapping[str, float] | None, suffix: str,
           text_off: str | None = None) -> ModelPlan:
    """One served model's towers; `suffix` names its deployments apart from the other models' ("" for the
    one model of a config without `models:`, whose deployments keep their plain names); `text_off`: why its text
    tower is off, where the start's checks turned it off."""
    config = served.config
    rules, settings = policy_of(config, text_off), config.model_settings()
    asks = replica_asks(config)
    replicas = image_replicas(config, asks, resources, rules)
    fewest = config.autoscaling.min_replicas if config.autoscaling is not None else replicas
    image = _tower(config, rules, asks, "image", served.name, f"Encoder{suffix}", asks.image, replicas,
                   min(fewest, replicas), settings.max_batch_size, cpu_plan.image_torch_threads(config, replicas),
                   _autoscaling(config, rules))
    if config.interactive_encoder:
        image = _kept_for_interactive(image, f"InteractiveEncoder{suffix}")
    texts = rules.text_replicas
    text = (_tower(config, rules, asks, "text", served.name, f"TextEncoder{suffix}", asks.text, texts, texts,
                   config.text_buckets[-1], cpu_plan.text_torch_threads(config), None) if texts else None)
    return ModelPlan(name=served.name, model=config.model, backend=config.backend, image=image, text=text,
                     run=TowerRun(settings=settings, batch_wait_timeout_s=config.batch_wait_timeout_s,
                                  env_vars=dict(config.env_vars), log_level=config.log_level, tracing=config.tracing),
                     front=_model_front(config, rules, settings, text_off))


def image_limits(config: ServiceConfig) -> ImageLimits:
    """What one image may be, checked from its header before it is decoded (models/preprocess.py)."""
    return ImageLimits(max_bytes=config.max_body_bytes, max_pixels=config.max_image_pixels,
                       max_side=config.max_image_side)


def _model_front(config: ServiceConfig, rules: Policy, settings: ModelSettings, text_off: str | None) -> ModelFront:
    return ModelFront(
        weights=settings.weights_source, buckets=tuple(settings.buckets), image_limits=image_limits(config),
        max_request_pixels=config.max_request_pixels, max_images_per_request=config.max_images_per_request,
        max_texts_per_request=config.max_texts_per_request, max_text_chars=config.max_text_chars,
        allow_dimension_truncation=config.allow_dimension_truncation, fast_jpeg_decode=config.fast_jpeg_decode,
        device_jpeg_decode=config.device_jpeg_decode, decode_threads=config.decode_threads,
        decode_memory_budget_bytes=config.decode_memory_budget_bytes, text_off_reason=text_off,
        model_on_host_cores=rules.model_on_host_cores, tower_calls_by_grpc=rules.tower_calls_by_grpc)


def front_settings(config: ServiceConfig) -> FrontSettings:
    """What every ingress replica holds once for every model (serve/plan/replica_slices.py)."""
    live = LiveSettings.model_validate(config.model_dump(include=set(LIVE_KEYS)))
    return FrontSettings(live=live, max_body_bytes=config.max_body_bytes,
                         api_key=config.api_key, api_key_file=config.api_key_file, needs_keys=config.needs_keys,
                         tracing=config.tracing, access_log=config.access_log)


def _kept_for_interactive(image: TowerPlan, name: str) -> TowerPlan:
    """`image` with one of its replicas in a deployment of its own, `name`, kept for the interactive lane (the
    ingress sends that lane's chunks there, serve/ingress/tower_link.py `Towers.for_lane`); the count is unchanged."""
    if image.replicas < 2:
        raise ConfigError(f"interactive_encoder keeps one image replica for the interactive lane and needs another for "
                          f"the other lanes; this plan has {image.replicas} (name replicas: 2 or more)")
    shared = image.deployment.model_copy(update={"num_replicas": image.replicas - 1})
    kept = image.deployment.model_copy(update={"name": name, "num_replicas": 1})
    return image.model_copy(update={"deployment": shared, "interactive": kept})


def plan_service(config: ServiceConfig, resources: Mapping[str, float] | None = None, *,
                 text_off: str | None = None) -> ServicePlan:
    """The plan of `config` on a Ray cluster whose totals are `resources` (None: none yet). `text_off`: why the
    default model's text tower is off, where the start's checks turned its default off (serve/plan/model_checks.py,
    serve/app.py text_by_shape): it is planned without one, and the ingress says why."""
    served = served_models(config)
    several = len(config.models) > 0
    if several and (auto := [m.name for m in served if policy_of(m.config).replica_setting == "auto"]):
        raise ConfigError(f"models {', '.join(auto)}: with several models name each one's replicas (or its "
                          "autoscaling): `auto` would give every model the whole cluster")
    models = tuple(_model(model, resources, f"-{model.name}" if several else "", text_off if index == 0 else None)
                   for index, model in enumerate(served))
    # The ingress serves every model: its share of all their image replicas' calls, sized as the default
    # model's (whose config holds the service's own settings, as every model's does).
    replicas = sum(model.image.replicas for model in models)
    # Where the models can change without a restart (`model_apps`, or `run`'s reload of `models:`), the ingress,
    # bound with every model's part, is replaced each time: with a surge.
    return ServicePlan(models=models, ingress=_ingress(served[0].config, replicas, config.model_apps or several))
