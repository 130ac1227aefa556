"""What the ingress knows of the model: its name, embedding width, image size and weights.

Torch-free on purpose: the ingress (serve/ingress/ingress_deployment.py) holds one, and importing torch or
open_clip there would add seconds to every ingress replica's start for a dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from siglip_serve.models.image_only import model_config


@dataclass(frozen=True)
class ModelInfo:
    name: str
    embed_dim: int
    image_size: tuple[int, int]
    weights: str

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "embed_dim": self.embed_dim,
            "image_size": list(self.image_size),
            "weights": self.weights,
        }



def file_geometry(model: str) -> tuple[tuple[int, int], int] | None:
    """(image size, embedding dim) from `model`'s open_clip config file (models/image_only.py), so a process that
    only plans or routes imports neither torch nor open_clip; None where no file is found (models/loading.py
    `model_geometry` asks open_clip then)."""
    cfg: dict[str, Any] | None = model_config(model)
    return None if cfg is None else config_geometry(cfg)


def config_geometry(cfg: dict[str, Any]) -> tuple[tuple[int, int], int]:
    size = cfg["vision_cfg"].get("image_size", 224)
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return (height, width), int(cfg["embed_dim"])
