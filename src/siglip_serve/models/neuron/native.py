"""`siglip-serve compile --backend neuron-native`: every bucket compiled ahead of time by TorchNeuron.

The artifact is `<cache-root>/<sdk tag>/<model>-lnc<N>-<key12>/`: `manifest.json` (weights digest,
recipe environment, versions, LNC, buckets and the graph files of each bucket), `weights.pt` (the
state dict replicas load) and `neff/`, the TorchNeuron NEFF cache the replicas point
TORCH_NEURONX_NEFF_CACHE_DIR at. It is compiled in a hidden staging directory and renamed into
place when complete. The environment is set by `siglip_serve.models.neuron.cli` before torch is imported.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from siglip_serve.models.loading import ImageEmbedder, load_embedder, model_geometry
from siglip_serve.models.neuron.env import (
    NEFF_CACHE_ENV,
    NEURONX_CC_VERSION,
    RECIPE_ENV,
    TORCH_NEURONX_FAMILY,
    TORCH_SERIES,
    NativeOptions,
    TorchNeuronRefusal,
    environment,
    sdk_tag,
)
from siglip_serve.models.neuron.manifest import (
    WeightsDigest,
    artifact_name,
    cache_key,
    digest_weights,
    file_sizes,
    sha256_file,
)
from siglip_serve.models.neuron.manifest import (
    is_complete as manifest_complete,
)
from siglip_serve.models.neuron.runtime import (
    TEXT_WEIGHTS_NAME,
    WEIGHTS_NAME,
    BucketCompile,
    NativeManifest,
    NativeRuntime,
    compile_buckets,
    image_input,
    read_native_manifest,
    text_input,
)
from siglip_serve.models.neuron.text import text_cache_inputs, text_manifest_entry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import load_text_tower, text_context_length

log = logging.getLogger("siglip_serve.compile")


@dataclass
class NativePlan:
    settings: ModelSettings
    options: NativeOptions
    image_size: tuple[int, int]
    versions: dict[str, str | None]
    sdk_dir: Path
    weights: WeightsDigest | None  # None in a dry run of file/pretrained weights: they are not read
    key: str | None
    text: dict[str, Any] | None = None  # text_cache_inputs with --text, else None (image only)

    @property
    def artifact_dir(self) -> Path | None:
        if self.key is None:
            return None
        return self.sdk_dir / artifact_name(self.settings.model, self.options.lnc, self.key)

    def as_json(self) -> dict[str, Any]:
        artifact = self.artifact_dir
        weights: dict[str, str | None] = {"source": self.settings.weights_source, "sha256": None}
        if self.weights is not None:
            weights = dict(self.weights.as_dict())
        return {
            "line": "neuron-native",
            "model": self.settings.model,
            "weights": weights,
            "lnc": self.options.lnc,
            "env": environment(self.options.recipe_env(), artifact) if artifact else
            {**self.options.recipe_env(), NEFF_CACHE_ENV: "<artifact_dir>/neff"},
            "requires": {"torch_neuronx": f"{TORCH_NEURONX_FAMILY}.*", "torch": f"{TORCH_SERIES}.*",
                         "neuronx_cc": NEURONX_CC_VERSION},
            "versions": self.versions,
            "sdk_dir": str(self.sdk_dir),
            "cache_key": self.key,
            "artifact_dir": str(artifact) if artifact else None,
            "buckets": [{"batch": b, "input_shape": [b, 3, *self.image_size], "input_dtype": "uint8",
                         "compile": 'torch.compile(backend="neuron", fullgraph=True, dynamic=False)'}
                        for b in self.settings.buckets],
            "text_buckets": [{"batch": b, "input_shape": [b, self.text["context_length"]], "input_dtype": "int64",
                              "compile": 'torch.compile(backend="neuron", fullgraph=True, dynamic=False)'}
                             for b in self.text["buckets"]] if self.text else [],
        }


def native_key(settings: ModelSettings, options: NativeOptions, image_size: tuple[int, int], weights_sha256: str,
               versions: dict[str, str | None], text: dict[str, Any] | None = None) -> str:
    # Text graphs join the key only when asked for: image-only artifacts keep their keys.
    return cache_key({"line": "neuron-native", "model": settings.model, "weights_sha256": weights_sha256,
                      "image_size": list(image_size), "buckets": list(settings.buckets),
                      "recipe_env": options.recipe_env(), "versions": versions,
                      "input": {"dtype": "uint8", "layout": "NCHW"}, **({"text": text} if text else {})})


def make_native_plan(settings: ModelSettings, options: NativeOptions, cache_root: Path,
                     versions: dict[str, str | None], embedder: ImageEmbedder | None = None,
                     read_weights: bool = True, text: bool = False) -> NativePlan:
    image_size, _ = model_geometry(settings.source)
    weights = None
    if embedder is not None or (read_weights and not settings.uses_random_weights):
        weights = digest_weights(settings, embedder)
    text_key = text_cache_inputs(settings, text_context_length(settings.model)) if text else None
    key = native_key(settings, options, image_size, weights.sha256, versions, text_key) if weights else None
    return NativePlan(settings, options, image_size, versions, Path(cache_root) / sdk_tag(versions), weights, key,
                      text_key)


def dry_run_plan(settings: ModelSettings, options: NativeOptions, cache_root: Path,
                 versions: dict[str, str | None], text: bool = False) -> NativePlan:
    """The plan with no SDK and no weights read: only random weights (built on the CPU) are hashed."""
    embedder = load_embedder(settings)[0] if settings.uses_random_weights else None
    return make_native_plan(settings, options, cache_root, versions, embedder, read_weights=False, text=text)


def is_complete(directory: Path) -> bool:
    return manifest_complete(directory, read_native_manifest)


@dataclass
class NativeCompileResult:
    artifact_dir: Path
    manifest: NativeManifest
    reused: bool


def _progress(i: int, total: int, bucket: int, done: BucketCompile | None) -> None:
    if done is None:
        log.info("[%d/%d] bucket %d: compiling with %s=%r %s (minutes for SO400M)", i, total, bucket,
                 "NEURON_CC_FLAGS", os.environ.get("NEURON_CC_FLAGS"), os.environ.get("NEURON_COMPILER_OPT_LEVEL"))
    else:
        log.info("[%d/%d] bucket %d: done in %.1f s, %d graph file(s) written", i, total, bucket, done.seconds,
                 len(done.new_graphs))


def _compile_text(settings: ModelSettings, runtime: NativeRuntime, staging: Path) -> dict[str, Any]:
    """One graph per text bucket into the same NEFF cache; returns the manifest's `text` entry."""
    embedder, _, info = load_text_tower(settings, with_tokenizer=False)
    weights_path = staging / TEXT_WEIGHTS_NAME
    torch.save(embedder.state_dict(), weights_path)
    log.info("compiling the text tower for text buckets %s at context length %d", list(settings.text_buckets),
             info.context_length)
    _, results = compile_buckets(embedder.to(runtime.device), settings.text_buckets, text_input(info.context_length),
                                 runtime, staging / "neff", progress=_progress)
    return {**text_manifest_entry(info, settings.text_buckets, {str(r.bucket): r.seconds for r in results}),
            "graphs": {str(r.bucket): r.new_graphs for r in results}, "weights_file": TEXT_WEIGHTS_NAME,
            "weights_file_sha256": sha256_file(weights_path)}


