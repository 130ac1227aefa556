"""The one base class of errors the user can fix (a bad option, a missing SDK, a taken port), the
errors more than one package raises, and the one way pydantic validation errors are told to a user
(CLI, config, HTTP 422).

Every command's main() runs through `siglip_serve.models.cli_args.run_main`, which prints such an error as one
line and returns its `exit_code`; any other exception is a bug and keeps its traceback. Subclasses
keep their builtin base too (ValueError, RuntimeError), so library callers catch them as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class UserError(Exception):
    """A problem the user can fix; the message is one line that says what to do."""

    exit_code: int = 2


class ConfigError(UserError, ValueError):
    """A configuration does not validate; the message lists every problem."""


class BackendUnavailable(UserError, RuntimeError):
    """This machine cannot run the backend; the message is one line saying what to install or fix."""


class ModelLoadError(UserError, RuntimeError):
    """The model could not be loaded; the message says why and what to do instead."""


class Rejected(Exception):
    """Base of every rejection of one input (an image, a text, an image URL): what its sender has to do
    differently, in plain words (`message`, safe to answer). The families (models/image_errors.py,
    core/texts.py, serve/ingress/url_fetch.py) know no transport; serve/http/errors.py's REJECTIONS is the one table of
    what each means in the HTTP contract, for the service and for bulk's errors table."""

    message: str

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DeadlineExceeded(TimeoutError):
    """A request's deadline passed before its batch ran: a tower replica drops it unrun and the ingress
    answers 504 (both sides raise or catch it, neither imports the other)."""


def describe_validation(errors: Iterable[Mapping[str, Any]], root: str = "settings",
                        drop: Sequence[str] = ()) -> str:
    """Pydantic errors as one line: 'buckets: Value error, ...; seed: Input should be ...'.

    `drop` leaves location parts out (FastAPI's 'body'); `root` names an error with no location left.
    """
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in drop]
        parts.append(f"{'.'.join(loc) or root}: {err.get('msg')}")
    return "; ".join(parts)
