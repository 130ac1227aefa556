"""What the ingress knows of the model: its name, embedding width, image size and weights.

Torch-free on purpose: the ingress (serve/ingress/ingress_deployment.py) holds one, and importing torch or
open_clip there would add seconds to every ingress replica's start for a dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    name: str
    embed_dim: int
    image_size: tuple[int, int]
    weights: str
    # The Pillow filter the ingress resizes with: the model's processor's (a transformers repository may say
    # bilinear); open_clip's SigLIP configs say bicubic.
    resample: str = "bicubic"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "embed_dim": self.embed_dim,
            "image_size": list(self.image_size),
            "weights": self.weights,
        }
