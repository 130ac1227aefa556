"""The one backend registry: records by name (torch-free), and the towers and checks their
implementations provide (imported on first use, so asking a record never imports CUDA or Neuron code).

Callers ask a record (`backend_record(name).host_cores`), never compare a backend's name. A backend
registered at run time (`register`, e.g. by a test) travels to the app's other processes in
EXTRA_BACKENDS_ENV (`extra_backends_env`), which each process reads when it meets a name it lacks.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from siglip_serve.core.constants import EXTRA_BACKENDS_ENV
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.builtin import BACKENDS, BUILTIN
from siglip_serve.models.backends.record import IMAGE, TEXT, BackendRecord, Implementation

if TYPE_CHECKING:  # torch: in the processes that build a tower
    from siglip_serve.models.encoder import Encoder
    from siglip_serve.models.settings import ModelSettings
    from siglip_serve.models.text import TextEncoder
    from siglip_serve.models.tower import Tower

_BUILTIN = {record.name: record for record in BUILTIN}
_EXTRA: dict[str, BackendRecord] = {}
_IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(record: BackendRecord) -> None:
    """Add a backend beside the built-in ones (its implementation named by `record.implementation`)."""
    if record.name in _BUILTIN:
        raise ValueError(f"backend {record.name!r} is built in")
    _EXTRA[record.name] = record
    _IMPLEMENTATIONS.pop(record.name, None)


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)
    _IMPLEMENTATIONS.pop(name, None)


@contextmanager
def registered(record: BackendRecord) -> Iterator[BackendRecord]:
    register(record)
    try:
        yield record
    finally:
        unregister(record.name)


def _from_environment(name: str) -> BackendRecord | None:
    for data in json.loads(os.environ.get(EXTRA_BACKENDS_ENV) or "[]"):
        if data.get("name") == name:
            _EXTRA[name] = BackendRecord.from_dict(data)
            return _EXTRA[name]
    return None


def names() -> tuple[str, ...]:
    return BACKENDS + tuple(sorted(_EXTRA))


def backend_record(name: str) -> BackendRecord:
    record = _BUILTIN.get(name) or _EXTRA.get(name) or _from_environment(name)
    if record is None:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(names())}")
    return record


def extra_backends_env() -> dict[str, str]:
    """What every process of an app needs to find the backends registered here (none: {})."""
    return {EXTRA_BACKENDS_ENV: json.dumps([r.as_dict() for r in _EXTRA.values()])} if _EXTRA else {}


def implementation(name: str) -> Implementation:
    if name not in _IMPLEMENTATIONS:
        module, _, attribute = backend_record(name).implementation.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        if not isinstance(found, Implementation):
            raise TypeError(f"{module}:{attribute} is not a backend Implementation")
        _IMPLEMENTATIONS[name] = found
    return _IMPLEMENTATIONS[name]


def require_tower(name: str, tower: str) -> BackendRecord:
    """The record, or BackendUnavailable (one line) where the backend does not build this tower."""
    record = backend_record(name)
    if not record.builds(tower):
        others = [n for n in names() if backend_record(n).builds(tower)]
        choice = f"{', '.join(others[:-1])} or {others[-1]}" if len(others) > 1 else "".join(others) or "no backend"
        raise BackendUnavailable(f"the {name!r} backend has no {tower} tower; "
                                 + ("set text_replicas: 0, or serve text " if tower == TEXT else "serve it ")
                                 + f"from {choice}")
    return record


def create_tower(settings: ModelSettings, tower: str) -> Tower:
    require_tower(settings.backend, tower)
    return implementation(settings.backend).build(settings, tower)


def create_encoder(settings: ModelSettings) -> Encoder:
    return cast("Encoder", create_tower(settings, IMAGE))


def create_text_encoder(settings: ModelSettings) -> TextEncoder:
    return cast("TextEncoder", create_tower(settings, TEXT))


def check_tower(settings: ModelSettings, tower: str) -> None:
    """Before any replica starts: can the backend build this tower from what is on disk (a compiled
    artifact's text graphs, say)? Reads no SDK, so the service refuses in one line instead of replicas
    that die at start while Serve retries them."""
    require_tower(settings.backend, tower)
    check = implementation(settings.backend).check_tower
    if check is not None:
        check(settings, tower)


def check_backend_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """Raise BackendUnavailable (one line) if this machine cannot run `settings.backend`; called before
    any Ray process starts, so a missing SDK or GPU fails in a second, not after the replicas tried."""
    check = implementation(settings.backend).check_available
    if check is not None:
        check(settings, env)


def backend_replica_env(settings: ModelSettings) -> dict[str, str]:
    """Environment a process of this backend needs before it imports torch (neuron-native: the artifact's
    recipe, read from its manifest), and where to find a backend registered here. Read on the machine
    that runs the process: a replica or a bulk actor reads it itself (`apply_replica_env`)."""
    spec = backend_record(settings.backend).replica_env
    own: dict[str, str] = {}
    if spec is not None:
        module, _, attribute = spec.partition(":")
        own = dict(getattr(importlib.import_module(module), attribute)(settings))
    return {**own, **extra_backends_env()}


def apply_replica_env(settings: ModelSettings, keep: Collection[str] = ()) -> dict[str, str]:
    """Set this process's backend environment (`backend_replica_env`), at its start, before torch is
    imported: what Ray's runtime_env would have set, but read here, where the artifact is. Names in
    `keep` (the config's own env_vars, which Ray did set) stay as they are, so a contradiction is
    refused by the backend's start checks, naming both. The variables set."""
    wanted = {k: v for k, v in backend_replica_env(settings).items() if k not in keep}
    os.environ.update(wanted)
    return wanted


def compiled_for(settings: ModelSettings) -> dict[str, Any]:
    hook = implementation(settings.backend).compiled_for
    return dict(hook(settings)) if hook is not None else {}
