"""SigLIP's text tower: open_clip's own tokenizer, loaded offline from a local path, and the text encoder
that runs token ids at the model's fixed context length in batch buckets, on any backend's Runner.

Texts in, L2-normalised float32 embeddings out, in the image tower's embedding space: the zero-shot
probability of label t for image i is `sigmoid(logit_scale * img_i . txt_t + logit_bias)` with the
checkpoint's scale (already exponentiated here) and bias, as open_clip's `get_logits` computes it.
Like the image Encoder, a batch is split into the buckets; a runner with static shapes (a compiled
graph, a CUDA graph) gets it padded to the smallest bucket that holds it and the padding sliced off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, overload

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.loading import load_clip, open_clip_module
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import OPEN_CLIP_HUB
from siglip_serve.models.tokenizer_files import missing_directory, tokenizer_dir, unloadable
from siglip_serve.models.tower import ForwardHook, RunnerFactory, Tower

log = logging.getLogger(__name__)

Tokenizer = Callable[[list[str]], torch.Tensor]


@dataclass(frozen=True)
class TextInfo:
    model: str
    embed_dim: int
    context_length: int
    vocab_size: int
    # exp(logit_scale) and logit_bias of the checkpoint: zero-shot logits are scale * cos + bias.
    logit_scale: float
    logit_bias: float
    tokenizer: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TextEmbedder(nn.Module):
    """int64 token ids [B, L] -> float32 [B, D], L2-normalised: open_clip's encode_text(normalize=True)."""

    def __init__(self, text: nn.Module) -> None:
        super().__init__()
        self.text = text

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text(ids).float(), dim=-1)


def load_tokenizer(settings: ModelSettings, text_cfg: dict[str, Any]) -> tuple[Tokenizer, str]:
    """open_clip's tokenizer for the model, at its context length, and where it came from.

    From `settings.tokenizer` (or tiny-siglip's bundled one): a directory with open_clip_config.json
    is read by `open_clip.get_tokenizer("local-dir:...")`, a bare HF tokenizer directory by open_clip's
    HFTokenizer with the model's tokenizer_kwargs; nothing touches the network. An open_clip hub model's own
    snapshot, where it holds the tokenizer files, is such a directory. Otherwise `open_clip.get_tokenizer(model)`,
    which may fetch from the Hugging Face hub.
    """
    from open_clip.tokenizer import HFTokenizer

    open_clip = open_clip_module()
    context = int(text_cfg.get("context_length", 64))
    directory = tokenizer_dir(settings)
    if directory is None and settings.source.kind == OPEN_CLIP_HUB:
        from siglip_serve.models.hub_repo import TOKENIZER, hub_model

        found = hub_model(settings.source, tokenizer=True)
        if TOKENIZER.what in found.files:  # else its config names another repository's (hf_tokenizer_name)
            tokenizer = open_clip.get_tokenizer(f"local-dir:{found.snapshot.directory}", context_length=context)
            return tokenizer, f"hub:{found.source.repo}@{found.snapshot.revision}"
    if directory is not None and not directory.is_dir():
        raise missing_directory(directory)
    try:
        if directory is None:
            return open_clip.get_tokenizer(settings.model, context_length=context), f"open_clip:{settings.model}"
        if (directory / "open_clip_config.json").is_file():
            tokenizer = open_clip.get_tokenizer(f"local-dir:{directory}", context_length=context)
        else:
            tokenizer = HFTokenizer(str(directory), context_length=context, **(text_cfg.get("tokenizer_kwargs") or {}))
    except Exception as exc:  # broad on purpose: transformers/hub raise many kinds; all mean "no tokenizer"
        log.debug("tokenizer load failed", exc_info=True)
        where = str(directory) if directory is not None else f"the Hugging Face hub for {settings.model}"
        raise unloadable(where, exc) from None
    return tokenizer, f"local:{directory}"


def open_clip_config(settings: ModelSettings) -> dict[str, Any]:
    """The open_clip model's config: its registered one, or an open_clip hub model's open_clip_config.json."""
    if settings.source.kind == OPEN_CLIP_HUB:
        from siglip_serve.models.hub_repo import hub_model

        return hub_model(settings.source).config
    return open_clip_module().get_model_config(settings.model) or {}


def text_context_length(model: str) -> int:
    """The text tower's fixed context length from open_clip's config, without building the model."""
    cfg = open_clip_module().get_model_config(model)
    if cfg is None:
        raise ModelLoadError(f"unknown model {model!r}")
    return int(cfg.get("text_cfg", {}).get("context_length", 64))


@overload
def load_text_tower(settings: ModelSettings,
                    with_tokenizer: Literal[True] = True) -> tuple[TextEmbedder, Tokenizer, TextInfo]: ...


@overload
def load_text_tower(settings: ModelSettings,
                    with_tokenizer: Literal[False]) -> tuple[TextEmbedder, None, TextInfo]: ...


def load_text_tower(settings: ModelSettings,
                    with_tokenizer: bool = True) -> tuple[TextEmbedder, Tokenizer | None, TextInfo]:
    """The text tower, its tokenizer and the zero-shot scale/bias, float32 eval mode on the CPU.

    with_tokenizer=False (compiling): no tokenizer is loaded; it runs at serving time only."""
    model: Any  # open_clip's CLIP is untyped: context_length, vocab_size and the rest are plain attributes
    model, text_loaded = load_clip(settings)
    if not text_loaded:
        raise ModelLoadError(f"checkpoint {settings.checkpoint} has no text-tower weights (or no logit scale/bias); "
                             "serve text from a whole-model state dict, or set text_replicas: 0")
    cfg = open_clip_config(settings)
    tokenizer, source = load_tokenizer(settings, cfg.get("text_cfg", {})) if with_tokenizer else (None, "none")
    bias = getattr(model, "logit_bias", None)
    info = TextInfo(
        model=settings.model, embed_dim=int(cfg["embed_dim"]), context_length=int(model.context_length),
        vocab_size=int(model.vocab_size), logit_scale=float(model.logit_scale.exp()),
        logit_bias=float(bias) if bias is not None else 0.0, tokenizer=source,
    )
    embedder = TextEmbedder(model.text).eval()
    log.info("loaded %s text tower: context %d, vocab %d, tokenizer %s", info.model, info.context_length,
             info.vocab_size, source)
    return embedder, tokenizer, info


class TextEncoder(Tower):
    """The text tower on one device: texts -> float32 [n, D], L2-normalised, in input order. Every
    bucket is one static shape [bucket, context_length] (SigLIP pools the last position, no mask)."""

    tower = "text"

    def __init__(self, tokenizer: Tokenizer, info: TextInfo, buckets: Sequence[int], runner: RunnerFactory) -> None:
        self.tokenizer = tokenizer
        self.info = info  # before the runner: it takes example() batches of this context length
        super().__init__(buckets, info.embed_dim, runner)

    def example(self, bucket: int) -> torch.Tensor:
        return torch.zeros((bucket, self.info.context_length), dtype=torch.int64)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        ids = self.tokenizer(list(texts)).to(torch.int64)
        if tuple(ids.shape) != (len(texts), self.info.context_length):
            raise RuntimeError(f"tokenizer gave {list(ids.shape)}; expected [{len(texts)}, {self.info.context_length}]")
        return ids

    def encode(self, texts: Sequence[str], on_forward: ForwardHook | None = None) -> np.ndarray:
        return self.run_batch(self.tokenize(texts), on_forward)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "text_buckets": list(self.buckets), **self.info.as_dict()}
