"""The models one service serves, by the name a request's `model` gives: the config's `models:` entries, or
the one model of a config without them (named by its `model`).

An entry (serve/plan/model_entry.py ModelEntry) is `name` and that model's own settings over the service's
(the top-level ones): what to load and how (model, weights, backend, buckets, artifact, tokenizer) and how it is
served (replicas, autoscaling, text_replicas, CPUs and NeuronCores per replica, env_vars, ...). Every entry
becomes a full ServiceConfig, validated as one, so a model is configured exactly as a service of its own would
be; the front door, the ingress, its limits and the cache stay the service's. Worked out once, at start, by the
planner (serve/plan/planner.py), which names each model's deployments after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from siglip_serve.core.errors import describe_validation
from siglip_serve.serve.plan.config import FRONT_ONLY, ConfigError, ModelList, ServiceConfig, entry_label
from siglip_serve.serve.plan.service_plan import model_app_name as model_app_name


def model_app_args(args: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The `args:` of model `name`'s own application, from the front application's: the settings its towers
    read (every key but FRONT_ONLY's) and its one `models:` entry as written, nothing another model or the
    ingress sets."""
    config = ServiceConfig.from_args(args)
    names = [entry.name for entry in config.models]
    if name not in names:
        raise ConfigError(f"model {name!r} is not among models: ({', '.join(names) or 'none'})")
    entry = args["models"][names.index(name)]
    return {**{key: value for key, value in args.items() if key not in FRONT_ONLY}, "models": [dict(entry)]}


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
    # What the service sets explicitly, under what each entry sets: a default the service leaves alone is no
    # setting of its own.
    shared = config.model_dump(exclude_unset=True, exclude=set(ModelList.model_fields))
    served: list[ServedModel] = []
    for index, entry in enumerate(config.models):
        try:
            merged = ServiceConfig.model_validate({**shared, **entry.own()})
        except ValidationError as exc:
            where = entry_label(index, entry.name)
            raise ConfigError(f"{where}: {describe_validation(exc.errors(), 'config')}") from None
        served.append(ServedModel(name=entry.name, config=merged))
    names = [model.name for model in served]
    default = config.default_model or names[0]
    if default not in names:
        raise ConfigError(f"default_model {default!r} is none of the models: {', '.join(names)}")
    return tuple(sorted(served, key=lambda model: model.name != default))


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

