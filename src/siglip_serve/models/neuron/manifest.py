"""Compiled-artifact manifests, the weights digest, and the cache key that names an artifact.

An artifact directory holds one TorchScript file per batch bucket and `manifest.json`. Its name
carries a hash of everything that decides the compiled result (model, weights, buckets, compiler
arguments, package versions), so the same inputs find the same directory and any change makes a
new one. A directory exists under its final name only once complete: compiles write to a temp
directory and rename it at the end.

`ArtifactManifest` is what the manifests of both Neuron lines share; `Manifest` is the trace line's
(TorchNeuron's is runtime.NativeManifest). This module imports no torch: env.py, which TorchNeuron's
compile command loads before torch, takes MANIFEST_NAME from here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from siglip_serve.models.neuron.base import NeuronRefusal
from siglip_serve.models.settings import ModelSettings

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
# Bump when the artifact layout changes: old artifacts then get new cache keys instead of misloading.
FORMAT_VERSION = 1


class ArtifactError(NeuronRefusal):
    """An artifact directory is missing, incomplete or does not fit what was asked of it."""


@dataclass(frozen=True)
class WeightsDigest:
    source: str  # ModelSettings.weights_source
    sha256: str
    sha256_of: str  # what exactly was hashed, so two digests are only compared like for like

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_state_dict(module: nn.Module) -> str:
    """Hash of every tensor's name, dtype, shape and bytes, in state-dict order."""
    # Imported here, not above: see the module's docstring.
    import torch

    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{t.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def pretrained_weights_file(settings: ModelSettings, download: bool = True) -> Path | None:
    """The local file open_clip loads for a pretrained tag, downloaded once into its cache.
    With download=False: the cached file, or None when it is not on disk (no network used)."""
    from siglip_serve.models.hub import HubUnreachable, cached_weights, check_weights_reachable
    from siglip_serve.models.loading import ModelLoadError, open_clip_module

    open_clip = open_clip_module()
    cfg = open_clip.get_pretrained_cfg(settings.model, settings.pretrained or "")
    if not cfg:
        raise ModelLoadError(f"no pretrained tag {settings.pretrained!r} for {settings.model}")
    if not download:
        return cached_weights(cfg)
    try:
        cached = check_weights_reachable(cfg, settings.model, settings.pretrained)
    except HubUnreachable as exc:
        raise ModelLoadError(str(exc)) from None
    if cached is not None:
        return cached
    try:
        return Path(open_clip.download_pretrained(cfg))
    except Exception as exc:  # broad on purpose: hub clients raise many kinds; all mean "no weights"
        raise ModelLoadError(
            f"could not fetch pretrained weights {settings.pretrained!r} for {settings.model} "
            f"({type(exc).__name__}); pass --checkpoint PATH instead"
        ) from None


def digest_weights(settings: ModelSettings, embedder: nn.Module | None = None, download: bool = True) -> WeightsDigest:
    """sha256 of the weights: the checkpoint file, the cached pretrained file, or the seeded tensors.

    Random weights need the built model (`embedder`, an ImageEmbedder): its image tower is hashed.
    """
    if settings.uses_random_weights:
        if embedder is None:
            raise ValueError("random weights are hashed from the built model; pass the embedder")
        visual = getattr(embedder, "visual", embedder)
        return WeightsDigest(settings.weights_source, sha256_state_dict(visual),
                             "image-tower state dict tensors (seeded random weights)")
    if settings.checkpoint is not None:
        return WeightsDigest(settings.weights_source, sha256_file(settings.checkpoint), "checkpoint file")
    if settings.source.on_hub:
        return hub_weights_digest(settings, download)
    path = pretrained_weights_file(settings, download)
    if path is None:
        return WeightsDigest(settings.weights_source, "unknown",
                             "nothing: the pretrained file is not in the local cache and a dry run downloads "
                             "nothing, so this plan's cache key and artifact path are provisional")
    return WeightsDigest(settings.weights_source, sha256_file(path), f"cached pretrained file {path.name}")


def hub_weights_digest(settings: ModelSettings, download: bool = True) -> WeightsDigest:
    """A hub model's weights file, named with the revision its cached snapshot holds."""
    from siglip_serve.core.errors import ModelLoadError
    from siglip_serve.models.hub_repo import OPEN_CLIP_WEIGHTS, TRANSFORMERS_WEIGHTS, hub_model

    try:
        found = hub_model(settings.source, weights=True, cache_only=not download)
    except ModelLoadError:
        if download:
            raise
        return WeightsDigest(settings.weights_source, "unknown",
                             "nothing: the hub model's weights are not in the local cache and a dry run downloads "
                             "nothing, so this plan's cache key and artifact path are provisional")
    path = found.files.get(OPEN_CLIP_WEIGHTS.what) or found.files[TRANSFORMERS_WEIGHTS.what]
    return WeightsDigest(found.label, sha256_file(path), f"cached hub file {path.name}")


def cache_key(inputs: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of every compile input (never of timestamps)."""
    canonical = json.dumps({"format_version": FORMAT_VERSION, **inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def artifact_name(model: str, lnc: int, key: str) -> str:
    safe_model = re.sub(r"[^A-Za-z0-9._-]+", "_", model)
    return f"{safe_model}-lnc{lnc}-{key[:12]}"


def bucket_file(bucket: int) -> str:
    return f"bucket-{bucket}.pt"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(kw_only=True)
class ArtifactManifest:
    """What both lines' manifests record (each line adds how it compiled and what it wrote)."""

    model: str
    weights: dict[str, str]
    image_size: list[int]
    embed_dim: int
    buckets: list[int]
    lnc: int
    versions: dict[str, str | None]
    cache_key: str
    compile_seconds: dict[str, float] = field(default_factory=dict)
    created_at: str = field(default_factory=utc_now)
    input: dict[str, str] = field(default_factory=lambda: {"dtype": "uint8", "layout": "NCHW"})
    # The text tower's graphs (models/neuron/text.py), or {} for an image-only artifact.
    text: dict[str, Any] = field(default_factory=dict)
    # Bytes of each file the artifact holds, by path relative to it: how a pod tells a copy still arriving
    # from a whole one (models/backends/compiled.py artifact_gaps). {} in artifacts compiled before it.
    sizes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The manifest of parsed JSON; keys this version does not know are left out, a missing field
        raises TypeError."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(self.to_json())
        return path

    def recipe_summary(self) -> dict[str, Any]:
        """How the line compiled it, as summary() shows it."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """What /v1/models and the logs show: enough to tell two artifacts apart."""
        return {
            "model": self.model,
            "weights": self.weights.get("source"),
            "weights_sha256": self.weights.get("sha256", "")[:16],
            "buckets": self.buckets,
            "lnc": self.lnc,
            **self.recipe_summary(),
            "versions": self.versions,
            "cache_key": self.cache_key[:12],
            "text_buckets": self.text.get("buckets", []),
            "created_at": self.created_at,
        }


@dataclass(kw_only=True)
class Manifest(ArtifactManifest):
    """The trace line's: the compiler arguments, and one TorchScript file per bucket."""

    auto_cast: str
    auto_cast_type: str | None
    target: str
    compiler_args: list[str]
    files: dict[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        missing = [f for f in ("model", "buckets", "lnc", "files", "cache_key") if f not in data]
        if missing:
            raise ArtifactError(f"manifest lacks {missing}")
        return super().from_dict(data)

    def bucket_path(self, directory: Path, bucket: int) -> Path:
        name = self.files.get(str(bucket))
        if name is None:
            raise ArtifactError(f"artifact {directory} has no bucket {bucket} (it has {self.buckets})")
        return directory / name

    def recipe_summary(self) -> dict[str, Any]:
        return {"auto_cast": self.auto_cast, "auto_cast_type": self.auto_cast_type,
                "compiler_args": self.compiler_args}


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a complete artifact, or ArtifactError saying what is wrong and what to do."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ArtifactError(f"artifact directory {directory} does not exist; build it with `siglip-serve compile`")
    if not path.is_file():
        raise ArtifactError(f"{directory} has no {MANIFEST_NAME}: not a complete compiled artifact "
                            "(compile it again with `siglip-serve compile`)")
    try:
        manifest = Manifest.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"{path} is not a valid manifest: {exc}") from None
    names = [*manifest.files.values(), *manifest.text.get("files", {}).values()]
    absent = [name for name in names if not (directory / name).is_file()]
    if absent:
        raise ArtifactError(f"artifact {directory} is incomplete: {absent} missing; compile it again")
    return manifest


def file_sizes(directory: Path) -> dict[str, int]:
    """Every file under `directory` but the manifest, by relative path: a manifest's `sizes`."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME}


def is_complete(directory: Path, read: Callable[[Path], object] = read_manifest) -> bool:
    """Both lines' test: their reader accepts the directory (TorchNeuron passes its reader)."""
    try:
        read(directory)
    except NeuronRefusal:
        return False
    return True
