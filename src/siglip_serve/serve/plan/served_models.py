"""The models one service serves, by the name a request's `model` gives: the config's `models:` entries, or
the one model of a config without them (named by its `model`).

An entry is `name` and that model's own settings over the service's (the top-level ones): what to load and
how (model, weights, backend, buckets, artifact, tokenizer) and its share of the cluster (replicas,
autoscaling, text_replicas, CPUs and NeuronCores per replica, env_vars). Every entry becomes a full
ServiceConfig, validated as one, so a model is configured exactly as a service of its own would be; the
front door, the ingress, its limits and the cache stay the service's. Worked out once, at start, by the
planner (serve/plan/planner.py), which names each model's deployments after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from siglip_serve.core.errors import describe_validation
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.service_plan import model_app_name as model_app_name

# What an entry may set: the model itself and its towers' placement. Everything else is the service's.
PER_MODEL: frozenset[str] = frozenset(ModelSettings.model_fields) | {
    "replicas", "neuron_cores_per_replica", "encoder_num_cpus", "autoscaling", "text_replicas", "text_num_cpus",
    "env_vars", "min_ready_replicas", "batch_wait_timeout_s", "device_jpeg_decode", "fast_jpeg_decode",
    "allow_dimension_truncation",
}
# A name goes into deployment names, URLs' query strings and metric labels as it is.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# What the ingress alone reads. Left out of a model's own application (`model_apps`), so changing one of them
# rolls the ingress only: the towers' code version is their application's args' hash.
FRONT_ONLY: frozenset[str] = frozenset({
    "models", "default_model", "model_apps", "api_key", "api_key_file", "url_fetch_allowlist",
    "url_fetch_concurrency", "url_fetch_timeout_s", "embedding_cache_mib", "max_body_bytes", "max_image_pixels",
    "max_image_side", "max_request_pixels", "max_images_per_request", "max_texts_per_request", "max_text_chars",
    "decode_memory_budget_bytes", "decode_threads", "max_queued_requests", "retry_after_s", "drain_timeout_s",
    "ingress_replicas", "ingress_autoscaling", "ingress_num_cpus", "ingress_max_ongoing_requests", "access_log",
    "share_beside_others", "interactive_ingress",
})


def model_app_args(args: dict[str, Any], name: str) -> dict[str, Any]:
    """The `args:` of model `name`'s own application, from the front application's: the settings its towers
    read and its one `models:` entry, nothing another model or the ingress sets."""
    entries = [entry for entry in args.get("models") or () if isinstance(entry, dict) and entry.get("name") == name]
    if len(entries) != 1:
        raise ConfigError(f"model {name!r} is not among models: (or named twice)")
    return {**{key: value for key, value in args.items() if key not in FRONT_ONLY}, "models": [dict(entries[0])]}


@dataclass(frozen=True)
class ServedModel:
    """One model of the service: the name requests use, and its whole config (validated once, where it is made:
    not again each time the models are listed)."""

    name: str
    config: ServiceConfig


def served_models(config: ServiceConfig) -> tuple[ServedModel, ...]:
    """Every model `config` serves, the default first; ConfigError naming the entry and key at fault."""
    if not config.models:
        if config.default_model not in (None, config.model):
            raise ConfigError(f"default_model {config.default_model!r} is not a served model; this service serves "
                              f"{config.model!r} (several models: list them under models:)")
        return (ServedModel(name=config.model, config=config),)
    shared = config.model_dump(exclude_unset=True, exclude={"models", "default_model", "model_apps"})
    served: list[ServedModel] = []
    for index, entry in enumerate(config.models):
        served.append(_entry(index, entry, shared, [model.name for model in served]))
    names = [model.name for model in served]
    default = config.default_model or names[0]
    if default not in names:
        raise ConfigError(f"default_model {default!r} is none of the models: {', '.join(names)}")
    return tuple(sorted(served, key=lambda model: model.name != default))


def _entry(index: int, entry: dict[str, Any], shared: dict[str, Any], taken: list[str]) -> ServedModel:
    where = f"models[{index}]"
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}.name: give each model a name of letters, digits, '.', '_' or '-' (at most 63), "
                          f"the name requests' `model` uses; got {name!r}")
    if name in taken:
        raise ConfigError(f"{where}.name: {name!r} is named twice")
    unknown = sorted(set(entry) - PER_MODEL - {"name"})
    if unknown:
        raise ConfigError(f"{where} ({name}): {', '.join(unknown)} belong to the service, not one model; set them "
                          f"beside models:, or per model only {', '.join(sorted(PER_MODEL))}")
    own = {key: value for key, value in entry.items() if key != "name"}
    try:
        config = ServiceConfig.model_validate({**shared, **own})
    except ValidationError as exc:
        raise ConfigError(f"{where} ({name}): {describe_validation(exc.errors(), 'config')}") from None
    return ServedModel(name=name, config=config)


def served_model(config: ServiceConfig, name: str | None) -> ServedModel:
    """The model `name` of `config` (None: its default); ConfigError naming the served ones."""
    served = served_models(config)
    if name is None:
        return served[0]
    found = [model for model in served if model.name == name]
    if not found:
        raise ConfigError(f"model {name!r} is not served by this config; it serves "
                          f"{', '.join(repr(model.name) for model in served)}")
    return found[0]

