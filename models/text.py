"""SigLIP's text tower: open_clip's own tokenizer, loaded offline from a local path, and a text encoder
per backend that runs token ids at the model's fixed context length in batch buckets.

Texts in, L2-normalised float32 embeddings out, in the image tower's embedding space: the zero-shot
probability of label t for image i is `sigmoid(logit_scale * img_i . txt_t + logit_bias)` with the
checkpoint's scale (already exponentiated here) and bias, as open_clip's `get_logits` computes it.
Like the image Encoder, every backend runs only its buckets (static shapes suit a compiled graph):
a batch is padded to the smallest bucket that holds it and the padding sliced off.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.encoder import split_into_buckets
from siglip_serve.models.loading import ModelLoadError, load_clip
from siglip_serve.models.settings import TINY_MODEL, TINY_SIGLIP2, ModelSettings

log = logging.getLogger(__name__)

BUNDLED_TINY_TOKENIZER = Path(__file__).parent / "configs" / "tiny-siglip-tokenizer"
BUNDLED_TOKENIZERS = {TINY_MODEL: BUNDLED_TINY_TOKENIZER,
                      TINY_SIGLIP2: Path(__file__).parent / "configs" / "tiny-siglip2-tokenizer"}

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


def tokenizer_dir(settings: ModelSettings) -> Path | None:
    if settings.tokenizer is not None:
        return Path(settings.tokenizer).expanduser()
    return BUNDLED_TOKENIZERS.get(settings.model)


def load_tokenizer(settings: ModelSettings, text_cfg: dict[str, Any]) -> tuple[Tokenizer, str]:
    """open_clip's tokenizer for the model, at its context length, and where it came from.

    From `settings.tokenizer` (or tiny-siglip's bundled one): a directory with open_clip_config.json
    is read by `open_clip.get_tokenizer("local-dir:...")`, a bare HF tokenizer directory by open_clip's
    HFTokenizer with the model's tokenizer_kwargs; nothing touches the network. Without a directory,
    `open_clip.get_tokenizer(model)`, which may fetch from the Hugging Face hub.
    """
    import open_clip
    from open_clip.tokenizer import HFTokenizer

    context = int(text_cfg.get("context_length", 64))
    directory = tokenizer_dir(settings)
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
        raise ModelLoadError(
            f"cannot load the tokenizer from {where} ({type(exc).__name__}); set tokenizer: DIR to a local "
            "copy of the model's tokenizer files (tokenizer.json, tokenizer_config.json), e.g. "
            "`huggingface-cli download timm/ViT-SO400M-14-SigLIP-384 --local-dir DIR`"
        ) from None
    return tokenizer, f"local:{directory}"


def text_context_length(model: str) -> int:
    """The text tower's fixed context length from open_clip's config, without building the model."""
    import open_clip

    from siglip_serve.models.loading import _register_tiny

    _register_tiny()
    cfg = open_clip.get_model_config(model)
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
    import open_clip

    model: Any  # open_clip's CLIP is untyped: context_length, vocab_size and the rest are plain attributes
    model, text_loaded = load_clip(settings)
    if not text_loaded:
        raise ModelLoadError(f"checkpoint {settings.checkpoint} has no text-tower weights (or no logit scale/bias); "
                             "serve text from a whole-model state dict, or set text_replicas: 0")
    cfg = open_clip.get_model_config(settings.model) or {}
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


class TextEncoder(ABC):
    """One text tower on one device: texts -> float32 [n, D], L2-normalised, in input order."""

    backend = "abstract"

    def __init__(self, tokenizer: Tokenizer, info: TextInfo, buckets: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        self.forward_counts: dict[int, int] = {b: 0 for b in self.buckets}
        # Called after each forward pass with (bucket, real texts, seconds); the server's metrics hook.
        self.forward_observer: Callable[[int, int, float], None] | None = None

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    @abstractmethod
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Run exactly one bucket: int64 [bucket, L] -> float32 [bucket, D]."""

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        ids = self.tokenizer(list(texts)).to(torch.int64)
        if tuple(ids.shape) != (len(texts), self.info.context_length):
            raise RuntimeError(f"tokenizer gave {list(ids.shape)}; expected [{len(texts)}, {self.info.context_length}]")
        return ids

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_ids(self.tokenize(texts))

    def encode_ids(self, ids: torch.Tensor) -> np.ndarray:
        n = int(ids.shape[0])
        out = np.empty((n, self.info.embed_dim), dtype=np.float32)
        for start, stop, bucket in split_into_buckets(n, self.buckets):
            chunk = ids[start:stop]
            if stop - start < bucket:
                chunk = torch.cat([chunk, chunk.new_zeros((bucket - (stop - start), chunk.shape[1]))])
            began = time.perf_counter()
            result = self._forward(chunk.contiguous())
            seconds = time.perf_counter() - began
            self.forward_counts[bucket] += 1
            if self.forward_observer is not None:
                self.forward_observer(bucket, stop - start, seconds)
            out[start:stop] = result[: stop - start].detach().float().cpu().numpy()
        return out

    def warmup(self, iterations: int = 1) -> dict[int, float]:
        seconds: dict[int, float] = {}
        for bucket in self.buckets:
            ids = torch.zeros((bucket, self.info.context_length), dtype=torch.int64)
            for _ in range(max(1, iterations)):
                began = time.perf_counter()
                out = self._forward(ids)
                seconds[bucket] = time.perf_counter() - began
            if tuple(out.shape) != (bucket, self.info.embed_dim):
                raise RuntimeError(f"text tower returned {list(out.shape)} for bucket {bucket}; "
                                   f"expected [{bucket}, {self.info.embed_dim}]")
        log.info("%s text encoder warmed up: %s", self.backend, {b: f"{s * 1e3:.1f} ms" for b, s in seconds.items()})
        return seconds

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "text_buckets": list(self.buckets), **self.info.as_dict()}