def compile_native_artifact(settings: ModelSettings, options: NativeOptions, cache_root: Path, staging: Path,
                            runtime: NativeRuntime, force: bool = False, text: bool = False) -> NativeCompileResult:
    """Compile every bucket into `staging` (whose neff/ the environment already names), then publish it.
    text: also one graph per text bucket, in the same NEFF cache and manifest."""
    runtime.check_sdk()
    versions = runtime.versions()
    embedder, info = load_embedder(settings)
    plan = make_native_plan(settings, options, cache_root, versions, embedder, text=text)
    final, weights = plan.artifact_dir, plan.weights
    if final is None or weights is None or plan.key is None:
        raise RuntimeError("a plan built from the model always has its weights digest and key")
    if not force and is_complete(final):
        shutil.rmtree(staging, ignore_errors=True)
        log.info("reusing %s: same model, weights, buckets, recipe and versions (key %s)", final, plan.key[:12])
        return NativeCompileResult(final, read_native_manifest(final), reused=True)
    expected = environment(options.recipe_env(), staging)
    wrong = {k: os.environ.get(k) for k in RECIPE_ENV if os.environ.get(k) != expected[k]}
    if wrong:
        raise TorchNeuronRefusal(f"the compile environment is not this plan's ({wrong}); run it as "
                                 f"`siglip-serve compile --backend neuron-native`, which sets it before torch is "
                                 f"imported")
    staging.mkdir(parents=True, exist_ok=True)
    weights_path = staging / WEIGHTS_NAME
    torch.save(embedder.state_dict(), weights_path)
    log.info("compiling %s (%s) for LNC=%d, buckets %s into %s", settings.model, weights.source, options.lnc,
             list(settings.buckets), final)
    try:
        _, results = compile_buckets(embedder.to(runtime.device), settings.buckets, image_input(plan.image_size),
                                     runtime, staging / "neff", progress=_progress)
        text_entry = _compile_text(settings, runtime, staging) if text else {}
        empty = [r.bucket for r in results if not r.new_graphs] + [
            f"text {b}" for b, graphs in text_entry.get("graphs", {}).items() if not graphs]
        if empty:
            raise TorchNeuronRefusal(f"buckets {empty} compiled but wrote no graph into {staging / 'neff'}; is "
                                     f"TORCH_NEURONX_NEFF_DISABLE_CACHE set? Unset it and compile again")
        NativeManifest(
            model=settings.model, weights=weights.as_dict(), weights_file=WEIGHTS_NAME,
            weights_file_sha256=sha256_file(weights_path), image_size=list(plan.image_size), embed_dim=info.embed_dim,
            buckets=list(settings.buckets), lnc=options.lnc, recipe_env=options.recipe_env(), versions=versions,
            cache_key=plan.key, graphs={str(r.bucket): r.new_graphs for r in results},
            compile_seconds={str(r.bucket): r.seconds for r in results}, text=text_entry,
            sizes=file_sizes(staging),
        ).write(staging)
    except BaseException:
        log.error("compile failed; the partial output stays at %s (never taken for an artifact)", staging)
        raise
    if force and final.exists():
        shutil.rmtree(final)
    try:
        os.rename(staging, final)
    except OSError:
        if not is_complete(final):
            raise
        shutil.rmtree(staging, ignore_errors=True)  # another compile published the same key first
    log.info("wrote %s", final)
    return NativeCompileResult(final, read_native_manifest(final), reused=False)


def plan_text(plan: NativePlan) -> str:
    return json.dumps(plan.as_json(), indent=2)


__all__ = ["NativePlan", "compile_native_artifact", "dry_run_plan", "make_native_plan", "plan_text"]
