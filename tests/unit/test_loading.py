"""Model loading (random, checkpoint, pretrained failure) and fidelity to open_clip's own pipeline."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.loading import available_models, load_embedder, model_geometry
from siglip_serve.models.model_info import SIGLIP_MEAN, SIGLIP_STD
from siglip_serve.models.preprocess import preprocess_image
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import model_source


def open_clip_reference(model: torch.nn.Module, image_size: int, jpeg: bytes, family: str) -> np.ndarray:
    """What the contract compares against: open_clip's transform and encode_image(normalize=True)."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(family, "webli")
    transform = open_clip.image_transform(
        image_size, is_train=False, mean=cfg["mean"], std=cfg["std"],
        interpolation=cfg["interpolation"], resize_mode=cfg["resize_mode"],
    )
    with torch.inference_mode():
        pixels = transform(Image.open(io.BytesIO(jpeg)).convert("RGB"))[None]
        return model.encode_image(pixels, normalize=True)[0].numpy()


def test_siglip_constants_match_open_clip_for_every_siglip_model() -> None:
    import open_clip

    for name in available_models():
        for tag in open_clip.list_pretrained_tags_by_model(name):
            cfg = open_clip.get_pretrained_cfg(name, tag)
            assert tuple(cfg["mean"]) == SIGLIP_MEAN and tuple(cfg["std"]) == SIGLIP_STD, (name, tag)
            assert cfg["interpolation"] == "bicubic" and cfg["resize_mode"] == "squash", (name, tag)


def test_geometry_without_building() -> None:
    assert model_geometry(model_source("ViT-SO400M-14-SigLIP-384")) == ((384, 384), 1152)
    assert model_geometry(model_source("tiny-siglip")) == ((64, 64), 64)
    with pytest.raises(ModelLoadError, match="unknown model"):
        model_geometry(model_source("ViT-Nope"))


def test_random_weights_are_seeded_and_identical_across_loads() -> None:
    a, info = load_embedder(ModelSettings(model="tiny-siglip"))
    b, _ = load_embedder(ModelSettings(model="tiny-siglip"))
    c, _ = load_embedder(ModelSettings(model="tiny-siglip", seed=1))
    x = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    with torch.inference_mode():
        assert torch.equal(a(x), b(x)) and not torch.allclose(a(x), c(x))
    assert info.weights == "random(seed=0)" and info.embed_dim == 64


def test_random_weights_are_announced_loudly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")
    load_embedder(ModelSettings(model="tiny-siglip"))
    assert any("RANDOM WEIGHTS" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


@pytest.mark.parametrize("visual_only", [False, True], ids=["whole-clip", "image-tower"])
def test_checkpoint_round_trip(tmp_path: Path, visual_only: bool) -> None:
    import open_clip

    load_embedder(ModelSettings(model="tiny-siglip"))  # registers the tiny config
    torch.manual_seed(123)
    source = open_clip.create_model("tiny-siglip", pretrained=None)
    path = tmp_path / "model.pt"
    torch.save((source.visual if visual_only else source).state_dict(), path)
    with pytest.raises(ValueError, match="always runs with random weights"):
        ModelSettings(model="tiny-siglip", checkpoint=path)
    from siglip_serve.models import loading

    model = open_clip.create_model("tiny-siglip", pretrained=None)
    loading._load_checkpoint(model, path)
    x = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.float32)
    with torch.inference_mode():
        assert torch.equal(model.visual(x), source.visual(x))


def test_bad_checkpoints_say_what_is_wrong(tmp_path: Path) -> None:
    import open_clip

    from siglip_serve.models import loading

    load_embedder(ModelSettings(model="tiny-siglip"))
    model = open_clip.create_model("tiny-siglip", pretrained=None)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="not a torch state dict"):
        loading._load_checkpoint(model, garbage)
    wrong = tmp_path / "wrong.pt"
    torch.save({"visual.unrelated.weight": torch.zeros(2)}, wrong)
    with pytest.raises(ModelLoadError, match="does not fit"):
        loading._load_checkpoint(model, wrong)


def test_no_network_names_both_alternatives(monkeypatch: pytest.MonkeyPatch) -> None:
    import open_clip

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(open_clip, "create_model", offline)
    with pytest.raises(ModelLoadError) as info:
        load_embedder(ModelSettings(model="ViT-B-16-SigLIP"))
    message = str(info.value)
    assert "--checkpoint" in message and "--random-weights" in message and "no network" in message


def large_jpeg(array: np.ndarray, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).resize(size, Image.Resampling.LANCZOS).save(buf, format="JPEG", quality=92)
    return buf.getvalue()


@dataclass
class Pipelines:
    """Each model's two pipelines, ours and open_clip's, and open_clip's vector of each file, made once for the
    module: neither depends on how our side decodes."""

    files: list[bytes]
    built: dict[str, tuple[Any, Any, torch.nn.Module]] = field(default_factory=dict)
    theirs: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    def models(self, model_name: str) -> tuple[Any, Any, torch.nn.Module]:
        import open_clip

        if model_name not in self.built:
            embedder, info = load_embedder(ModelSettings(model=model_name, random_weights=True))
            torch.manual_seed(0)
            self.built[model_name] = embedder, info, open_clip.create_model(model_name, pretrained=None).eval()
        return self.built[model_name]

    def reference(self, model_name: str, family: str, index: int) -> np.ndarray:
        if (model_name, index) not in self.theirs:
            _, info, reference_model = self.models(model_name)
            self.theirs[model_name, index] = open_clip_reference(reference_model, info.image_size[0],
                                                                  self.files[index], family)
        return self.theirs[model_name, index]


@pytest.fixture(scope="module")
def pipelines(photos: list[np.ndarray], photo_jpegs: list[bytes]) -> Pipelines:
    # The photos as shipped (~512 px) and as a phone would send them (12 MP), where a fast decode
    # runs at 1/4 or 1/8 scale.
    return Pipelines(photo_jpegs + [large_jpeg(photos[0], (4032, 3024)), large_jpeg(photos[2], (2048, 1536))])


@pytest.mark.parametrize("fast_jpeg", [False, True], ids=["exact-decode", "fast-jpeg-decode"])
@pytest.mark.parametrize("model_name, family",
                         [("tiny-siglip", "ViT-B-16-SigLIP"), ("ViT-B-16-SigLIP", "ViT-B-16-SigLIP")])
def test_embeddings_match_open_clip_pipeline_on_real_photos(model_name: str, family: str, fast_jpeg: bool,
                                                            pipelines: Pipelines) -> None:
    embedder, info, _ = pipelines.models(model_name)
    size = info.image_size
    for index, jpeg in enumerate(pipelines.files):
        ours = embedder(torch.from_numpy(preprocess_image(jpeg, size, fast_jpeg=fast_jpeg))[None])[0].detach().numpy()
        theirs = pipelines.reference(model_name, family, index)
        cosine = float(np.dot(ours, theirs) / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
        assert cosine >= 0.9999, (model_name, fast_jpeg, cosine)


def test_fast_jpeg_decode_reads_fewer_pixels_and_only_for_jpeg(photos: list[np.ndarray]) -> None:
    from siglip_serve.models.preprocess import decode_image

    jpeg = large_jpeg(photos[0], (4032, 3024))
    assert decode_image(jpeg).size == (4032, 3024)
    assert decode_image(jpeg, draft_size=(128, 128)).size == (504, 378)  # 1/8 scale, still >= 128
    png = io.BytesIO()
    Image.fromarray(photos[0]).save(png, format="PNG")
    assert decode_image(png.getvalue(), draft_size=(64, 64)).size == (512, 512)
