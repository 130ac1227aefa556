"""Models named by their Hub id, served offline from a prepared Hugging Face cache (tests/hub_cache.py): a
transformers SigLIP repository in both generations' layouts and an open_clip `hf-hub:` repository, each through the
real tower-building path (create_encoder / create_text_encoder) and compared with the library run directly; a
pinned revision; and the one-line refusals."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.core.sample_photos import photo_array
from siglip_serve.models.backends.implementation import create_encoder, create_text_encoder
from siglip_serve.models.preprocess import decode_image, preprocess_image
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import OPEN_CLIP, OPEN_CLIP_HUB, TRANSFORMERS, model_source
from tests.hub_cache import MAIN_COMMIT, OTHER_COMMIT, HubCache, open_clip_repo, transformers_repo, use_cache

SIGLIP = "org/tiny-siglip"  # SigLIP's layout: T5-style tokens, bicubic
SIGLIP2 = "org/tiny-siglip2-224"  # SigLIP 2's fixed-resolution layout: Gemma's tokens, bilinear, as its repos say
OPEN_CLIP_REPO = "org/tiny-open-clip"
TEXTS = ["a photo of a cat", "A Photo of a DOG", "rocket", "", "the the the the the the the the the the the the the "
         "the the the the the the the the"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hub")
    cache = HubCache(root / "cache")
    cache.add(SIGLIP, transformers_repo(root / "siglip"))
    cache.add(SIGLIP, transformers_repo(root / "siglip-other", seed=1), commit=OTHER_COMMIT, main=False)
    cache.add(SIGLIP2, transformers_repo(root / "siglip2", "siglip2", resample=2))
    # open_clip's tokenizer reads the repository through AutoTokenizer, which asks for a model config.json first.
    cache.add(OPEN_CLIP_REPO, open_clip_repo(root / "open-clip", OPEN_CLIP_REPO), absent=("config.json",))
    return {"cache": cache, "root": root}


@pytest.fixture()
def cache(built: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[HubCache]:
    use_cache(monkeypatch, built["cache"])
    yield built["cache"]


def snapshot(cache: HubCache, repo: str, commit: str = MAIN_COMMIT) -> Path:
    return cache.root / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


def images() -> list[bytes]:
    """The sample photos and odd shapes cut from them (4:1, 1:4) and a 1x1, as PNG files (lossless: both sides
    decode the same pixels)."""
    arrays = [photo_array(name) for name in ("astronaut", "chelsea", "coffee", "rocket")]
    wide = arrays[0][:80, :320]
    arrays += [wide, np.ascontiguousarray(arrays[1][:320, :80]), arrays[2][:1, :1]]
    out = []
    for array in arrays:
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def transformers_reference(directory: Path) -> tuple[Any, Any, Any]:
    """transformers' SiglipModel, processor and tokenizer as a user loads them from the repository's files."""
    from transformers import AutoProcessor, AutoTokenizer, SiglipModel

    model = SiglipModel.from_pretrained(directory, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("repo", [SIGLIP, SIGLIP2])
def test_a_transformers_repository_serves_what_transformers_computes(cache: HubCache, repo: str) -> None:
    settings = ModelSettings(model=repo, buckets=(1, 4))
    encoder = create_encoder(settings)
    from transformers import SiglipImageProcessorPil

    model, processor, tokenizer = transformers_reference(snapshot(cache, repo))
    assert encoder.info.resample == ("bilinear" if repo == SIGLIP2 else "bicubic")
    files = images()
    served = encoder.encode(np.stack([preprocess_image(f, encoder.image_size, resample=encoder.info.resample)
                                      for f in files]))
    # transformers' default processor (its torchvision backend) and its Pillow one, whose pixels ours are.
    pillow = SiglipImageProcessorPil.from_pretrained(snapshot(cache, repo))
    for each in (processor.image_processor, pillow):
        with torch.inference_mode():
            pixels = each(images=[decode_image(f) for f in files], return_tensors="pt")["pixel_values"]
            features = model.get_image_features(pixel_values=pixels).pooler_output
        assert cosines(served, torch.nn.functional.normalize(features, dim=-1).numpy()).min() >= 0.9999

    text = create_text_encoder(settings)
    with torch.inference_mode():
        inputs = tokenizer(TEXTS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
        expected = torch.nn.functional.normalize(model.get_text_features(**inputs).pooler_output, dim=-1)
    assert cosines(text.encode(TEXTS), expected.numpy()).min() >= 0.9999
    assert text.info.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))
    assert text.info.logit_bias == pytest.approx(float(model.logit_bias.detach()))
    assert text.info.tokenizer == f"hub:{repo}@{MAIN_COMMIT}"


def test_an_open_clip_hub_model_serves_what_open_clip_computes(cache: HubCache) -> None:
    import open_clip

    settings = ModelSettings(model=f"hf-hub:{OPEN_CLIP_REPO}", buckets=(1, 4))
    encoder = create_encoder(settings)
    model, _, preprocess = open_clip.create_model_and_transforms(f"hf-hub:{OPEN_CLIP_REPO}")
    model.eval()
    files = images()
    served = encoder.encode(np.stack([preprocess_image(f, encoder.image_size) for f in files]))
    with torch.inference_mode():
        pixels = torch.stack([preprocess(decode_image(f)) for f in files])
        expected = model.encode_image(pixels, normalize=True).numpy()
    assert cosines(served, expected).min() >= 0.9999

    text = create_text_encoder(settings)
    tokenizer = open_clip.get_tokenizer(f"hf-hub:{OPEN_CLIP_REPO}")
    with torch.inference_mode():
        expected = model.encode_text(tokenizer(TEXTS), normalize=True).numpy()
    assert cosines(text.encode(TEXTS), expected).min() >= 0.9999
    assert settings.weights_source == f"hub:{OPEN_CLIP_REPO}"


def test_a_pinned_revision_is_the_one_served_and_recorded(cache: HubCache) -> None:
    from siglip_serve.bulk.identity import weights_id
    from siglip_serve.models.neuron.manifest import digest_weights
    from siglip_serve.serve.plan.config import ServiceConfig

    pinned = ModelSettings(model=SIGLIP, revision=OTHER_COMMIT, buckets=(1,))
    main = ModelSettings(model=SIGLIP, buckets=(1,))
    image = preprocess_image(images()[0], (32, 32))[None]
    model, _, _ = transformers_reference(snapshot(cache, SIGLIP, OTHER_COMMIT))
    with torch.inference_mode():
        pixels = torch.from_numpy(image).float() / 127.5 - 1.0
        expected = torch.nn.functional.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
    served = create_encoder(pinned)
    assert cosines(served.encode(image), expected.numpy()).min() >= 0.9999
    assert cosines(create_encoder(main).encode(image), expected.numpy()).max() < 0.99
    assert served.info.weights == pinned.weights_source == f"hub:{SIGLIP}@{OTHER_COMMIT}"
    # Bulk's rows and an artifact's manifest name the snapshot's commit, pinned or resolved from main.
    assert weights_id(ServiceConfig(model=SIGLIP, revision=OTHER_COMMIT)) == f"hub:{SIGLIP}@{OTHER_COMMIT}"
    assert weights_id(ServiceConfig(model=SIGLIP)) == f"hub:{SIGLIP}@{MAIN_COMMIT}"
    assert digest_weights(main).source == f"hub:{SIGLIP}@{MAIN_COMMIT}"


def one_line_refusal(settings: ModelSettings) -> str:
    with pytest.raises(ModelLoadError) as refused:
        create_encoder(settings)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_an_unknown_id_a_repository_not_a_siglip_and_a_missing_file_each_say_so_in_one_line(
        cache: HubCache, built: dict[str, Any]) -> None:
    from siglip_serve.serve.plan.model_checks import preflight_weights

    message = one_line_refusal(ModelSettings(model="org/no-such-model"))
    assert "model config (config.json) of org/no-such-model is not in the local Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message

    root: Path = built["root"]
    bert = root / "bert"
    bert.mkdir(exist_ok=True)
    (bert / "config.json").write_text('{"model_type": "bert"}')
    (bert / "preprocessor_config.json").write_text("{}")
    cache.add("org/a-bert", bert)
    message = one_line_refusal(ModelSettings(model="org/a-bert"))
    assert "org/a-bert is not a SigLIP" in message and "'bert'" in message

    def without(name: str, missing: str) -> str:
        """The one-line refusal of a transformers repository `org/NAME` cached without its file `missing`."""
        repo = root / name
        transformers_repo(repo)
        (repo / missing).unlink()
        cache.add(f"org/{name}", repo)
        return one_line_refusal(ModelSettings(model=f"org/{name}"))

    message = without("no-processor", "preprocessor_config.json")
    assert "preprocessor_config.json" in message and "org/no-processor" in message
    message = without("no-weights", "model.safetensors")
    assert "model weights (model.safetensors or pytorch_model.bin) of org/no-weights" in message
    # Patch budgets are a NaFlex model's: a fixed-resolution repository is known as one once its config is read.
    message = one_line_refusal(ModelSettings(model=SIGLIP, patch_budgets=(256,)))
    assert "patch_budgets [256] are for SigLIP 2 NaFlex models" in message
    # The start's check says the same before any replica starts.
    with pytest.raises(ModelLoadError, match="model.safetensors or pytorch_model.bin"):
        preflight_weights(ModelSettings(model="org/no-weights"))


def test_the_source_is_decided_once_from_the_settings() -> None:
    assert model_source("ViT-B-16-SigLIP").kind == OPEN_CLIP
    assert model_source("google/siglip-so400m-patch14-384").kind == TRANSFORMERS
    hub = model_source("hf-hub:timm/ViT-SO400M-14-SigLIP-384", "c" * 40)
    assert (hub.kind, hub.repo, hub.label) == (OPEN_CLIP_HUB, "timm/ViT-SO400M-14-SigLIP-384",
                                               f"hub:timm/ViT-SO400M-14-SigLIP-384@{'c' * 40}")
    assert ModelSettings(model="google/siglip2-base-patch16-224").weights_source == \
        "hub:google/siglip2-base-patch16-224"
    with pytest.raises(ValueError, match="revision pins a Hugging Face repository"):
        ModelSettings(model="ViT-B-16-SigLIP", revision="c" * 40)
    with pytest.raises(ValueError, match="names its weights on the hub"):
        ModelSettings(model="google/siglip-base-patch16-224", checkpoint=Path("model.pt"))
    with pytest.raises(ValueError, match="neither an open_clip config name nor"):
        ModelSettings(model="google/siglip/base")


def test_the_neuron_backends_refuse_a_transformers_repository_in_one_line(cache: HubCache) -> None:
    from siglip_serve.models.loading import load_embedder

    with pytest.raises(ModelLoadError, match="builds open_clip models only"):
        load_embedder(ModelSettings(model=SIGLIP, backend="neuron"))
