"""Tiny random SigLIP repositories in the Hugging Face cache layout, as `hf download ORG/NAME` leaves them, built
here with no network: a transformers SigLIP (`SiglipModel.save_pretrained`, a SigLIP image processor, a tokenizer)
and an open_clip hub model (open_clip_config.json, open_clip_model.safetensors, its tokenizer).

The layout is huggingface_hub's (its docs, "Understand caching"): `<HF_HUB_CACHE>/models--ORG--NAME/snapshots/
<commit>/<files>` and `refs/main` holding the main branch's commit. `use_cache` points huggingface_hub at a folder
and sets HF_HUB_OFFLINE, as on a host without a hub.
"""

from __future__ import annotations

import json
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from siglip_serve.models.tiny_tokenizer import SEED_WORDS, SIGLIP, SIGLIP2, build_tokenizer, tiny_model_cfg

CONTEXT = 16
# Commits as the hub names them: 40 hex digits.
MAIN_COMMIT = "a" * 40
OTHER_COMMIT = "b" * 40


def tiny_siglip_config(generation: str = "siglip") -> Any:
    """A SiglipConfig of the smallest towers: the architecture of google/siglip-* and of SigLIP 2's
    fixed-resolution repositories (model_type 'siglip' both), scaled down."""
    from transformers import SiglipConfig

    layout = SIGLIP2 if generation == "siglip2" else SIGLIP
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                vocab_size=len(layout.specials) + len(SEED_WORDS), max_position_embeddings=CONTEXT,
                pad_token_id=0 if generation == "siglip2" else 1, eos_token_id=1, bos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    return SiglipConfig(text_config=text, vision_config=vision)


def transformers_repo(directory: Path, generation: str = "siglip", seed: int = 0, resample: int = 3) -> Path:
    """A transformers SigLIP repository's files: random weights (seeded), the processor's config (squash to 32x32
    with Pillow filter `resample`, mean and std 0.5) and a tokenizer laid out as the generation's."""
    import torch
    from transformers import SiglipImageProcessor, SiglipModel

    torch.manual_seed(seed)
    model = SiglipModel(tiny_siglip_config(generation))
    with torch.no_grad():  # a logit scale and bias other than the initial zeros, so the test sees them read
        model.logit_scale.fill_(2.0)
        model.logit_bias.fill_(-3.0)
    model.save_pretrained(directory)
    build_tokenizer(directory, SEED_WORDS, CONTEXT, {}, SIGLIP2 if generation == "siglip2" else SIGLIP)
    (directory / "open_clip_config.json").unlink()  # a transformers repository has none
    SiglipImageProcessor(size={"height": 32, "width": 32}, resample=resample, image_mean=[0.5] * 3,
                         image_std=[0.5] * 3).save_pretrained(directory)
    return directory


def open_clip_repo(directory: Path, repo: str, seed: int = 0) -> Path:
    """An open_clip hub repository of tiny-siglip's architecture: as timm's SigLIP repositories are laid out, its
    config names itself as the tokenizer's repository and squashes images."""
    import torch
    from safetensors.torch import save_file

    from siglip_serve.models.loading import open_clip_module

    cfg = tiny_model_cfg(CONTEXT)
    cfg["text_cfg"]["hf_tokenizer_name"] = repo
    build_tokenizer(directory, SEED_WORDS, CONTEXT, cfg, SIGLIP)
    config = {"model_cfg": cfg, "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic",
                                                   "resize_mode": "squash"}}
    (directory / "open_clip_config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    model = open_clip_module().create_model(f"local-dir:{directory}", load_weights=False)
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(weights, str(directory / "open_clip_model.safetensors"))
    return directory


# Gemma's special tokens at their ids, then the word separator, lowercase letters and digits.
NAFLEX_VOCAB = {name: i for i, name in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581",
                                                  *string.ascii_lowercase, *string.digits])}


def tiny_naflex_config() -> Any:
    """A Siglip2Config (SigLIP 2 NaFlex, model_type 'siglip2') of the smallest towers: 8-pixel patches, an 8x8
    learned position grid."""
    from transformers import Siglip2Config

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                vocab_size=len(NAFLEX_VOCAB), max_position_embeddings=CONTEXT, pad_token_id=0, eos_token_id=1,
                bos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                  num_patches=64)
    return Siglip2Config(text_config=text, vision_config=vision)


def naflex_repo(directory: Path, seed: int = 0, max_num_patches: int = 64) -> Path:
    """A SigLIP 2 NaFlex repository's files as Google's are laid out: random weights (seeded), Siglip2ImageProcessor's
    config (8-pixel patches, the budget `max_num_patches`, bilinear) and a Siglip2Tokenizer (Gemma's special tokens,
    lowercasing) whose vocabulary is single characters: every text tokenizes to real ids."""
    import torch
    from transformers import Siglip2ImageProcessor, Siglip2Model, Siglip2Tokenizer

    torch.manual_seed(seed)
    model = Siglip2Model(tiny_naflex_config())
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
        model.logit_bias.fill_(-3.0)
    model.save_pretrained(directory)
    Siglip2Tokenizer(vocab=dict(NAFLEX_VOCAB), merges=[]).save_pretrained(directory)
    Siglip2ImageProcessor(patch_size=8, max_num_patches=max_num_patches).save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class HubCache:
    """A Hugging Face hub cache folder (what HF_HUB_CACHE names)."""

    root: Path

    def add(self, repo: str, files: Path, commit: str = MAIN_COMMIT, main: bool = True,
            absent: tuple[str, ...] = ()) -> Path:
        """`files` as the snapshot `commit` of `repo`; with `main`, the main branch's commit; `absent`: files the hub
        was asked for and does not have, as huggingface_hub remembers them (`.no_exist/<commit>/<name>`), so a
        library that looks for one offline is told it does not exist. The snapshot's path."""
        folder = self.root / f"models--{repo.replace('/', '--')}"
        snapshot = folder / "snapshots" / commit
        shutil.copytree(files, snapshot)
        for name in absent:
            (folder / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
            (folder / ".no_exist" / commit / name).touch()
        if main:
            (folder / "refs").mkdir(parents=True, exist_ok=True)
            (folder / "refs" / "main").write_text(commit)
        return snapshot


def use_cache(monkeypatch: pytest.MonkeyPatch, cache: HubCache) -> None:
    """Point huggingface_hub (whose constants are read once, at its import) at `cache`, offline."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache.root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache.root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
