"""The text tower in-process: tokenizer from a local dir, parity with open_clip, buckets, the input rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from siglip_serve.models.backends.implementation import create_encoder, create_text_encoder
from siglip_serve.models.loading import ModelLoadError, load_embedder, open_clip_module
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import load_text_tower
from siglip_serve.models.tokenizer_files import BUNDLED_TINY_TOKENIZER, BUNDLED_TOKENIZERS
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.endpoints.classify import prompts_of
from siglip_serve.serve.ingress.schedule import zero_shot
from siglip_serve.serve.plan.policy import policy_of
from tests.bounds import scaled
from tests.helpers import CHECKPOINT_MODEL, LABEL_WORDS, SRC, forced_checkpoint, jpeg_bytes, small_tokenizer

TEXTS = ["a photo of a cat", "A DOG, running!", "rocket astronaut coffee", "zzz unknownword", "x",
         " ".join(["photo"] * 40)]


def open_clip_reference(model_name: str, tokenizer_dir: Path, checkpoint: Path | None = None):
    open_clip = open_clip_module()
    torch.manual_seed(0)
    model = open_clip.create_model(model_name, pretrained=None).eval()
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model, open_clip.get_tokenizer(f"local-dir:{tokenizer_dir}")


@pytest.mark.parametrize("model_name", ["tiny-siglip", "tiny-siglip2"])
def test_tiny_text_embeddings_match_open_clip_encode_text(model_name: str) -> None:
    encoder = create_text_encoder(ModelSettings(model=model_name, torch_threads=1))
    model, tokenizer = open_clip_reference(model_name, BUNDLED_TOKENIZERS[model_name])
    ids = tokenizer(TEXTS)
    assert torch.equal(encoder.tokenize(TEXTS), ids)  # open_clip's own tokenizer, offline
    assert ids.shape == (len(TEXTS), 16)
    ours = encoder.encode(TEXTS)
    with torch.no_grad():
        ref = model.encode_text(ids, normalize=True).numpy()
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(ours * ref, axis=1)) >= 0.9999
    assert encoder.info.logit_scale == pytest.approx(float(model.logit_scale.exp()))
    assert encoder.info.logit_bias == pytest.approx(float(model.logit_bias))


def test_siglip2_configs_are_served_as_siglip_and_tiny_siglip2_has_their_text_architecture() -> None:
    """Every SigLIP 2 config open_clip ships: fixed resolution, SigLIP's preprocessing (which
    models/preprocess.py implements), a hub tokenizer (Gemma's: offline it comes from tokenizer: DIR);
    tiny-siglip2 differs from them only in size. open_clip ships no NaFlex config: NaFlex models are served from
    their transformers repositories (tests/unit/test_naflex.py)."""
    import json

    from siglip_serve.models.loading import available_models

    open_clip = open_clip_module()
    siglip2 = [name for name in available_models() if "SigLIP2" in name]
    assert len(siglip2) == 15 and "ViT-SO400M-16-SigLIP2-384" in siglip2 and "ViT-gopt-16-SigLIP2-384" in siglip2
    tiny = json.loads((SRC / "models" / "configs" / "tiny-siglip2.json").read_text())["text_cfg"]
    for name in siglip2:
        cfg = open_clip.get_model_config(name)
        assert isinstance(cfg["vision_cfg"]["image_size"], int), name  # one resolution: fits the buckets
        for tag in open_clip.list_pretrained_tags_by_model(name):
            pre = open_clip.get_pretrained_cfg(name, tag)
            assert (pre["mean"], pre["std"], pre["interpolation"], pre["resize_mode"]) == (
                (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic", "squash"), name
        text = cfg["text_cfg"]
        assert text["hf_tokenizer_name"].startswith("timm/") and text["vocab_size"] == 256000, name
        for key in ("act_kwargs", "pool_type", "no_causal_mask", "proj_bias"):
            assert text[key] == tiny[key], (name, key)
    assert not [name for name in available_models() if "naflex" in name.lower()]


def test_zero_shot_probabilities_match_open_clip(photos: list[np.ndarray]) -> None:
    from siglip_serve.models.preprocess import preprocess_image

    settings = ModelSettings(model="tiny-siglip", torch_threads=1)
    encoder = create_text_encoder(settings)
    embedder, info = load_embedder(settings)
    images = np.stack([preprocess_image(jpeg_bytes(p), info.image_size) for p in photos[:3]])
    with torch.no_grad():
        image_emb = embedder(torch.from_numpy(images)).numpy()
    ours = zero_shot(image_emb, encoder.encode(TEXTS), encoder.info.logit_scale, encoder.info.logit_bias)

    model, tokenizer = open_clip_reference("tiny-siglip", BUNDLED_TINY_TOKENIZER)
    with torch.no_grad():
        ref_img = model.encode_image(embedder.scale * torch.from_numpy(images).float() + embedder.shift, normalize=True)
        ref = torch.sigmoid(model.logit_scale.exp() * ref_img @ model.encode_text(tokenizer(TEXTS), normalize=True).T
                            + model.logit_bias).numpy()
    flat_ours, flat_ref = ours.ravel(), ref.ravel().astype(np.float64)
    assert np.dot(flat_ours, flat_ref) / (np.linalg.norm(flat_ours) * np.linalg.norm(flat_ref)) >= 0.9999
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-9)


def test_batches_pad_to_buckets_and_split_past_the_largest() -> None:
    encoder = create_text_encoder(ModelSettings(model="tiny-siglip", torch_threads=1, text_buckets=(1, 4)))
    encoder.static_shapes = True  # as a compiled runner (Neuron, CUDA graphs) runs it; the CPU's runs real sizes
    texts = [f"photo {i}" for i in range(7)]
    together = encoder.encode(texts)
    assert encoder.forward_counts == {1: 0, 4: 2}
    alone = np.concatenate([encoder.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)  # padding rows never leak into real ones
    assert encoder.forward_counts[1] == 7


def test_both_towers_run_as_their_backends_runner_runs_them() -> None:
    """One runner per backend: the CPU's runs each tower's batches at their real size (the image tower's
    did, the text tower's padded to its buckets); describe() shows the same runner facts for both."""
    settings = ModelSettings(model="tiny-siglip", torch_threads=1, buckets=(1, 4), text_buckets=(1, 4))
    text, image = create_text_encoder(settings), create_encoder(settings)
    assert text.static_shapes is False and image.static_shapes is False
    seen: list[tuple[int, int]] = []
    text.encode([f"photo {i}" for i in range(7)], lambda size, n, seconds: seen.append((size, n)))
    assert seen == [(4, 4), (3, 3)] and text.forward_counts[3] == 1
    assert type(text.runner) is type(image.runner)
    assert text.describe()["torch_threads"] == image.describe()["torch_threads"] == 1


def test_forced_checkpoint_and_a_tokenizer_built_here(tmp_path: Path) -> None:
    checkpoint = forced_checkpoint(tmp_path / "forced.pt", winner="dog")
    tokenizer_dir = small_tokenizer(tmp_path / "tok")
    settings = ModelSettings(model=CHECKPOINT_MODEL, checkpoint=checkpoint, tokenizer=tokenizer_dir, torch_threads=1)
    encoder = create_text_encoder(settings)
    assert encoder.info.tokenizer == f"local:{tokenizer_dir}"
    model, tokenizer = open_clip_reference(CHECKPOINT_MODEL, tokenizer_dir, checkpoint)
    prompts = prompts_of(list(LABEL_WORDS), "a photo of {}")
    with torch.no_grad():
        ref = model.encode_text(tokenizer(prompts), normalize=True).numpy()
    assert np.min(np.sum(encoder.encode(prompts) * ref, axis=1)) >= 0.9999
    embedder, _ = load_embedder(settings)
    with torch.no_grad():
        image = embedder(torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)).numpy()
    scores = zero_shot(image, encoder.encode(prompts), encoder.info.logit_scale, encoder.info.logit_bias)
    assert [LABEL_WORDS[j] for j in scores.argmax(axis=1)] == ["dog", "dog"]
    assert scores[0, LABEL_WORDS.index("dog")] > 0.99 and np.delete(scores[0], LABEL_WORDS.index("dog")).max() < 0.01


def test_a_tokenizer_dir_without_open_clip_config_uses_the_models_settings(tmp_path: Path) -> None:
    directory = small_tokenizer(tmp_path / "tok")
    (directory / "open_clip_config.json").unlink()
    encoder = create_text_encoder(ModelSettings(model="tiny-siglip", tokenizer=directory, torch_threads=1))
    assert encoder.tokenize(["A Photo, of a CAT!"]).shape == (1, 16)


def test_tokenizer_and_checkpoint_problems_are_one_clear_line(tmp_path: Path) -> None:
    # Refused where it is read (a replica's node), not where the config is parsed (the Ray head, too).
    absent = ModelSettings(model="tiny-siglip", tokenizer=tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="tokenizer directory not found"):
        create_text_encoder(absent)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer from .*set tokenizer: DIR"):
        create_text_encoder(ModelSettings(model="tiny-siglip", tokenizer=tmp_path / "empty"))
    # An image-tower-only checkpoint has no text weights: refuse to serve a random text tower.
    open_clip = open_clip_module()
    model = open_clip.create_model(CHECKPOINT_MODEL, pretrained=None)
    torch.save(model.visual.state_dict(), tmp_path / "visual.pt")
    with pytest.raises(ModelLoadError, match="no text-tower weights"):
        load_text_tower(ModelSettings(model=CHECKPOINT_MODEL, checkpoint=tmp_path / "visual.pt"))


def test_prompt_template_rules() -> None:
    assert prompts_of(["cat", "{x}"], "a photo of {}") == ["a photo of cat", "a photo of {x}"]
    for template, labels in (("no slot", ["cat"]), ("{} and {}", ["cat"]), ("{}", ["cat", "cat"])):
        with pytest.raises(ApiError) as error:
            prompts_of(labels, template)
        assert error.value.status == 422


def test_text_config_defaults_and_limits() -> None:
    from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
    from siglip_serve.serve.plan.placement import replica_asks

    def text_neuron_cores(config: ServiceConfig) -> float:
        return replica_asks(config).text.devices.get("neuron_cores", 0)

    assert policy_of(ServiceConfig.from_args({"model": "tiny-siglip"})).text_replicas == 1
    for backend in ("cuda", "neuron"):
        assert policy_of(ServiceConfig.from_args({"model": "tiny-siglip", "backend": backend})).text_replicas == 0
    neuron = ServiceConfig.from_args({"model": "tiny-siglip", "backend": "neuron", "text_replicas": 1})
    assert policy_of(neuron).text_replicas == 1 and text_neuron_cores(neuron) == 1
    simulated = ServiceConfig.from_args({"model": "tiny-siglip", "neuron_cores_per_replica": 1})
    assert text_neuron_cores(simulated) == 0  # only the neuron backend puts text on a NeuronCore
    config = ServiceConfig.from_args({"model": "tiny-siglip", "text_buckets": "1,8", "max_text_chars": 10})
    assert config.model_settings().text_buckets == (1, 8) and config.max_text_chars == 10
    for bad in ({"text_replicas": -1}, {"max_texts_per_request": 0}, {"text_buckets": [0]}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ServiceConfig.from_args({"model": "tiny-siglip", **bad})


def test_run_refuses_a_missing_tokenizer_before_ray(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    out = subprocess.run([str(Path(sys.executable).parent / "siglip-serve"), "run", "--model", "tiny-siglip", "--set",
                          f"tokenizer={tmp_path / 'empty'}"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "cannot load the tokenizer" in out.stderr and "set tokenizer: DIR" in out.stderr
    assert "Started a local Ray" not in out.stderr


def test_the_default_turns_text_off_in_seconds_without_a_tokenizer_or_hub(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An air-gapped host (no tokenizer: DIR, the hub unreachable): images from a local checkpoint must
    start, without the hub client's retries; text asked for is refused at once, naming the fix."""
    import time

    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.model_checks import preflight_tokenizer
    from siglip_serve.serve.plan.planner import plan_service

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: connection refused
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    began = time.monotonic()
    config = ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "random_weights": True, "replicas": 1})
    text_off = preflight_tokenizer(config)
    assert "127.0.0.1:9 is unreachable" in (text_off or "") and config.text_replicas is None  # as the user wrote it
    planned = plan_service(config, text_off=text_off).model  # the planner plans what the check found
    assert planned.text is None and planned.front.text_off_reason == text_off
    assert "text routes off" in caplog.text and "tokenizer: DIR" in caplog.text
    with pytest.raises(ModelLoadError, match=r"text_replicas: 1 needs ViT-B-16-SigLIP's tokenizer.*tokenizer: DIR"):
        preflight_tokenizer(ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "random_weights": True,
                                                     "text_replicas": 1}))
    assert time.monotonic() - began < scaled(10)
    assert preflight_tokenizer(ServiceConfig.from_args({"model": "tiny-siglip"})) is None  # its tokenizer is bundled


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", ["tiny-siglip", "tiny-siglip2"])
@pytest.mark.parametrize("dtype, bar", [("fp32", 0.9999), ("bf16", 0.999)])
def test_cuda_text_encoder_matches_the_cpu_one(model_name: str, dtype: str, bar: float) -> None:
    cpu = create_text_encoder(ModelSettings(model=model_name, torch_threads=1)).encode(TEXTS)
    cuda = create_text_encoder(ModelSettings(model=model_name, backend="cuda", cuda_dtype=dtype))
    assert cuda.backend == "cuda"
    assert np.min(np.sum(cuda.encode(TEXTS) * cpu, axis=1)) >= bar


@pytest.mark.parametrize("backend", ["neuron", "neuron-native"])
def test_the_cluster_check_counts_the_text_replicas_cores(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.serve.plan.cluster_fit import check_cluster_fits
    from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service

    cluster = {"CPU": 16.0, "neuron_cores": 4.0}
    args = {"model": "tiny-siglip", "backend": backend, "replicas": 4}
    check_cluster_fits(plan_service(ServiceConfig.from_args(args)), total=cluster)  # 4 image replicas on 4 cores
    with pytest.raises(ConfigError, match=r"needs 5 neuron_cores \(4 encoder replica\(s\) x 1 \+ 1 text"):
        check_cluster_fits(plan_service(ServiceConfig.from_args({**args, "text_replicas": 1})), total=cluster)
    # auto leaves the text replica its core, so that application fits
    auto = plan_service(ServiceConfig.from_args({**args, "replicas": "auto", "text_replicas": 1}), cluster)
    assert auto.model.image.replicas == 3
    check_cluster_fits(auto, total=cluster)
