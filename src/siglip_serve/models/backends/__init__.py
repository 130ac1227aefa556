"""Encoder backends: one module per backend holding its Runner and its Implementation
(implementation.py says what that is); their records are core/backends.py's."""

from __future__ import annotations

import importlib
from typing import Any


def load(spec: str) -> Any:
    """A record's "module:attribute", imported: a module written with a leading dot is one of this
    package's (or, with two, of models'), as the built-in records write theirs."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module, package=__name__), attribute)
