"""What the ingress knows of the model: its name, embedding width, image size and weights; and the model's geometry
as its config files say it, which the application's builder reads for the ingress.

Torch-free on purpose: the ingress (serve/ingress/ingress_deployment.py) holds one, and importing torch or
open_clip there would add seconds to every ingress replica's start for a dataclass; the service process plans a
start without them too (docs/guides/running.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from siglip_serve.models.image_only import model_config
from siglip_serve.models.naflex import NaflexLayout
from siglip_serve.models.source import ModelSource


@dataclass(frozen=True)
class ModelInfo:
    name: str
    embed_dim: int
    image_size: tuple[int, int]
    weights: str
    # The Pillow filter the ingress resizes with: the model's processor's (a transformers repository may say
    # bilinear); open_clip's SigLIP configs say bicubic.
    resample: str = "bicubic"
    # A NaFlex model's patch geometry and served budgets (models/naflex.py): its images keep their aspect ratio
    # and travel as packed patches; `image_size` is then its learned position grid's, in pixels.
    naflex: NaflexLayout | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "embed_dim": self.embed_dim,
            "image_size": list(self.image_size),
            "weights": self.weights,
        }


# SigLIP's preprocessing constants. open_clip only reports them when a pretrained tag is given
# (with pretrained=None it hands back CLIP's), so they are fixed here.
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ImageGeometry:
    """What the model takes and gives: the image size and Pillow filter the ingress resizes with, the normalisation
    the image tower folds in, and the embedding width."""

    size: tuple[int, int]
    embed_dim: int
    resample: str = "bicubic"
    mean: tuple[float, ...] = SIGLIP_MEAN
    std: tuple[float, ...] = SIGLIP_STD
    rescale: float = 1 / 255
    naflex: NaflexLayout | None = None  # a NaFlex model's patch geometry, its default budget alone


def known_geometry(source: ModelSource) -> ImageGeometry | None:
    """The model's geometry without building it or importing torch or open_clip: a hub repository's configuration
    (its processor's settings; fetched once, models/hub_repo.py), or an open_clip config's file
    (models/image_only.py); None for an open_clip config with no file (one registered at run time), which only
    open_clip itself can read (models/loading.py `image_geometry`)."""
    if source.on_hub:
        from siglip_serve.models.hub_repo import hub_model

        found = hub_model(source)
        prep = found.image
        return ImageGeometry(prep.size, found.embed_dim, prep.resample, prep.mean, prep.std, prep.rescale, prep.naflex)
    cfg: dict[str, Any] | None = model_config(source.name)
    return None if cfg is None else config_geometry(cfg)


def config_geometry(cfg: dict[str, Any]) -> ImageGeometry:
    """An open_clip config's geometry (SigLIP's normalisation and bicubic resize)."""
    size = cfg["vision_cfg"].get("image_size", 224)
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return ImageGeometry((height, width), int(cfg["embed_dim"]))