class CpuTextEncoder(TextEncoder):
    backend = "cpu"

    def __init__(self, embedder: TextEmbedder, tokenizer: Tokenizer, info: TextInfo, settings: ModelSettings) -> None:
        from siglip_serve.models.backends.cpu import set_torch_threads

        super().__init__(tokenizer, info, settings.text_buckets)
        self.embedder = embedder
        self.threads = set_torch_threads(settings.torch_threads)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.embedder(ids)


class CudaTextEncoder(TextEncoder):
    backend = "cuda"

    def __init__(self, embedder: TextEmbedder, tokenizer: Tokenizer, info: TextInfo, settings: ModelSettings) -> None:
        from siglip_serve.models.backends.cuda import choose_autocast_dtype, cuda_problem

        problem = cuda_problem()
        if problem is not None:
            raise BackendUnavailable(problem)
        super().__init__(tokenizer, info, settings.text_buckets)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = choose_autocast_dtype(settings.cuda_dtype, torch.cuda.is_bf16_supported())
        self.embedder = embedder.to(self.device)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cuda", dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            return self.embedder(ids.to(self.device, non_blocking=True)).float().cpu()


# The backends the text tower is built for; any other (a new image backend) is refused at start.
TEXT_BACKENDS = ("cpu", "cuda", "neuron", "neuron-native")


def check_text_backend(backend: str) -> None:
    if backend not in TEXT_BACKENDS:
        raise BackendUnavailable(f"the text tower has no {backend!r} backend ({', '.join(TEXT_BACKENDS)} have one); "
                                 "set text_replicas: 0 or serve text from one of those")


def check_text_artifact(settings: ModelSettings) -> None:
    """Before any replica starts: a Neuron artifact must hold the text graphs of every text bucket.
    Reads only the manifest (no SDK), so the service refuses in one line instead of text replicas
    that die at start while Serve retries them."""
    check_text_backend(settings.backend)
    from siglip_serve.models.text_neuron import checked_text_entry

    if settings.backend == "neuron":
        from siglip_serve.models.backends.neuron import artifact_for

        directory, manifest = artifact_for(settings)
        checked_text_entry(settings, directory, manifest.text, "siglip-serve compile")
    elif settings.backend == "neuron-native":
        from siglip_serve.models.backends.neuron_native import native_artifact

        directory, native = native_artifact(settings)
        checked_text_entry(settings, directory, native.text, "siglip-serve compile --backend neuron-native")


def create_text_encoder(settings: ModelSettings) -> TextEncoder:
    check_text_backend(settings.backend)
    if settings.backend == "neuron":
        from siglip_serve.models.text_neuron import load_neuron_text_encoder

        return load_neuron_text_encoder(settings)
    if settings.backend == "neuron-native":
        from siglip_serve.models.backends.neuron_native import TorchNeuronRefusal
        from siglip_serve.models.text_neuron import load_native_text_encoder

        try:
            return load_native_text_encoder(settings)
        except TorchNeuronRefusal as exc:
            raise BackendUnavailable(str(exc)) from None
    embedder, tokenizer, info = load_text_tower(settings)
    if settings.backend == "cuda":
        return CudaTextEncoder(embedder, tokenizer, info, settings)
    return CpuTextEncoder(embedder, tokenizer, info, settings)
