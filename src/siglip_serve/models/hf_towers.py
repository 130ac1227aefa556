"""A transformers SigLIP repository's two towers: transformers' `SiglipModel` (`Siglip2Model` for SigLIP 2 NaFlex)
as its `get_image_features` and `get_text_features` compute them, L2-normalised as open_clip's towers are here.

The image tower takes the ingress's uint8 images like every tower: the repository's processor settings (its
rescale factor, mean and std) are folded into the graph (models/loading.py ImageEmbedder), and its size and
filter are the ingress's resize (models/hub_repo.py ImagePrep). The text tower takes the repository's tokenizer as
AutoTokenizer loads it, padded to the context length as SigLIP was trained (transformers' SigLIP docs: "make sure
to set padding='max_length'"); its attention mask is passed to the model as transformers' processor passes it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.hub_repo import TOKENIZER, HubModel, hub_model
from siglip_serve.models.loading import ImageEmbedder
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.models.naflex import served_layout
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import ModelSource
from siglip_serve.models.text import TextInfo, tokenizer_dir

log = logging.getLogger(__name__)

# Where the tokenizer's attention mask leaves a position out, the token id is this: the mask travels inside the
# one int64 tensor every text bucket is, and the text tower puts the pad id back.
MASKED = -1


class PooledVision(nn.Module):
    """pixels [B, 3, H, W] -> the vision tower's pooled output [B, D]: `SiglipModel.get_image_features`."""

    def __init__(self, vision: nn.Module) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        pooled: torch.Tensor = self.vision(pixel_values=pixels).pooler_output
        return pooled


