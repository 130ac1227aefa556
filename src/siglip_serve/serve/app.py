"""The Ray Serve application: `serve run siglip_serve.serve.app:build_app model=tiny-siglip` or a Serve YAML."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.serve.exceptions import RayServeException

from siglip_serve.core.backends import extra_backends_env
from siglip_serve.core.errors import UserError
from siglip_serve.models.loading import ModelInfo, model_geometry
from siglip_serve.serve import tracing
from siglip_serve.serve.cluster_fit import Growth, check_cluster_fits, cluster_growth, settled_neuron_cores
from siglip_serve.serve.config import ConfigError, ServiceConfig
from siglip_serve.serve.cpu_plan import auto_cpu_replicas, encoder_torch_threads, ingress_replicas_for
from siglip_serve.serve.encoder_deployment import encoder_deployment
from siglip_serve.serve.front_door import front_door_limits
from siglip_serve.serve.http_app import Probe, Route
from siglip_serve.serve.ingress_deployment import IngressDeployment
from siglip_serve.serve.text_deployment import text_deployment, text_neuron_cores

log = logging.getLogger("siglip_serve")


def resolve_replicas(config: ServiceConfig) -> int:
    """The encoder replica count; 'auto' counts the logical NeuronCores the cluster declares when the
    replicas ask for them, else (cpu) the cores of this machine (serve/cpu_plan.py)."""
    setting = config.replica_setting
    if setting != "auto":
        return setting
    if config.cores_per_replica == 0:
        return auto_cpu_replicas(config, ray.cluster_resources().get("CPU") if ray.is_initialized() else None)
    if not ray.is_initialized():
        raise ConfigError("replicas: auto needs a running Ray cluster to count neuron_cores")
    cores = int(ray.cluster_resources().get("neuron_cores", 0))
    if cores < 1:
        raise ConfigError(
            "replicas: auto found no neuron_cores in the Ray cluster; start Ray with "
            "--resources='{\"neuron_cores\": N}' (N = logical cores: trn2.3xlarge LNC=2 -> 4, LNC=1 -> 8)"
        )
    return _replicas_on(config, cores)


def _replicas_on(config: ServiceConfig, cores: float) -> int:
    # Text replicas (opt-in on neuron) take NeuronCores of their own.
    return (int(cores) - config.text_replica_count * text_neuron_cores(config)) // max(config.cores_per_replica, 1)


def pin_replicas(config: ServiceConfig) -> ServiceConfig:
    """The config with the encoder count decided, where that needs no Ray cluster (all but 'auto' over
    NeuronCores): a local Ray is then started with CPUs for all of them, and the count cannot change
    between that start and the deployment (the available memory moves as Ray starts)."""
    if config.replica_setting == "auto" and config.cores_per_replica > 0:
        return config
    replicas = resolve_replicas(config)
    return config.model_copy(update={"replicas": replicas, **_pinned_ingress(config, replicas)})


def pin_neuron_replicas(config: ServiceConfig, growth: Growth,
                        stop: Callable[[], bool] = lambda: False) -> ServiceConfig:
    """`replicas: auto` over NeuronCores, decided once. Where the cluster grows, the workers that hold the
    cores may not have registered yet (KubeRay deploys once the head is ready): wait, up to
    `cluster_wait_s` or until `stop()`, for their count to appear and hold (serve/cluster_fit.py), then pin it."""
    if config.replica_setting != "auto" or config.cores_per_replica == 0 or not growth.grows:
        return config
    cores = settled_neuron_cores(config.cluster_wait_s, growth, stop=stop)
    replicas = max(1, _replicas_on(config, cores))
    log.info("replicas: auto -> %d encoder replica(s) (%s)", replicas, growth.why)
    return config.model_copy(update={"replicas": replicas, **_pinned_ingress(config, replicas)})


def _pinned_ingress(config: ServiceConfig, replicas: int) -> dict[str, Any]:
    """`ingress_replicas` decided, unless the ingress autoscales (its count is then Serve's to set)."""
    if config.ingress_autoscaling is not None:
        return {}
    return {"ingress_replicas": ingress_replicas_for(config, replicas)}


def build(config: ServiceConfig, routes: Sequence[Route | Probe] = ()) -> Application:
    """The application: the towers' deployments and the ingress, serving the contract's routes and `routes`."""
    replicas = resolve_replicas(config)
    config = config.model_copy(update=_pinned_ingress(config, replicas))
    image_size, embed_dim = model_geometry(config.model)
    model = ModelInfo(config.model, embed_dim, image_size, config.weights_source)
    # Only the image replicas split the cores; the text replica keeps its own default.
    encoder_config = config.model_copy(update={"torch_threads": encoder_torch_threads(config, replicas)})
    encoder = encoder_deployment(encoder_config, replicas).bind(encoder_config)
    ingress_options: dict[str, Any] = {"num_cpus": config.ingress_num_cpus}
    # Where to find a backend registered at run time too: the ingress asks its record (host cores or not).
    if ingress_env := {**config.serve_mode_env(), **tracing.replica_env(config.tracing), **extra_backends_env()}:
        ingress_options["runtime_env"] = {"env_vars": ingress_env}
    scale: dict[str, Any] = ({"autoscaling_config": config.ingress_autoscaling_config()}
                             if config.ingress_autoscaling is not None else {"num_replicas": config.ingress_count})
    limits = front_door_limits(config, replicas)
    ingress = serve.deployment(
        IngressDeployment,
        name="Ingress",
        ray_actor_options=ingress_options,
        # Every request the ingress may hold reaches its handler, whose places (serve/front_door.py) say
        # 503 in the contract's JSON; past those, Serve's proxy holds as many again, then answers its own
        # 503. Not fewer: under HAProxy a replica counts each arriving request as queued until it takes
        # a slot (ray/serve/_private/replica.py, _track_queued_request), so a small bound here would
        # refuse part of a burst HAProxy already bounded.
        max_ongoing_requests=limits.max_ongoing_requests + limits.max_queued_requests,
        max_queued_requests=limits.max_ongoing_requests + limits.max_queued_requests,
        **scale,
    )
    text = text_deployment(config).bind(config) if config.text_replica_count else None
    ingress_scaling = config.ingress_autoscaling
    log.info("application: %s on %s, %s encoder replica(s)%s, buckets %s, %s ingress replica(s), %d text replica(s)",
             config.model, config.backend,
             replicas if config.autoscaling is None else f"{config.autoscaling.min_replicas}..{replicas} autoscaled",
             f" x {encoder_config.torch_threads} torch thread(s)" if encoder_config.torch_threads else "",
             list(config.buckets), config.ingress_count if ingress_scaling is None else
             f"{ingress_scaling.min_replicas}..{ingress_scaling.max_replicas} autoscaled", config.text_replica_count)
    return ingress.bind(encoder, config, replicas, model, text, tuple(routes))


def text_by_shape(config: ServiceConfig) -> ServiceConfig:
    """The text tower's default decided from the config alone. Asked for (`text_replicas: N` or
    `tokenizer: DIR`), or with a tokenizer bundled in the package (the tiny models): as configured, and
    each text replica loads the tokenizer where it runs. Else off, saying how to turn it on: whether the
    workers hold the model's tokenizer or reach the hub is not something the head can see.
    (`siglip-serve run` decides it by looking, serve/model_checks.py preflight_tokenizer.)"""
    from siglip_serve.models.text import BUNDLED_TOKENIZERS

    if config.text_replicas is not None or config.tokenizer is not None or config.text_replica_count == 0:
        return config
    if config.model in BUNDLED_TOKENIZERS:
        return config
    from siglip_serve.serve.model_checks import text_off

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


def build_app_with_routes(args: dict[str, Any] | None, routes: Sequence[Route | Probe] = ()) -> Application:
    """The application of `args` (the YAML `args:` mapping) with `routes`, more routes beside the
    contract's (serve/routes.py), each on the same front door and scheduling call (a test's, say).

    It runs where Serve runs it: on the head, which under KubeRay mounts no artifacts, holds no weights'
    cache and may have no route to the hub. So it checks the configuration's shape only, once, before any
    replica starts: the config, the text tower's default (`text_by_shape`), and that the cluster can hold
    the replicas (where nodes join later, it warns and deploys instead, and waits for the NeuronCores
    `replicas: auto` counts: serve/cluster_fit.py). The artifact, the weights, the tokenizer, an SDK or a
    GPU are checked by each replica on its own node, which refuses in one line naming the node and the
    fix (serve/replica_start.py). `siglip-serve run` checks them before it starts its own Ray (launcher/cli.py)."""
    try:
        config = text_by_shape(ServiceConfig.from_args(args))
        if config.tracing:
            tracing.check_available()
        if ray.is_initialized():
            growth = cluster_growth(config)
            # Decided once, for the check and the build: cpu's auto builds the model on the meta device.
            config = pin_neuron_replicas(pin_replicas(config), growth)
            check_cluster_fits(config, resolve_replicas(config), growth)
        return build(config, routes)
    except UserError as exc:  # a config or cluster problem: refused once, not retried
        log.error("%s", exc)
        raise AppRefused(str(exc)) from None
