"""The plumbing every command line of the project shares: options derived from pydantic models, errors,
`KEY=VALUE`, logging, main(). Torch-free and knowing no settings model of its own, so every package
can import it; the model flags of encoder-building commands are models/cli_args.py's.

Options that set a settings field are derived from the pydantic model: the flag is the field name, the
help its description, the choices its Literal type (or its JSON schema's `enum`). A new field needs
no second list.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from siglip_serve.core.constants import NOT_SETTINGS_ENV, SETTINGS_ENV_NESTED_DELIMITER, SETTINGS_ENV_PREFIX
from siglip_serve.core.errors import UserError, describe_validation

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)


class SettingsError(UserError, ValueError):
    """Settings that do not validate; the message names every bad key."""


# -- options derived from settings models ---------------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _argument(info: FieldInfo) -> dict[str, Any]:
    """argparse keywords for one field: bool -> a switch, Literal (or a schema enum) -> choices, int/float -> type."""
    annotation = info.annotation
    if annotation is bool:
        return {"action": "store_true", "default": None}
    kinds = list(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else [annotation]
    kinds = [k for k in kinds if k is not type(None)]
    keywords: dict[str, Any] = {"default": None}  # None: not given, the model's default applies
    schema = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    enum = schema.get("enum")
    if len(kinds) == 1 and get_origin(kinds[0]) is Literal:
        keywords["choices"] = list(get_args(kinds[0]))
    elif isinstance(enum, list):
        keywords["choices"] = list(enum)
    elif kinds in ([int], [float]):
        keywords["type"] = kinds[0]
    return keywords


def _help(info: FieldInfo) -> str:
    text = info.description or ""
    default = info.default
    # `is`: 0 == False; an empty tuple (none configured) says nothing either.
    if not any(default is unset for unset in (None, False, PydanticUndefined)) and default != ():
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        text = f"{text} (default {shown})" if text else f"default {shown}"
    return text


def add_field_arguments(parser: argparse._ActionsContainer, model: type[BaseModel],
                        names: Iterable[str], exclusive: frozenset[str] = frozenset()) -> None:
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


def option_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The named options the user gave (None: not given)."""
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


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


# -- SIGLIP_<KEY> ---------------------------------------------------------------------------------

def environment_values(model: type[BaseModel], environ: Mapping[str, str],
                       exclude: Iterable[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """(the fields of `model` that `environ` sets as SIGLIP_<FIELD>, the SIGLIP_ names that are no field).

    pydantic-settings reads them (any case; a nested key's parts joined by `__`; lists and mappings as
    JSON) into a model of the same fields, all optional, so each value is typed as its field is; `model`'s
    own rules apply when the caller validates the merged settings. A bad value raises SettingsError naming
    the variable."""
    from pydantic import create_model
    from pydantic_settings import BaseSettings, EnvSettingsSource

    skip = set(exclude)
    fields: dict[str, Any] = {name: (info.annotation | None, None)  # type: ignore[operator]
                              for name, info in model.model_fields.items() if name not in skip}
    given = {name: value for name, value in environ.items() if name.upper().startswith(SETTINGS_ENV_PREFIX)}
    keys = {name: name[len(SETTINGS_ENV_PREFIX):].split(SETTINGS_ENV_NESTED_DELIMITER)[0].lower() for name in given}
    strays = sorted(name for name, key in keys.items() if key not in fields and name.upper() not in NOT_SETTINGS_ENV)
    reader = create_model(f"{model.__name__}Environment", __base__=BaseSettings, **fields)
    source = EnvSettingsSource(reader, case_sensitive=False, env_prefix=SETTINGS_ENV_PREFIX,
                               env_nested_delimiter=SETTINGS_ENV_NESTED_DELIMITER)
    # The mapping we were given, not this process's os.environ (which the source read when made).
    source.env_vars = {name.lower(): value for name, value in given.items()}
    try:
        # model_validate, not the constructor: a BaseSettings' constructor would read os.environ again.
        values = reader.model_validate(source()).model_dump(exclude_unset=True)
    except (ValidationError, ValueError) as exc:  # ValueError: pydantic-settings' own, for bad JSON
        detail = describe_validation(exc.errors(), "environment") if isinstance(exc, ValidationError) else str(exc)
        raise SettingsError(f"a {SETTINGS_ENV_PREFIX}<KEY> variable is invalid: {detail}") from None
    return values, strays


# -- logging and main() ---------------------------------------------------------------------------

def add_log_level(parser: argparse.ArgumentParser, default: str | None = "INFO") -> None:
    parser.add_argument("--log-level", default=default, choices=LOG_LEVELS)


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
