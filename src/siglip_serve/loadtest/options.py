"""The load-test options that both parsers take, declared once: `siglip-serve loadtest` (loadtest/cli.py)
adds them from this list and hands their values to Locust, whose parser (loadtest/locustfile.py, read by
loadtest/stepshape.py too) adds them from the same list. Imports nothing of Locust: the CLI's process must
not run Locust's gevent monkey-patching (loadtest/cli.py says why)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from siglip_serve.measure.corpus import ENDPOINTS


def parse_duration(text: str) -> float:
    """Locust's run-time syntax: 90, 90s, 1m30s, 2h.

    Not locust.util.timespan.parse_timespan: importing any module of Locust runs its package's
    gevent monkey-patching."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.fullmatch(r"(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?", text)
    if not parts or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: use e.g. 90, 90s, 1m30s, 2h")
    hours, minutes, seconds = (int(g or 0) for g in parts.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


@dataclass(frozen=True)
class Option:
    flag: str
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def help_text(self) -> str:
        """The help with its default, unless the help already says what the default does."""
        if "default" in self.help or "0:" in self.help:
            return self.help
        shown = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return f"{self.help} (default {shown})"


# A value equal to an option's "off" default (0, "") is not passed on: Locust then keeps that default.
OPTIONS: tuple[Option, ...] = (
    Option("--endpoint", str, "raw", "raw image bytes, multipart file parts, or JSON base64", ENDPOINTS),
    Option("--images-per-request", int, 1, "images in each request"),
    Option("--images", str, "", "folder of images to send (default: the sample photos)"),
    Option("--encoding-format", str, "float", "json endpoint: how embeddings come back (base64 is cheaper for the "
                                              "client to parse)", ("float", "base64")),
    Option("--expect-dim", int, 0, "expected embedding dimension (0: read from GET /v1/models)"),
    Option("--progress-every", float, 5.0, "seconds between progress lines"),
    # A load test is a backfill: it must not push real users' queries aside (docs/http-api.md, Lanes).
    Option("--priority", int, 2, "X-Priority of the users' requests: 2 and above the bulk lane (default 2), "
                                 "1 default, 0 interactive (moves down from the key's lane, never up)"),
    Option("--interactive-users", int, 0, "mixed scenario: this many more users at X-Priority 0 beside the "
                                          "others (a backfill); each lane's p50/p99 and throughput in lanes.json"),
    # The step shape (loadtest/stepshape.py): it finds the saturation point.
    Option("--step-users", int, 0, "users added each step; turns the step shape on (0: constant load)"),
    Option("--step-time", parse_duration, 30.0, "seconds per step"),
    Option("--max-users", int, 0, "users of the last step (0: 8 steps)"),
    Option("--p99-target-ms", float, 500.0, "saturation: the highest img/s whose p99 stays under this; the step "
                                            "shape stops past it"),
    Option("--step-max-fail-ratio", float, 0.01, "a step with more failures than this is past saturation (not the "
                                                 "run's pass/fail threshold: --max-fail-ratio)"),
)
STEP_OPTIONS = ("--step-users", "--step-time", "--max-users")


def add_options(group: Any, names: Sequence[str] | None = None) -> None:
    """Add the options (those named, else all) to an argparse group or Locust's configargparse group."""
    for option in OPTIONS:
        if names is None or option.flag in names:
            group.add_argument(option.flag, type=option.type, default=option.default, choices=option.choices,
                               help=option.help_text)


def locust_arguments(args: argparse.Namespace) -> list[str]:
    """The options' values as Locust's command line takes them; "off" values left out."""
    out: list[str] = []
    for option in OPTIONS:
        value = getattr(args, option.dest)
        if value in (0, "", None) and option.default in (0, ""):
            continue
        out += [option.flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out
