"""A model's parameter counts, kept on disk once counted, so that planning a start imports neither torch nor open_clip.

`replicas: auto` on cpu sizes the replicas by the model's parameter counts (serve/plan/cpu_plan.py), which
models/loading.py `parameter_counts` gets by building the model on the meta device: seconds of torch and open_clip
imports on the start's critical path, before Ray starts, for a number that changes only with the model's config
and the libraries that build it. They are the key: the config file's contents, the versions of open_clip, timm
and this package. A cache that cannot be read or written is counted around, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from siglip_serve.models.image_only import model_config

log = logging.getLogger(__name__)

CACHE_FILE = "parameter-counts.json"
# The distributions whose code builds the model from its config.
BUILDERS = ("open_clip_torch", "timm", "siglip-serve")


@dataclass(frozen=True)
class ParameterCounts:
    image: int  # the image tower's, which a replica keeps
    total: int  # both towers', which a replica builds while it loads


def cache_path() -> Path:
    """Where the counts are kept: the user's cache directory (XDG_CACHE_HOME, else ~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "siglip-serve" / CACHE_FILE


def cache_key(model: str) -> str | None:
    """`model` with its config file's digest and the builders' versions; None where it has no config file (one
    registered at run time), which is then counted every time."""
    config = model_config(model)
    if config is None:
        return None
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    versions = []
    for name in BUILDERS:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} -")
    return " | ".join([model, digest, *versions])


def _stored() -> dict[str, dict[str, int]]:
    try:
        loaded = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def cached(model: str) -> ParameterCounts | None:
    """The counts kept for `model` under its current key; None where none are (or the entry is not two counts)."""
    key = cache_key(model)
    entry = _stored().get(key) if key is not None else None
    try:
        return ParameterCounts(image=int(entry["image"]), total=int(entry["total"])) if entry else None
    except (KeyError, TypeError, ValueError):
        return None


def keep(model: str, counts: ParameterCounts) -> None:
    """Keep `counts` for `model` (replacing the file whole, so a reader never sees half of it); best effort."""
    key = cache_key(model)
    if key is None:
        return
    path = cache_path()
    stored = {**_stored(), key: asdict(counts)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps(stored, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(scratch, path)
    except OSError as exc:
        log.debug("parameter counts of %s not kept in %s: %s", model, path, exc)
