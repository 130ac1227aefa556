"""Each tower's model by where the model comes from (models/source.py): open_clip's (a config name, a checkpoint,
an `hf-hub:` repository) from models/loading.py and models/text.py, a transformers repository's from
models/hf_towers.py. The eager backends, the start's checks and the CPU plan ask here, not the name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from siglip_serve.models.parameter_cache import ParameterCounts
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import TRANSFORMERS, ModelSource

if TYPE_CHECKING:  # torch: only where a tower is built
    from torch import nn

    from siglip_serve.models.model_info import ModelInfo
    from siglip_serve.models.text import TextInfo, Tokenizer


def image_model(settings: ModelSettings) -> tuple[nn.Module, ModelInfo]:
    """The image tower's model (uint8 images in, or a NaFlex model's packed patches: models/naflex_vision.py;
    L2-normalised out), float32 eval mode on the CPU, and what it is."""
    if settings.source.kind == TRANSFORMERS:
        from siglip_serve.models.hf_towers import load_image

        return load_image(settings)
    from siglip_serve.models.loading import load_embedder

    return load_embedder(settings)


def text_model(settings: ModelSettings) -> tuple[nn.Module, Tokenizer, TextInfo]:
    """The text tower's model (token ids in, L2-normalised out), its tokenizer and what it is."""
    if settings.source.kind == TRANSFORMERS:
        from siglip_serve.models.hf_towers import load_text

        return load_text(settings)
    from siglip_serve.models.text import load_text_tower

    return load_text_tower(settings)


def model_tokenizer(settings: ModelSettings) -> tuple[Tokenizer, str]:
    """The model's tokenizer and where it came from, without building a tower (the start's checks)."""
    if settings.source.kind == TRANSFORMERS:
        from siglip_serve.models.hf_towers import load_tokenizer

        return load_tokenizer(settings)
    from siglip_serve.models.text import load_tokenizer as open_clip_tokenizer
    from siglip_serve.models.text import open_clip_config

    return open_clip_tokenizer(settings, open_clip_config(settings).get("text_cfg", {}))


def parameter_counts(source: ModelSource) -> ParameterCounts:
    """The model's parameter counts, built on the meta device (the CPU plan's `replicas: auto`)."""
    from siglip_serve.models.loading import parameter_counts as open_clip_counts

    if source.kind == TRANSFORMERS:
        from siglip_serve.models.hf_towers import parameter_counts as hf_counts

        image, total = hf_counts(source)
        return ParameterCounts(image=image, total=total)
    return open_clip_counts(source)
