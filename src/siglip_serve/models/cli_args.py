"""The model flags every encoder-building command takes (run, bench, compile, embed, the multi-core
bench), derived from `ModelSettings`; the generic command-line plumbing is core/cli.py."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from siglip_serve.core.cli import SettingsError, add_field_arguments, option_values
from siglip_serve.core.errors import describe_validation
from siglip_serve.models.settings import ModelSettings

# The model flags of every command that builds an encoder; BACKEND_OPTIONS where it picks the backend.
MODEL_OPTIONS = ("model", "revision", "pretrained", "checkpoint", "random_weights", "seed", "buckets", "patch_budgets")
BACKEND_OPTIONS = ("backend", "artifact_dir", "torch_threads", "cuda_dtype")
# One source of weights: argparse refuses two at once (the settings' validator would too, later).
WEIGHT_SOURCES = frozenset({"pretrained", "checkpoint", "random_weights"})


def validate_settings(values: Mapping[str, Any]) -> ModelSettings:
    try:
        return ModelSettings.model_validate(dict(values))
    except ValidationError as exc:
        raise SettingsError(f"invalid model settings: {describe_validation(exc.errors())}") from None


def add_model_arguments(parser: argparse.ArgumentParser, backend: bool = True,
                        extra: Sequence[str] = ()) -> None:
    """The model flags (and, with `backend`, the backend flags) every encoder-building command takes."""
    names = MODEL_OPTIONS + (BACKEND_OPTIONS if backend else ()) + tuple(extra)
    add_field_arguments(parser.add_argument_group("model"), ModelSettings, names, WEIGHT_SOURCES)


def model_values(args: argparse.Namespace) -> dict[str, Any]:
    return option_values(args, ModelSettings.model_fields)


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> ModelSettings:
    return validate_settings({**model_values(args), **overrides})


def model_settings_of(settings: ModelSettings) -> ModelSettings:
    """The plain ModelSettings inside any subclass (e.g. the service config), for pickling to workers."""
    return settings.model_settings()
