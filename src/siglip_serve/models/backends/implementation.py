"""What a backend's module provides (`Implementation`: its towers and checks), imported on first use
from the module its record names (core/backends.py), so asking a record never imports CUDA or Neuron
code; and the calls that build a tower or run a check through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from siglip_serve.core.backends import IMAGE, TEXT, BackendRecord, backend_record, extra_backends_env, load, names
from siglip_serve.core.errors import BackendUnavailable

if TYPE_CHECKING:  # torch: in the processes that build a tower
    from siglip_serve.models.encoder import Encoder
    from siglip_serve.models.settings import ModelSettings
    from siglip_serve.models.text import TextEncoder
    from siglip_serve.models.tower import Tower

# By record, not by name: a backend registered again under its name with another record imports afresh.
_IMPLEMENTATIONS: dict[BackendRecord, Implementation] = {}


@dataclass(frozen=True)
class Implementation:
    """What a backend's module provides: the towers it builds (each a tower's pre/post around the
    backend's one Runner, models/tower.py) and its checks."""

    # The tower (IMAGE or TEXT) on this backend, loaded and ready to warm up.
    build: Callable[[ModelSettings, str], Tower]
    # Before any Ray process starts: can this machine run it? `env`: what the replicas will see (None:
    # joining a cluster started elsewhere, skip what depends on it). Raises BackendUnavailable.
    check_available: Callable[[ModelSettings, Mapping[str, str] | None], None] | None = None
    # Without an SDK, on the machine that will run it (`siglip-serve run`, before Ray starts): can it build
    # this tower from what is on disk?
    check_tower: Callable[[ModelSettings, str], None] | None = None
    # What its compiled artifact was compiled for (e.g. {"lnc": 2, "auto_cast": "matmult"}), for results.
    compiled_for: Callable[[ModelSettings], Mapping[str, Any]] | None = None


def implementation(name: str) -> Implementation:
    record = backend_record(name)
    if record not in _IMPLEMENTATIONS:
        found = load(record.implementation)
        if not isinstance(found, Implementation):
            raise TypeError(f"{record.implementation} is not a backend Implementation")
        _IMPLEMENTATIONS[record] = found
    return _IMPLEMENTATIONS[record]


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
    built = implementation(settings.backend).build(settings, tower)
    built.deterministic = settings.deterministic
    return built


def create_encoder(settings: ModelSettings) -> Encoder:
    return cast("Encoder", create_tower(settings, IMAGE))


def create_text_encoder(settings: ModelSettings) -> TextEncoder:
    return cast("TextEncoder", create_tower(settings, TEXT))


def check_tower(settings: ModelSettings, tower: str) -> None:
    """Before any replica starts: can the backend build this tower from what is on disk (a compiled
    artifact's text graphs, say)? Reads no SDK, so the service refuses in one line instead of replicas
    that die at start while Serve retries them."""
    if not require_tower(settings.backend, tower).preflight:
        return
    check = implementation(settings.backend).check_tower
    if check is not None:
        check(settings, tower)


def check_backend_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """Raise BackendUnavailable (one line) if this machine cannot run `settings.backend`; called before
    any Ray process starts, so a missing SDK or GPU fails in a second, not after the replicas tried."""
    if not backend_record(settings.backend).preflight:
        return
    check = implementation(settings.backend).check_available
    if check is not None:
        check(settings, env)


def backend_replica_env(settings: ModelSettings) -> dict[str, str]:
    """Environment a process of this backend needs before it imports torch (neuron-native: the artifact's
    recipe, read from its manifest), and where to find a backend registered here. Read on the machine
    that runs the process: a replica or a bulk actor reads it itself (`apply_replica_env`)."""
    spec = backend_record(settings.backend).replica_env
    own: dict[str, str] = dict(load(spec)(settings)) if spec is not None else {}
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
