"""The plumbing every command line of the project shares: options, errors, `KEY=VALUE`, logging, main().

Options that set a settings field are derived from the pydantic model (`ModelSettings` here,
`siglip_serve.serve.config.ServiceConfig` for the service): the flag is the field name, the help its
description, the choices its Literal type. So `run`, `bench`, `compile` and the multi-core bench
take the same model flags, and a new field needs no second list. This module lives in models/, the
lowest layer, so serve/, loadtest/ and kernels/ can all import it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# Re-exported: a command needs only this module.
from siglip_serve.core.errors import UserError as UserError
from siglip_serve.core.errors import describe_validation as describe_validation
from siglip_serve.models.settings import ModelSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)

# The model flags of every command that builds an encoder; BACKEND_OPTIONS where it picks the backend.
MODEL_OPTIONS = ("model", "pretrained", "checkpoint", "random_weights", "seed", "buckets")
BACKEND_OPTIONS = ("backend", "artifact_dir", "torch_threads", "cuda_dtype")
# One source of weights: argparse refuses two at once (the settings' validator would too, later).
WEIGHT_SOURCES = frozenset({"pretrained", "checkpoint", "random_weights"})


class SettingsError(UserError, ValueError):
    """Settings that do not validate; the message names every bad key."""


# -- pydantic errors -----------------------------------------------------------------------------

def validate_settings(values: Mapping[str, Any]) -> ModelSettings:
    try:
        return ModelSettings.model_validate(dict(values))
    except ValidationError as exc:
        raise SettingsError(f"invalid model settings: {describe_validation(exc.errors())}") from None


# -- options derived from settings models ---------------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _argument(info: FieldInfo) -> dict[str, Any]:
    """argparse keywords for one field: bool -> a switch, Literal -> choices, int/float -> type."""
    annotation = info.annotation
    if annotation is bool:
        return {"action": "store_true", "default": None}
    kinds = list(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else [annotation]
    kinds = [k for k in kinds if k is not type(None)]
    keywords: dict[str, Any] = {"default": None}  # None: not given, the model's default applies
    if len(kinds) == 1 and get_origin(kinds[0]) is Literal:
        keywords["choices"] = list(get_args(kinds[0]))
    elif kinds in ([int], [float]):
        keywords["type"] = kinds[0]
    return keywords


def _help(info: FieldInfo) -> str:
    text = info.description or ""
    default = info.default
    if not any(default is unset for unset in (None, False, PydanticUndefined)):  # `is`: 0 == False
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        text = f"{text} (default {shown})" if text else f"default {shown}"
    return text


def add_field_arguments(parser: argparse._ActionsContainer, model: type[BaseModel],
                        names: Iterable[str], exclusive: frozenset[str] = WEIGHT_SOURCES) -> None:
    """Add `--field-name` for each named field of `model`; the fields in `exclusive` exclude each other."""
    group = None
    for name in names:
        info = model.model_fields[name]
        target = parser
        if name in exclusive:
            if group is None:
                group = parser.add_mutually_exclusive_group()
            target = group
        target.add_argument(_flag(name), dest=name, help=_help(info).replace("%", "%%"), **_argument(info))


def fields_help(model: type[BaseModel]) -> str:
    """'name: description (default X)', one wrapped line per field of `model`: an epilog listing the
    keys `--set KEY=VALUE` (and a Serve config's `args:`) take."""
    import textwrap

    return "\n".join(textwrap.fill(f"{name}: {_help(info)}", width=100, initial_indent="  ", subsequent_indent="      ",
                                    break_on_hyphens=False)
                      for name, info in model.model_fields.items())


def add_model_arguments(parser: argparse.ArgumentParser, backend: bool = True,
                        extra: Sequence[str] = ()) -> None:
    """The model flags (and, with `backend`, the backend flags) every encoder-building command takes."""
    names = MODEL_OPTIONS + (BACKEND_OPTIONS if backend else ()) + tuple(extra)
    add_field_arguments(parser.add_argument_group("model"), ModelSettings, names)


def option_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The named options the user gave (None: not given)."""
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


def model_values(args: argparse.Namespace) -> dict[str, Any]:
    return option_values(args, ModelSettings.model_fields)


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> ModelSettings:
    return validate_settings({**model_values(args), **overrides})


def model_settings_of(settings: ModelSettings) -> ModelSettings:
    """The plain ModelSettings inside any subclass (e.g. the service config), for pickling to workers."""
    return ModelSettings(**{name: getattr(settings, name) for name in ModelSettings.model_fields})


# -- KEY=VALUE ------------------------------------------------------------------------------------

def key_value(text: str) -> tuple[str, str]:
    """'KEY=VALUE' -> (KEY, VALUE), the value as written: the argparse `type` of every KEY=VALUE option."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def settings_values(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """KEY=VALUE pairs naming settings fields: dashes in a key read as underscores, and a value parses
    as a YAML scalar or list (as in a Serve config's `args:`)."""
    import yaml

    return {key.replace("-", "_"): yaml.safe_load(value) for key, value in pairs}


# -- logging and main() ---------------------------------------------------------------------------

def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)


def setup_logging(level: str | int) -> None:
    """The project's one log format, on stderr (stdout is for a command's results)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)


def run_main(command: Callable[[], int | None], log: logging.Logger | None = None) -> int:
    """Run a command's body and return its exit code.

    A UserError or a settings ValidationError is one line on stderr (through `log` where the command
    logs, else 'error: ...') and its exit code; anything else is a bug and keeps its traceback.
    """
    try:
        return int(command() or 0)
    except UserError as exc:
        message, code = str(exc), exc.exit_code
    except ValidationError as exc:
        message, code = f"invalid {exc.title}: {describe_validation(exc.errors())}", 2
    if log is not None:
        log.error("%s", message)
    else:
        print(f"error: {message}", file=sys.stderr)
    return code