class HFTextEmbedder(nn.Module):
    """int64 ids [B, L] (MASKED where the tokenizer's mask is 0) -> float32 [B, D], L2-normalised:
    `get_text_features(input_ids, attention_mask)` of the tokenizer's output."""

    def __init__(self, text: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.text = text
        self.pad_id = pad_id

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != MASKED
        tokens = torch.where(keep, ids, torch.full_like(ids, self.pad_id))
        pooled = self.text(input_ids=tokens, attention_mask=keep.to(torch.int64)).pooler_output
        return F.normalize(pooled.float(), dim=-1)


class HFTokenizer:
    """texts -> int64 [n, context_length]: the tokenizer padded to max_length and truncated, its mask folded in."""

    def __init__(self, tokenizer: Any, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        encoded = self.tokenizer(texts, padding="max_length", max_length=self.context_length, truncation=True,
                                 return_tensors="pt")
        ids: torch.Tensor = encoded["input_ids"].to(torch.int64)
        mask = encoded.get("attention_mask")
        return ids if mask is None else ids.masked_fill(mask == 0, MASKED)


def model_classes(found: HubModel) -> tuple[Any, Any]:
    """transformers' (config, model) classes of the repository: SigLIP 2 NaFlex's (model_type 'siglip2') or
    SigLIP's, which fixed-resolution SigLIP 2 repositories use too."""
    if found.image.naflex is not None:
        from transformers import Siglip2Config, Siglip2Model

        return Siglip2Config, Siglip2Model
    from transformers import SiglipConfig, SiglipModel

    return SiglipConfig, SiglipModel


def load_model(settings: ModelSettings) -> tuple[Any, HubModel]:
    """SiglipModel (Siglip2Model for NaFlex) in float32 eval mode on the CPU, from the repository's cached snapshot
    (or random weights of its architecture, seeded), and what the repository says of it."""
    random = settings.uses_random_weights
    found = hub_model(settings.source, weights=not random)
    config_class, model_class = model_classes(found)
    directory = found.snapshot.directory
    model: Any  # transformers' SiglipModel: its towers and logit scale/bias are attributes mypy cannot follow
    loading_info: dict[str, Any]
    try:
        if random:
            log.warning("RANDOM WEIGHTS: model %s runs with random weights (seed %d); its embeddings mean nothing.",
                        settings.model, settings.seed)
            torch.manual_seed(settings.seed)
            model = model_class(config_class.from_pretrained(directory))
        else:
            loaded: Any = model_class.from_pretrained(directory, dtype=torch.float32, output_loading_info=True)
            model, loading_info = loaded
            missing = loading_info.get("missing_keys") or []
            if missing:
                raise ModelLoadError(f"{found.files['model weights'].name} of {settings.model} lacks {len(missing)} "
                                     f"of {model_class.__name__}'s weights (first: {sorted(missing)[:3]})")
    except ModelLoadError:
        raise
    except Exception as exc:  # broad on purpose: transformers raises many kinds on a file it cannot use
        log.debug("transformers load failed", exc_info=True)
        raise ModelLoadError(f"transformers cannot build {model_class.__name__} from {settings.model}'s files in "
                             f"{directory} ({type(exc).__name__}: {exc})") from None
    log.info("loaded %s from the Hugging Face cache, revision %s", settings.model, found.snapshot.revision)
    return model.float().eval().requires_grad_(False), found


def load_image(settings: ModelSettings) -> tuple[nn.Module, ModelInfo]:
    """The image tower: uint8 images in (ImageEmbedder), or for NaFlex the packed patches, mask and position
    embeddings (models/naflex_vision.py NaflexVision); L2-normalised embeddings out."""
    model, found = load_model(settings)
    prep = found.image
    naflex = served_layout(prep.naflex, settings.patch_budgets, settings.model)
    embedder: nn.Module
    if naflex is not None:
        from siglip_serve.models.naflex_vision import NaflexVision

        embedder = NaflexVision(model.vision_model, naflex, prep.mean, prep.std, prep.rescale)
    else:
        embedder = ImageEmbedder(PooledVision(model.vision_model), prep.mean, prep.std, prep.rescale)
    embedder.eval().requires_grad_(False)
    info = ModelInfo(settings.model, found.embed_dim, prep.size, settings.weights_source, prep.resample, naflex)
    return embedder, info


def load_tokenizer(settings: ModelSettings, found: HubModel | None = None) -> tuple[HFTokenizer, str]:
    """The repository's tokenizer (or `tokenizer: DIR`'s) through AutoTokenizer, and where it came from."""
    from transformers import AutoTokenizer

    directory = tokenizer_dir(settings)
    if directory is None:
        found = hub_model(settings.source, tokenizer=True)
        directory = found.files[TOKENIZER.what].parent
        where = f"hub:{found.source.repo}@{found.snapshot.revision}"
    elif not directory.is_dir():
        raise ModelLoadError(f"tokenizer directory not found: {directory}")
    else:
        found = found or hub_model(settings.source)
        where = f"local:{directory}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # broad on purpose: transformers raises many kinds; all mean "no tokenizer"
        log.debug("tokenizer load failed", exc_info=True)
        raise ModelLoadError(f"cannot load {settings.model}'s tokenizer from {directory} ({type(exc).__name__}: "
                             f"{exc})") from None
    return HFTokenizer(tokenizer, found.context_length), where


def load_text(settings: ModelSettings) -> tuple[HFTextEmbedder, HFTokenizer, TextInfo]:
    model, found = load_model(settings)
    tokenizer, where = load_tokenizer(settings, found)
    text_config = found.config.get("text_config") or {}
    bias = getattr(model, "logit_bias", None)
    info = TextInfo(model=settings.model, embed_dim=found.embed_dim, context_length=found.context_length,
                    vocab_size=int(text_config.get("vocab_size", 32000)), logit_scale=float(model.logit_scale.exp()),
                    logit_bias=float(bias) if bias is not None else 0.0, tokenizer=where)
    embedder = HFTextEmbedder(model.text_model, tokenizer.pad_id).eval()
    log.info("loaded %s text tower: context %d, tokenizer %s", settings.model, info.context_length, where)
    return embedder, tokenizer, info


def parameter_counts(source: ModelSource) -> tuple[int, int]:
    """(image tower, whole model) parameter counts of the model built on the meta device from the config."""
    found = hub_model(source)
    config_class, model_class = model_classes(found)
    with torch.device("meta"):
        model = model_class(config_class.from_pretrained(found.snapshot.directory))
    return (sum(p.numel() for p in model.vision_model.parameters()), sum(p.numel() for p in model.parameters()))
