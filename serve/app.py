"""The Ray Serve application: `serve run serve.app:build_app model=tiny-siglip` or a Serve YAML."""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray import serve
from ray.serve import Application

from models.loading import model_geometry
from serve.config import ConfigError, ServiceConfig
from serve.encoder_deployment import encoder_deployment
from serve.ingress import IngressDeployment
from serve.text_deployment import text_deployment, text_neuron_cores

log = logging.getLogger("siglip_serve")

# Concurrent HTTP requests one ingress replica holds; they are cheap awaits on the encoder.
INGRESS_MAX_ONGOING = 1024


def resolve_replicas(config: ServiceConfig) -> int:
    """The encoder replica count; 'auto' counts the logical NeuronCores the cluster declares."""
    if config.replicas != "auto":
        return int(config.replicas)
    if not ray.is_initialized():
        raise ConfigError("replicas: auto needs a running Ray cluster to count neuron_cores")
    cores = int(ray.cluster_resources().get("neuron_cores", 0))
    if cores < 1:
        raise ConfigError(
            "replicas: auto found no neuron_cores in the Ray cluster; start Ray with "
            "--resources='{\"neuron_cores\": N}' (N = logical cores: trn2.3xlarge LNC=2 -> 4, LNC=1 -> 8)"
        )
    # Text replicas (opt-in on neuron) take NeuronCores of their own.
    return (cores - config.text_replica_count * text_neuron_cores(config)) // max(config.cores_per_replica, 1)


def build(config: ServiceConfig) -> Application:
    replicas = resolve_replicas(config)
    image_size, embed_dim = model_geometry(config.model)
    model = {"name": config.model, "image_size": list(image_size), "embed_dim": embed_dim}
    encoder = encoder_deployment(config, replicas).bind(config)
    ingress = serve.deployment(
        IngressDeployment,
        name="Ingress",
        num_replicas=config.ingress_replicas,
        ray_actor_options={"num_cpus": config.ingress_num_cpus},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
    )
    text = text_deployment(config).bind(config) if config.text_replica_count else None
    log.info("application: %s on %s, %d encoder replica(s), buckets %s, %d text replica(s)",
             config.model, config.backend, replicas, list(config.buckets), config.text_replica_count)
    return ingress.bind(encoder, config, replicas, model, text)


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Serve's application builder: `args` is the YAML `args:` mapping."""
    return build(ServiceConfig.from_args(args))
