"""SigLIP 2 NaFlex served by its Hub id, offline from a prepared Hugging Face cache (tests/hub_cache.py), equal to
transformers: the ingress's preprocessing (models/naflex_prep.py) and the served tower (models/naflex_vision.py,
the position embeddings resized on the host) against `Siglip2Model.get_image_features` run directly on
transformers' own processors' output, for the sample photos and wide, tall and tiny images at two budgets; the text
tower against `get_text_features`; the base architecture with random weights; and one static input shape per
(batch, budget) whatever the images' shapes."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from siglip_serve.core.sample_photos import photo_array
from siglip_serve.measure.naflex_figure import BASE_NAFLEX_CONFIG, BASE_NAFLEX_PROCESSOR, mixed_aspect_set
from siglip_serve.models.backends.implementation import create_encoder, create_text_encoder
from siglip_serve.models.naflex import NaflexLayout, grids, pack_patches, size_for_budget
from siglip_serve.models.naflex_prep import naflex_image
from siglip_serve.models.preprocess import decode_image
from siglip_serve.models.settings import ModelSettings
from tests.hub_cache import MAIN_COMMIT, HubCache, naflex_repo, use_cache
from tests.unit.test_backends import CaptureRecorder, no_gpu_needed  # noqa: F401  (no_gpu_needed: a fixture)

NAFLEX = "org/tiny-siglip2-naflex"
BASE = "org/siglip2-base-patch16-naflex"  # google/siglip2-base-patch16-naflex's architecture, random weights
BUDGETS = (64, 256)
TEXTS = ["a photo of a cat", "A Photo of a DOG", "rocket", ""]

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hub")
    cache = HubCache(root / "cache")
    cache.add(NAFLEX, naflex_repo(root / "naflex"))
    base = root / "base"
    base.mkdir()
    # google/siglip2-base-patch16-naflex's configuration, written by hand (the figure's: measure/naflex_figure.py).
    (base / "config.json").write_text(json.dumps(BASE_NAFLEX_CONFIG))
    (base / "preprocessor_config.json").write_text(json.dumps(BASE_NAFLEX_PROCESSOR))
    cache.add(BASE, base)
    return {"cache": cache}


@pytest.fixture()
def cache(built: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[HubCache]:
    use_cache(monkeypatch, built["cache"])
    yield built["cache"]


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG")
    return buffer.getvalue()


def images(photos: tuple[str, ...] = ("astronaut", "chelsea", "coffee", "rocket", "moon")) -> list[bytes]:
    """The sample photos, and wide (4:1), tall (1:4), 1x1 and 16x4096 images cut from or tiled of them, as PNG
    files (lossless: both sides decode the same pixels)."""
    arrays = [photo_array(name) for name in photos]
    first = photo_array("astronaut")
    strip = np.tile(first[:256, :16], (16, 1, 1))  # 4096 rows of 16 pixels
    arrays += [first[:80, :320], first[:320, :80], first[:1, :1], strip]
    return [png(array) for array in arrays]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def snapshot(cache: HubCache, repo: str) -> Path:
    return cache.root / f"models--{repo.replace('/', '--')}" / "snapshots" / MAIN_COMMIT


def reference_features(model: Any, directory: Path, files: list[bytes], budget: int,
                       pillow: bool = True) -> list[np.ndarray]:
    """transformers' get_image_features, L2-normalised, on each of its processors' output (its default
    torchvision one, and with `pillow` its Pillow one, whose resize ours is)."""
    from transformers import AutoImageProcessor, Siglip2ImageProcessorPil

    out = []
    processors = [AutoImageProcessor.from_pretrained(directory)]
    processors += [Siglip2ImageProcessorPil.from_pretrained(directory)] if pillow else []
    for processor in processors:
        inputs = processor(images=[decode_image(f) for f in files], max_num_patches=budget, return_tensors="pt")
        with torch.inference_mode():
            features = model.get_image_features(**inputs).pooler_output
        out.append(torch.nn.functional.normalize(features, dim=-1).numpy())
    return out


def test_the_grid_is_transformers_for_every_shape() -> None:
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    for height, width in [(1, 1), (480, 640), (80, 320), (4096, 16), (16, 4096), (7, 1000), (999, 3), (224, 224)]:
        for patch, budget in [(8, 64), (8, 256), (16, 256), (16, 1024)]:
            assert size_for_budget(height, width, patch, budget) == \
                get_image_size_for_max_num_patches(height, width, patch, budget)


def test_a_packed_image_is_the_processors_patches_and_grid() -> None:
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    layout = NaflexLayout(patch_size=4, position_grid=4, default_budget=16, budgets=(16,))
    image = np.random.default_rng(0).integers(0, 256, (3, 8, 12), dtype=np.uint8)
    packed = pack_patches(image, layout, 16)
    assert packed.shape == (17, 48)
    assert np.array_equal(packed[:6], convert_image_to_patches(torch.from_numpy(image), 4).numpy())
    assert not packed[6:16].any()
    assert grids(packed[None]).tolist() == [[2, 3]]


@pytest.mark.parametrize("budget", BUDGETS)
def test_a_naflex_repository_serves_what_transformers_computes(cache: HubCache, budget: int) -> None:
    from transformers import Siglip2Model

    settings = ModelSettings(model=NAFLEX, buckets=(1, 4), patch_budgets=BUDGETS)
    encoder = create_encoder(settings)
    layout = encoder.info.naflex
    assert layout is not None and layout.budgets == (64, 256) and encoder.info.resample == "bilinear"
    files = images()
    served = encoder.encode(np.stack([naflex_image(f, layout, budget, resample=encoder.info.resample)
                                      for f in files]))
    model = Siglip2Model.from_pretrained(snapshot(cache, NAFLEX), dtype=torch.float32).eval()
    for expected in reference_features(model, snapshot(cache, NAFLEX), files, budget):
        assert cosines(served, expected).min() >= 0.9999


def test_a_naflex_repositorys_text_tower_is_transformers(cache: HubCache) -> None:
    from transformers import AutoTokenizer, Siglip2Model

    settings = ModelSettings(model=NAFLEX, buckets=(1, 4))
    text = create_text_encoder(settings)
    model = Siglip2Model.from_pretrained(snapshot(cache, NAFLEX), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(snapshot(cache, NAFLEX))
    assert type(tokenizer).__name__ == "Siglip2Tokenizer"  # the repository's, which lowercases
    with torch.inference_mode():
        inputs = tokenizer(TEXTS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
        expected = torch.nn.functional.normalize(model.get_text_features(**inputs).pooler_output, dim=-1)
    assert cosines(text.encode(TEXTS), expected.numpy()).min() >= 0.9999
    lowered, cased = text.encode(["a photo of a dog", "A Photo of a DOG"])  # lowercased, as SigLIP 2 was trained
    assert lowered.tobytes() == cased.tobytes()
    assert text.info.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))
    assert text.info.logit_bias == pytest.approx(float(model.logit_bias.detach()))


def test_the_base_naflex_architecture_serves_what_transformers_computes(cache: HubCache) -> None:
    from transformers import Siglip2Config, Siglip2Model

    settings = ModelSettings(model=BASE, random_weights=True, seed=3, buckets=(1,))
    encoder = create_encoder(settings)
    layout = encoder.info.naflex
    assert layout is not None and layout.patch_size == 16 and layout.budgets == (256,)
    files = images(("chelsea",))[1:3]  # wide and tall
    served = encoder.encode(np.stack([naflex_image(f, layout, 256) for f in files]))
    torch.manual_seed(3)
    model = Siglip2Model(Siglip2Config.from_pretrained(snapshot(cache, BASE))).eval()
    for expected in reference_features(model, snapshot(cache, BASE), files, 256, pillow=False):
        assert cosines(served, expected).min() >= 0.9999


def test_a_bucket_is_one_static_shape_whatever_the_images(cache: HubCache) -> None:
    """Images of every shape make one input shape per (batch, budget): what a compiled bucket or a CUDA graph
    holds; a budget not served is refused before it joins a batch."""
    from siglip_serve.models.encoder import EncoderInputError

    encoder = create_encoder(ModelSettings(model=NAFLEX, buckets=(1, 4), patch_budgets=(256,)))
    layout = encoder.info.naflex
    assert layout is not None
    from siglip_serve.models.naflex_vision import NaflexEncoder

    assert isinstance(encoder, NaflexEncoder)
    for budget in layout.budgets:
        batch = np.stack([naflex_image(f, layout, budget) for f in images()[-4:]])
        assert tuple(encoder.packed(batch).shape) == (4, budget, layout.patch_values + 1 + 32)
        assert grids(batch).prod(axis=1).max() <= budget
    with pytest.raises(ValueError, match="budget 128 is not served"):
        naflex_image(images()[0], layout, 128)
    with pytest.raises(EncoderInputError, match="packed patches of a served budget"):
        encoder.encode(np.zeros((1, 129, layout.patch_values), dtype=np.uint8))
    with pytest.raises(ValueError, match="patch_budgets .* are for SigLIP 2 NaFlex models"):
        ModelSettings(model="tiny-siglip", patch_budgets=(256,))


def test_the_ingress_packs_each_image_after_its_header_checks_and_budgets_never_share_a_batch(
        cache: HubCache) -> None:
    """The ingress's image preparation (serve/ingress/image_prep.py) gives the packed arrays, of the default budget
    or the one asked for, after the header's limits (an image over the side limit is refused undecoded); the
    replica runs chunks of two budgets as two batches, each equal to encoding it alone."""
    import asyncio

    from siglip_serve.models.preprocess import ImageLimits
    from siglip_serve.serve.http.errors import ApiError
    from siglip_serve.serve.ingress.image_prep import ImagePrep
    from siglip_serve.serve.plan.replica_slices import ModelFront
    from siglip_serve.serve.towers.image_deployment import encode_by_shape

    encoder = create_encoder(ModelSettings(model=NAFLEX, buckets=(1, 4), patch_budgets=(256,)))
    layout = encoder.info.naflex
    assert layout is not None
    front = ModelFront(weights="w", buckets=(1, 4), image_limits=ImageLimits(max_side=2048), max_request_pixels=10**8,
                       max_images_per_request=16, max_texts_per_request=16, max_text_chars=100,
                       allow_dimension_truncation=False, fast_jpeg_decode=False, device_jpeg_decode=True,
                       decode_threads=1, decode_memory_budget_bytes=10**9, text_off_reason=None,
                       model_on_host_cores=True, tower_calls_by_grpc=False)
    prep = ImagePrep(front, encoder.image_size, lambda seconds: None, encoder.info.resample, layout)
    files = images()[:-1]
    labels = [f"input[{i}]" for i in range(len(files))]
    default = asyncio.run(prep.prepare_all(files, labels))
    asked = asyncio.run(prep.prepare_all(files, labels, 256))
    assert isinstance(default, np.ndarray) and isinstance(asked, np.ndarray)
    assert np.array_equal(default, np.stack([naflex_image(f, layout, 64, resample="bilinear") for f in files]))
    assert asked.shape == (len(files), 257, layout.patch_values)
    with pytest.raises(ApiError, match="side length limit"):
        asyncio.run(prep.prepare_all([images()[-1]], ["input[0]"]))  # 4096 x 16, over a 2048-pixel side
    chunks = [default[:2], asked[:3], default[2:], asked[3:]]
    together = encode_by_shape(encoder.encode, chunks)
    assert [len(rows) for rows in together] == [len(chunk) for chunk in chunks]
    for chunk, rows in zip(chunks, together, strict=True):
        assert cosines(rows, encoder.encode(chunk)).min() >= 0.99999


@pytest.mark.usefixtures("no_gpu_needed")
def test_cuda_graphs_are_captured_per_batch_and_budget(cache: HubCache) -> None:
    """The cuda backend captures one graph per (batch, budget) bucket of the NaFlex inputs (patches, mask, position
    embeddings), none per image shape (tests/unit/test_backends.py's double: no GPU runs here)."""
    encoder = create_encoder(ModelSettings(model=NAFLEX, backend="cuda", buckets=(1, 2), patch_budgets=(256,)))
    values = 8 * 8 * 3 + 1 + 32
    assert sorted(encoder.runner.graphs) == [(1, 64, values), (1, 256, values), (2, 64, values), (2, 256, values)]
    assert [tuple(e.shape) for e in CaptureRecorder.examples] == sorted(encoder.runner.graphs)
    assert encoder.static_shapes and encoder.describe()["cuda_graphs"] == [1, 2]


def test_a_request_may_ask_for_a_served_budget_only_and_each_budget_is_cached_apart() -> None:
    """`patch_budget` on /v1/embeddings and /v2/embed (the OpenAPI document's bodies are these models): one of the
    model's served budgets, else 422 in the contract's one error shape; for a model that is not NaFlex, 422; an
    image's embedding at another budget is another cache entry."""
    from siglip_serve.models.model_info import ModelInfo
    from siglip_serve.serve.http.errors import ApiError, ErrorType
    from siglip_serve.serve.ingress.embedding_cache import budget_scope
    from siglip_serve.serve.ingress.endpoints.cohere_embed import CohereEmbedRequest
    from siglip_serve.serve.ingress.endpoints.embeddings import EmbeddingsRequest
    from siglip_serve.serve.ingress.schedule import check_patch_budget

    layout = NaflexLayout(patch_size=16, position_grid=16, default_budget=256, budgets=(256, 576))
    naflex = ModelInfo("naflex", 768, (256, 256), "w", "bilinear", layout)
    fixed = ModelInfo("fixed", 768, (224, 224), "w")
    assert check_patch_budget(None, naflex) is None and check_patch_budget(576, naflex) == 576
    assert check_patch_budget(256, naflex) is None  # the model's own, cached as one whether asked for or not
    for budget, model, said in [(1024, naflex, "patch_budget 1024 is not served by naflex; served: [256, 576]"),
                                (256, fixed, "patch_budget is for SigLIP 2 NaFlex models; fixed takes one fixed")]:
        with pytest.raises(ApiError) as refused:
            check_patch_budget(budget, model)
        assert (refused.value.status, refused.value.error_type) == (422, ErrorType.INVALID_REQUEST)
        assert said in refused.value.message
    assert EmbeddingsRequest.model_validate({"input": "a", "patch_budget": 576}).patch_budget == 576
    assert CohereEmbedRequest.model_validate({"texts": ["a"], "patch_budget": 576}).patch_budget == 576
    for request in (EmbeddingsRequest, CohereEmbedRequest):
        assert "patch_budget" in request.model_json_schema()["properties"]
    assert budget_scope(b"s", None) == b"s" and len({budget_scope(b"s", 256), budget_scope(b"s", 576), b"s"}) == 3


def test_a_request_through_the_ingress_is_embedded_at_the_budget_it_asks(
        cache: HubCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ingress (serve/ingress/ingress.py, its real parts) serving the NaFlex model, its image tower a stand-in
    handle that runs the real encoder as a replica does (tests/helpers.py TowerHandle; Serve's routing and the
    replica's batching are not proven here): a request's images reach the tower packed at the model's budget, or
    at the one the request asks, and are embedded as the encoder embeds them alone; an unserved budget is 422."""
    import asyncio
    import dataclasses
    import time

    from siglip_serve.serve.http.embed_request import image_item
    from siglip_serve.serve.http.errors import ApiError
    from siglip_serve.serve.ingress.ingress import Ingress
    from siglip_serve.serve.ingress.schedule import Work
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service
    from siglip_serve.serve.shared import registry
    from siglip_serve.serve.towers.image_deployment import encode_by_shape
    from tests.helpers import STAND_IN_RECORDS, TowerHandle

    monkeypatch.setattr(registry, "is_draining", lambda app: False)
    encoder = create_encoder(ModelSettings(model=NAFLEX, buckets=(1, 4), patch_budgets=(256,)))
    shapes: list[tuple[int, ...]] = []

    class Replica(TowerHandle):
        async def _embed(self, chunks: list[Any]) -> list[np.ndarray]:
            shapes.extend(tuple(chunk.shape) for chunk in chunks)
            return encode_by_shape(encoder.encode, chunks)

    config = ServiceConfig.from_args({"model": "tiny-siglip", "ingress_replicas": 1, "replicas": 1,
                                      "text_replicas": 0, "embedding_cache_mib": 1})
    info = dataclasses.replace(encoder.info, name="tiny-siglip")
    served = Ingress({"tiny-siglip": {"image": Replica()}}, plan_service(config),  # type: ignore[dict-item]
                     {"tiny-siglip": info}, replica=("test", "ingress-1"),
                     live_replicas=lambda app: list(STAND_IN_RECORDS[:1]), refusal=lambda app, tower: None)
    files = images()[:3]

    async def embed(budget: int | None) -> np.ndarray:
        work = Work("embeddings", [image_item(f, f"input[{i}]") for i, f in enumerate(files)], patch_budget=budget)
        return (await served.serving(None).scheduler.embed(work, time.monotonic() + 120)).rows

    async def scenario() -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        own, asked, again = await embed(None), await embed(256), await embed(256)
        with pytest.raises(ApiError, match="patch_budget 128 is not served"):
            await embed(128)
        return own, asked, again, (await served.describe())[0]

    own, asked, again, described = asyncio.run(scenario())
    assert shapes == [(3, 65, 192), (3, 257, 192)]  # the repeat at 256 came from the cache
    assert described["patch_budgets"] == [64, 256] and again.tobytes() == asked.tobytes()
    for rows, budget in ((own, 64), (asked, 256)):
        alone = encoder.encode(np.stack([naflex_image(f, layout=info.naflex, budget=budget) for f in files]))
        assert cosines(rows, alone).min() >= 0.99999
    assert cosines(own, asked).max() < 0.99999  # another budget, another embedding


def test_the_neuron_compile_plan_traces_one_graph_per_batch_and_budget(
        cache: HubCache, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`siglip-serve compile` of a NaFlex model against the trace double (tests/doubles/torch_neuronx: it runs
    torch.jit.trace on the CPU; no neuronx-cc, NEFF or NeuronCore): one trace per (batch, budget) bucket, of the
    packed input's static shape, and none per image shape: images of every shape run through their budget's one
    traced graph, equal to the eager encoder. The Neuron backends still serve open_clip artifacts only."""
    from siglip_serve.models.neuron.manifest import read_manifest
    from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact, main
    from tests.helpers import neuronx_double, torch_neuronx_from

    with torch_neuronx_from(None):  # the dry run: the plan, without the SDK
        assert main(["--model", NAFLEX, "--random-weights", "--buckets", "1,4", "--patch-budgets", "256",
                     "--cache-root", str(tmp_path), "--dry-run", "--log-level", "ERROR"]) == 0
    planned = json.loads(capsys.readouterr().out)["buckets"]
    assert [(entry["batch"], entry["patch_budget"], entry["input_dtype"]) for entry in planned] == [
        (1, 64, "float32"), (1, 256, "float32"), (4, 64, "float32"), (4, 256, "float32")]
    settings = ModelSettings(model=NAFLEX, buckets=(1, 4), patch_budgets=(256,), torch_threads=1)
    with neuronx_double() as double:
        result = compile_artifact(settings, CompileOptions(lnc=2), tmp_path)
        calls = list(double.CALLS)
    width = 8 * 8 * 3 + 1 + 32
    assert [(call["input_shape"], call["input_dtype"]) for call in calls] == [
        ([1, 64, width], "torch.float32"), ([1, 256, width], "torch.float32"),
        ([4, 64, width], "torch.float32"), ([4, 256, width], "torch.float32")]
    manifest = read_manifest(result.artifact_dir)
    assert manifest.files == {"1x64": "bucket-1-patches-64.pt", "1x256": "bucket-1-patches-256.pt",
                              "4x64": "bucket-4-patches-64.pt", "4x256": "bucket-4-patches-256.pt"}
    encoder = create_encoder(settings)
    from siglip_serve.models.naflex_vision import NaflexEncoder

    assert isinstance(encoder, NaflexEncoder)
    layout = encoder.layout
    files = images()[-4:]  # wide, tall, 1x1, 16x4096: four grids
    for budget in layout.budgets:
        graph = torch.jit.load(str(result.artifact_dir / f"bucket-4-patches-{budget}.pt"))
        batch = np.stack([naflex_image(f, layout, budget) for f in files])
        assert len({tuple(grid) for grid in grids(batch).tolist()}) == 4
        with torch.inference_mode():
            traced = graph(encoder.packed(batch)).numpy()
        assert cosines(traced, encoder.encode(batch)).min() >= 0.99999


def test_bulk_decodes_as_the_ingress_packs_and_names_its_preprocessing(cache: HubCache, tmp_path: Path) -> None:
    """Bulk's decode stage (bulk/stages.py, run here without Ray Data) packs each image at the model's own budget
    as the ingress does, and bulk's rows name that preprocessing, so a change of budget re-embeds."""
    from siglip_serve.bulk import stages
    from siglip_serve.bulk.identity import preprocessing_id
    from siglip_serve.models.preprocess import ImageLimits
    from siglip_serve.serve.plan.config import ServiceConfig

    encoder = create_encoder(ModelSettings(model=NAFLEX, buckets=(1,)))
    layout = encoder.info.naflex
    assert layout is not None
    files = images()[-4:]
    paths = []
    for i, data in enumerate(files):
        (tmp_path / f"{i}.png").write_bytes(data)
        paths.append(str(tmp_path / f"{i}.png"))
    block = {"shard": np.zeros(len(paths), int), "pos": np.arange(len(paths)), "item": np.array(paths, dtype=object)}
    out = stages.decode_batch(block, size=encoder.image_size, limits=ImageLimits(), fast_jpeg=True, model=NAFLEX,
                              resample="bilinear", naflex=layout)
    assert list(out["error_type"]) == [""] * len(paths)
    assert np.array_equal(out["pixels"], np.stack([naflex_image(f, layout, 64) for f in files]))
    assert preprocessing_id(ServiceConfig(model=NAFLEX), "image") == "naflex-bilinear-uint8-v1-patches64"


def test_the_figures_set_is_of_mixed_aspect_ratios() -> None:
    """measure/naflex_figure.py's set: each sample photo, and a 4:1 and a 1:4 crop of it."""
    sizes = [Image.open(io.BytesIO(data)).size for data in mixed_aspect_set()]
    assert len(sizes) % 3 == 0 and len(sizes) >= 3
    for photo, wide, tall in zip(sizes[::3], sizes[1::3], sizes[2::3], strict=True):
        assert wide == (photo[0], photo[0] // 4) and tall == (photo[1] // 4, photo[1])
