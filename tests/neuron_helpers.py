"""Helpers for tests that use the torch_neuronx test double (tests/doubles/torch_neuronx).

The double is put on sys.path only inside `neuronx_double()`, never at import: conftest decides
at collection whether the real SDK is present, and other tests must not see the double.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOUBLES = REPO / "tests" / "doubles"
PLACEHOLDER = DOUBLES / "placeholder"


@contextlib.contextmanager
def torch_neuronx_from(path: Path | None) -> Iterator[None]:
    """Make `import torch_neuronx` resolve from `path` (None: not at all), then restore."""
    saved_module = sys.modules.pop("torch_neuronx", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if not p.startswith(str(DOUBLES))]
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("torch_neuronx", None)
        if saved_module is not None:
            sys.modules["torch_neuronx"] = saved_module


@contextlib.contextmanager
def neuronx_double() -> Iterator[ModuleType]:
    """The double, imported fresh (its CALLS empty)."""
    with torch_neuronx_from(DOUBLES):
        import torch_neuronx

        assert "test double" in (torch_neuronx.__doc__ or ""), torch_neuronx.__file__
        yield torch_neuronx


def tiny_settings(**overrides: Any) -> Any:
    from models.settings import ModelSettings

    return ModelSettings(**{"model": "tiny-siglip", "buckets": (1, 2), "torch_threads": 1, **overrides})


def worker_pythonpath() -> str:
    """PYTHONPATH that lets Ray workers and subprocesses import the double and this checkout."""
    return f"{DOUBLES}:{REPO}"


def neuron_env() -> dict[str, str]:
    """The Neuron part of this process's environment (imports may set other variables themselves)."""
    import os

    return {k: v for k, v in os.environ.items() if k.startswith(("NEURON_", "TORCH_NEURONX_"))}
