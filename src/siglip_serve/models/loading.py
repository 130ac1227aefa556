"""Load a SigLIP image tower through open_clip, from a pretrained tag, a checkpoint, an open_clip repository on the
hub (`hf-hub:ORG/NAME`) or random weights; a transformers repository's towers are models/hf_towers.py's.

The result is an `ImageEmbedder`: uint8 images in, L2-normalised float32 embeddings out, with
SigLIP's normalisation folded into the graph so that every backend (and every compiled artifact)
takes the same uint8 input the ingress produces.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.image_only import CONFIG_DIR
from siglip_serve.models.model_info import (
    ImageGeometry,
    ModelInfo,
    config_geometry,
    known_geometry,
)
from siglip_serve.models.parameter_cache import ParameterCounts
from siglip_serve.models.settings import TINY_MODELS, ModelSettings
from siglip_serve.models.source import OPEN_CLIP_HUB, TRANSFORMERS, ModelSource

log = logging.getLogger(__name__)

_registered = False


class ImageEmbedder(nn.Module):
    """uint8 [B, 3, H, W] -> float32 [B, D], L2-normalised. Normalisation lives in the graph."""

    scale: torch.Tensor  # buffers, registered in __init__
    shift: torch.Tensor

    def __init__(self, visual: nn.Module, mean: tuple[float, ...], std: tuple[float, ...],
                 rescale: float = 1 / 255) -> None:
        super().__init__()
        self.visual = visual
        # Fold (x * rescale - mean)/std into one multiply-add per channel.
        scale = torch.tensor([rescale / s for s in std]).view(1, 3, 1, 1)
        shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)]).view(1, 3, 1, 1)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("shift", shift, persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.scale.dtype) * self.scale + self.shift
        features = self.visual(x)
        return F.normalize(features.float(), dim=-1)


def open_clip_module() -> ModuleType:
    """open_clip, once it knows the tiny SigLIP-architecture model used by tests and quick runs
    (registered in timm and open_clip on the first call).

    configs/ also holds tiny-siglip-checkpoint: the same architecture under a name that takes a
    checkpoint (tiny-siglip is always random), for tests that build weights with a forced answer."""
    global _registered
    import open_clip

    if _registered:
        return open_clip
    from timm.models import register_model
    from timm.models.vision_transformer import vit_base_patch16_siglip_224

    @register_model
    def siglip_serve_tiny_patch8_64(pretrained: bool = False, **kwargs: object) -> nn.Module:
        # Same block structure as SigLIP's ViT (no class token, MAP attention pooling), scaled down.
        args = dict(img_size=64, patch_size=8, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2.0)
        return vit_base_patch16_siglip_224(pretrained=False, **{**args, **kwargs})

    open_clip.add_model_config(CONFIG_DIR)
    _registered = True
    return open_clip


def available_models() -> list[str]:
    return [name for name in open_clip_module().list_models() if "SigLIP" in name or name in TINY_MODELS]


def load_clip(settings: ModelSettings) -> tuple[nn.Module, bool]:
    """The whole open_clip model (both towers, logit scale and bias) in float32 eval mode on the CPU,
    and whether its text tower has real weights (False: an image-tower-only checkpoint)."""
    model = _create(settings)
    text_loaded = getattr(model, _TEXT_MISSING, False) is False
    return model.eval().requires_grad_(False), text_loaded


# Set on a model whose checkpoint held no text-tower weights, so its text tower is never served.
_TEXT_MISSING = "_siglip_serve_text_missing"


def _create(settings: ModelSettings) -> nn.Module:
    open_clip = open_clip_module()
    source = settings.source
    if source.kind == TRANSFORMERS:
        raise ModelLoadError(f"{settings.model} is a transformers repository; the {settings.backend!r} backend builds "
                             "open_clip models only: serve it on the cpu or cuda backend")
    if source.kind == OPEN_CLIP_HUB:
        return _create_from_hub(settings)
    if settings.model not in open_clip.list_models():
        raise ModelLoadError(
            f"unknown model {settings.model!r}; SigLIP models: {', '.join(available_models())}"
        )
    if settings.uses_random_weights:
        log.warning(
            "RANDOM WEIGHTS: model %s runs with random weights (seed %d); its embeddings mean nothing. "
            "Use this only for tests and plumbing checks.",
            settings.model,
            settings.seed,
        )
        torch.manual_seed(settings.seed)
        return open_clip.create_model(settings.model, pretrained=None)
    if settings.checkpoint is not None:
        model = open_clip.create_model(settings.model, pretrained=None)
        _load_checkpoint(model, settings.checkpoint)
        return model
    return _create_pretrained(settings)


def _create_from_hub(settings: ModelSettings) -> nn.Module:
    """The open_clip hub model from its cached snapshot (`local-dir:`), so that a pinned revision is the one built:
    the same files `create_model('hf-hub:...')` reads."""
    from siglip_serve.models.hub_repo import hub_model

    random = settings.uses_random_weights
    found = hub_model(settings.source, weights=not random)
    if random:
        log.warning("RANDOM WEIGHTS: model %s runs with random weights (seed %d); its embeddings mean nothing.",
                    settings.model, settings.seed)
        torch.manual_seed(settings.seed)
    try:
        return open_clip_module().create_model(f"local-dir:{found.snapshot.directory}", load_weights=not random)
    except Exception as exc:  # broad on purpose: open_clip raises many kinds on a config or file it cannot use
        log.debug("open_clip hub model failed", exc_info=True)
        raise ModelLoadError(f"open_clip cannot build {settings.model} from its files in "
                             f"{found.snapshot.directory} ({type(exc).__name__}: {exc})") from None


def _create_pretrained(settings: ModelSettings) -> nn.Module:
    open_clip = open_clip_module()

    try:
        return open_clip.create_model(settings.model, pretrained=settings.pretrained)
    except Exception as exc:  # broad on purpose: open_clip/hub raise many kinds; all mean "no weights"
        log.debug("pretrained download failed", exc_info=True)
        raise ModelLoadError(
            f"could not load pretrained weights {settings.pretrained!r} for {settings.model} "
            f"(no network, or the tag is unknown: {type(exc).__name__}). Either pass "
            "--checkpoint PATH (a state dict saved with torch.save(model.state_dict())) or "
            "--random-weights (embeddings then mean nothing)."
        ) from exc


def _load_checkpoint(model: nn.Module, path: Path) -> None:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # broad on purpose: torch.load raises many kinds on a bad file
        raise ModelLoadError(f"cannot read checkpoint {path}: not a torch state dict") from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    # Accept a whole-CLIP state dict (the usual) or one of the image tower alone.
    target: nn.Module = model
    if not any(k.startswith("visual.") for k in state):
        target = model.get_submodule("visual")
    missing, unexpected = target.load_state_dict(state, strict=False)
    if target is not model or any(k.startswith("text.") or k in ("logit_scale", "logit_bias") for k in missing):
        setattr(model, _TEXT_MISSING, True)
    missing_visual = [k for k in missing if target is not model or k.startswith("visual.")]
    if missing_visual or unexpected:
        raise ModelLoadError(
            f"checkpoint {path} does not fit {type(model).__name__}: "
            f"{len(missing_visual)} image-tower weights missing, {len(unexpected)} unexpected keys "
            f"(first: {(missing_visual or unexpected)[:3]})"
        )


def load_embedder(settings: ModelSettings) -> tuple[ImageEmbedder, ModelInfo]:
    """Build the image tower for `settings` in float32 eval mode on the CPU."""
    model = _create(settings)
    # The same source the ingress sizes its images by; Encoder.warmup checks the output width.
    geometry = image_geometry(settings.source)
    embedder = ImageEmbedder(model.get_submodule("visual"), geometry.mean, geometry.std).eval()
    embedder.requires_grad_(False)
    embed_dim, image_size = geometry.embed_dim, geometry.size
    info = ModelInfo(settings.model, embed_dim, image_size, settings.weights_source, geometry.resample)
    log.info("loaded %s: embed_dim=%d image_size=%s weights=%s", info.name, embed_dim, image_size, info.weights)
    return embedder, info


def image_geometry(source: ModelSource) -> ImageGeometry:
    """The model's geometry without building it (models/model_info.py `known_geometry`; open_clip asked only for a
    config it registered at run time, with no file)."""
    found = known_geometry(source)
    if found is not None:
        return found
    cfg = open_clip_module().get_model_config(source.name)
    if cfg is None:
        raise ModelLoadError(f"unknown model {source.name!r}; SigLIP models: {', '.join(available_models())}")
    return config_geometry(cfg)


def model_geometry(source: ModelSource) -> tuple[tuple[int, int], int]:
    """(image size, embedding dim), without building the model."""
    geometry = image_geometry(source)
    return geometry.size, geometry.embed_dim


def _no_weights_warning(record: logging.LogRecord) -> bool:
    return "No pretrained weights loaded" not in record.getMessage()


def parameter_counts(source: ModelSource) -> ParameterCounts:
    """The model's parameter counts, built on the meta device: nothing allocated, no weights read (a hub model's
    configuration is fetched once); a transformers repository's are models/model_towers.py's."""
    if source.kind == TRANSFORMERS:
        raise ModelLoadError(f"{source.name} is a transformers repository, not an open_clip model")
    open_clip = open_clip_module()
    name = source.name
    if source.kind == OPEN_CLIP_HUB:
        from siglip_serve.models.hub_repo import hub_model

        name = f"local-dir:{hub_model(source).snapshot.directory}"
    elif name not in open_clip.list_models():
        raise ModelLoadError(f"unknown model {name!r}; SigLIP models: {', '.join(available_models())}")
    root = logging.getLogger()  # open_clip warns on the root logger that no weights were loaded
    root.addFilter(_no_weights_warning)
    try:
        with torch.device("meta"):
            built = open_clip.create_model(name, pretrained=None, device="meta", load_weights=False)
    finally:
        root.removeFilter(_no_weights_warning)
    return ParameterCounts(image=sum(p.numel() for p in built.get_submodule("visual").parameters()),
                           total=sum(p.numel() for p in built.parameters()))
