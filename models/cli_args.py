"""Command-line options that choose a model and its weights, shared by the models/ tools.

(`serve/cli.py` has its own for `run`; these serve `compile`, `accuracy` and the multi-core bench,
which must not import the serving package.)
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from models.settings import ModelSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class SettingsError(ValueError):
    """Settings that do not validate; the message names every bad key."""


def add_model_arguments(parser: argparse.ArgumentParser, backend: bool = True) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="open_clip SigLIP config (default ViT-SO400M-14-SigLIP-384; tiny-siglip for tests)")
    weights = group.add_mutually_exclusive_group()
    weights.add_argument("--pretrained", help="open_clip pretrained tag (default webli)")
    weights.add_argument("--checkpoint", help="state dict saved with torch.save(model.state_dict())")
    weights.add_argument("--random-weights", action="store_true", default=None,
                         help="seeded random weights: embeddings mean nothing (tests, plumbing)")
    group.add_argument("--seed", type=int, help="seed of random weights (default 0)")
    group.add_argument("--buckets", help="batch sizes, e.g. 1,2,4,8")
    if backend:
        group.add_argument("--backend", choices=["cpu", "cuda", "neuron", "neuron-native"], help="default cpu")
        group.add_argument("--artifact-dir", help="neuron: compiled artifact directory")
        group.add_argument("--torch-threads", type=int, help="cpu: torch threads")
        group.add_argument("--cuda-dtype", choices=["bf16", "fp16", "fp32"], help="cuda: autocast dtype")


_KEYS = ("model", "pretrained", "checkpoint", "random_weights", "seed", "buckets", "backend",
         "artifact_dir", "torch_threads", "cuda_dtype")


def model_values(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in _KEYS if getattr(args, k, None) is not None}


def validate_settings(values: dict[str, Any]) -> ModelSettings:
    try:
        return ModelSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid model settings: {problems}") from None


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> ModelSettings:
    return validate_settings({**model_values(args), **overrides})


def model_settings_of(settings: ModelSettings) -> ModelSettings:
    """The plain ModelSettings inside any subclass (e.g. the service config), for pickling to workers."""
    return ModelSettings(**{name: getattr(settings, name) for name in ModelSettings.model_fields})
