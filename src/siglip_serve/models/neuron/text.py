"""The text tower on Neuron, both lines: one compiled graph per text bucket at the model's fixed
context length, in the same artifact directory and manifest as the image tower
(`siglip-serve compile [--backend neuron-native] --text`).

SigLIP's text tower takes int64 token ids [bucket, context_length] with no padding mask (it pools
the last position), so every bucket is one static shape, which is what neuronx-cc compiles best.
The manifest's `text` entry holds the context length, buckets, files and the checkpoint's logit
scale and bias; the tokenizer is not compiled: it loads from `tokenizer` (models/text.py).
Each line's backend module (models/backends/) runs both towers' graphs on its one Runner.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from siglip_serve.models.neuron.manifest import ArtifactError
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEmbedder, TextInfo, Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


def text_bucket_file(bucket: int) -> str:
    return f"text-bucket-{bucket}.pt"


def text_cache_inputs(settings: ModelSettings, context_length: int) -> dict[str, Any]:
    """What the text graphs add to the artifact's cache key (absent for image-only artifacts)."""
    return {"buckets": list(settings.text_buckets), "context_length": context_length, "input": {"dtype": "int64"}}


def text_manifest_entry(info: TextInfo, buckets: tuple[int, ...], seconds: dict[str, float]) -> dict[str, Any]:
    """The part of the manifest's `text` entry both Neuron lines write (each adds its graph files)."""
    return {
        "context_length": info.context_length, "vocab_size": info.vocab_size, "embed_dim": info.embed_dim,
        "buckets": list(buckets), "logit_scale": info.logit_scale, "logit_bias": info.logit_bias,
        "input": {"dtype": "int64"}, "compile_seconds": seconds,
    }


def checked_text_entry(settings: ModelSettings, directory: Path, text: dict[str, Any], compile_command: str) -> None:
    """Refuse an artifact without text graphs, or without one of the text buckets asked for."""
    if not text:
        raise ArtifactError(f"artifact {directory} has no text graphs; compile it with `{compile_command} --text` "
                            "or set text_replicas: 0")
    missing = [b for b in settings.text_buckets if b not in text["buckets"]]
    if missing:
        raise ArtifactError(f"text buckets {missing} are not in artifact {directory} (compiled: {text['buckets']}); "
                            f"serve a subset or compile with --text-buckets "
                            f"{','.join(map(str, settings.text_buckets))}")


def text_info_from_entry(settings: ModelSettings, model: str, text: dict[str, Any]) -> tuple[Tokenizer, TextInfo]:
    """The tokenizer (never compiled: loaded from `tokenizer`) and the TextInfo the manifest records."""
    from siglip_serve.models.loading import open_clip_module

    cfg = open_clip_module().get_model_config(settings.model) or {}
    tokenizer, source = load_tokenizer(settings, {**cfg.get("text_cfg", {}), "context_length": text["context_length"]})
    info = TextInfo(model=model, embed_dim=int(text["embed_dim"]), context_length=int(text["context_length"]),
                    vocab_size=int(text["vocab_size"]), logit_scale=float(text["logit_scale"]),
                    logit_bias=float(text["logit_bias"]), tokenizer=source)
    return tokenizer, info


def trace_text_buckets(neuronx: ModuleType, embedder: TextEmbedder, info: TextInfo, buckets: tuple[int, ...],
                       compiler_args: list[str], work: Path) -> dict[str, Any]:
    """Trace and save one graph per text bucket into `work`; returns the manifest's `text` entry."""
    seconds: dict[str, float] = {}
    for i, bucket in enumerate(buckets, start=1):
        example = torch.zeros((bucket, info.context_length), dtype=torch.int64)
        log.info("[text %d/%d] bucket %d: compiling %s", i, len(buckets), bucket, list(example.shape))
        began = time.monotonic()
        traced = neuronx.trace(embedder, example, compiler_args=list(compiler_args),
                               compiler_workdir=str(work / "workdir" / f"text-bucket-{bucket}"))
        seconds[str(bucket)] = round(time.monotonic() - began, 3)
        torch.jit.save(traced, str(work / text_bucket_file(bucket)))
    return {**text_manifest_entry(info, buckets, seconds), "files": {str(b): text_bucket_file(b) for b in buckets}}
