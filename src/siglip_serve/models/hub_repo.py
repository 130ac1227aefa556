"""A hub model's repository files, from the local Hugging Face cache or fetched once, and what its configuration
says of the model: its geometry and the preprocessing its own processor applies.

Like models/hub.py for open_clip's pretrained tags: the cache is looked in first (no network), then
`HF_HUB_OFFLINE`, then one short connect to the hub, so a host without a hub is told in seconds what is missing.
An unknown repository, one that is not a SigLIP, or a missing file is one line naming it (ModelLoadError).
Torch-free: the plan's builder reads the geometry for the ingress.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.hub import HubUnreachable, hub_address, offline_requested, reachable
from siglip_serve.models.naflex import MAX_BUDGET, NaflexLayout
from siglip_serve.models.source import OPEN_CLIP_HUB, TRANSFORMERS, ModelSource

log = logging.getLogger(__name__)

# What to do where a hub model's files are missing and no hub answers (models/hub.py OFFLINE_HINT, for hub ids).
OFFLINE_HINT = ("Fetch the repository once where the hub answers (`hf download ORG/NAME`, into the same HF_HOME), "
                "or pass --random-weights (embeddings then mean nothing).")


@dataclass(frozen=True)
class RepoFile:
    """One file a model needs, under any of its names (the first found wins, as the loaders prefer them)."""

    what: str
    names: tuple[str, ...]
    required: bool = True


# transformers' SiglipModel: its config, its processor's settings, and its weights as save_pretrained writes them.
TRANSFORMERS_CONFIG = RepoFile("model config", ("config.json",))
TRANSFORMERS_PROCESSOR = RepoFile("image processor config", ("preprocessor_config.json",))
TRANSFORMERS_WEIGHTS = RepoFile("model weights", ("model.safetensors", "pytorch_model.bin"))
# open_clip's hub format: what `create_model('hf-hub:...')` reads, in its order (open_clip/pretrained.py).
OPEN_CLIP_CONFIG = RepoFile("open_clip config", ("open_clip_config.json",))
OPEN_CLIP_WEIGHTS = RepoFile("open_clip weights", ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"))
# What AutoTokenizer reads: a fast tokenizer's one file, or a sentencepiece model; its settings beside it.
TOKENIZER = RepoFile("tokenizer", ("tokenizer.json", "spiece.model", "tokenizer.model"))
TOKENIZER_EXTRAS = (RepoFile("tokenizer config", ("tokenizer_config.json",), required=False),
                    RepoFile("special tokens", ("special_tokens_map.json",), required=False))

# open_clip's defaults of a preprocess_cfg that names no mean or std (open_clip/constants.py).
OPENAI_DATASET_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_DATASET_STD = (0.26862954, 0.26130258, 0.27577711)
# Pillow's filters by the numbers transformers' configs store (PILImageResampling is Pillow's enum).
PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class RepoSnapshot:
    """The cached snapshot the files were found in: one revision for all of them."""

    directory: Path
    revision: str  # the commit hash the snapshot holds, pinned or resolved from the main branch


def _cached(source: ModelSource, name: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(str(source.repo), name, revision=source.revision)
    return Path(found) if isinstance(found, str) else None


def _where(source: ModelSource) -> str:
    return f"{source.repo}" + (f" at revision {source.revision}" if source.revision else "")


def _download(source: ModelSource, wanted: RepoFile) -> Path | None:
    """The first of the file's names the hub has; None where it has none (an optional file)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    for name in wanted.names:
        try:
            return Path(hf_hub_download(str(source.repo), name, revision=source.revision))
        except EntryNotFoundError:
            continue
        except RepositoryNotFoundError:
            raise ModelLoadError(f"no repository {source.repo} on the Hugging Face hub (or it is gated or private: "
                                 "log in with `hf auth login`)") from None
        except RevisionNotFoundError:
            raise ModelLoadError(f"{source.repo} has no revision {source.revision!r}") from None
        except Exception as exc:  # broad on purpose: hub clients raise many kinds; all mean "not fetched"
            raise ModelLoadError(f"could not download {name} of {_where(source)} ({type(exc).__name__}: no "
                                 f"network?). {OFFLINE_HINT}") from None
    if wanted.required:
        raise ModelLoadError(f"{_where(source)} has no {wanted.what} ({' or '.join(wanted.names)})")
    return None


def fetch(source: ModelSource, wanted: Sequence[RepoFile], cache_only: bool = False) -> dict[str, Path]:
    """Each wanted file's path in the repository's snapshot (by `what`; an optional file absent from both cache and
    hub is left out): from the cache, else (unless `cache_only`) downloaded once; HubUnreachable where a required
    file is not cached and no hub answers (its message names the file)."""
    found: dict[str, Path] = {}
    missing: list[RepoFile] = []
    for item in wanted:
        path = next((p for p in (_cached(source, name) for name in item.names) if p is not None), None)
        if path is not None:
            found[item.what] = path
        elif item.required:
            missing.append(item)
    if missing:
        first = missing[0]
        what = f"{first.what} ({' or '.join(first.names)}) of {_where(source)}"
        if offline_requested() or cache_only:
            why = "HF_HUB_OFFLINE is set (no network)" if offline_requested() else "nothing is downloaded here"
            raise HubUnreachable(f"{what} is not in the local Hugging Face cache and {why}. {OFFLINE_HINT}")
        host, port = hub_address({"hf_hub": source.repo})
        if not reachable(host, port):
            raise HubUnreachable(f"{what} is not in the local Hugging Face cache and the model hub {host}:{port} is "
                                 f"unreachable (no network?). {OFFLINE_HINT}")
        log.info("fetching %s from the Hugging Face hub (cached after the first time)", _where(source))
        for item in wanted:
            if item.what not in found and (path := _download(source, item)) is not None:
                found[item.what] = path
    return found


@dataclass(frozen=True)
class ImagePrep:
    """What the repository's own processor does to an image before the model: a squash resize to `size` (H, W)
    with Pillow's `resample` filter, then (x * rescale - mean) / std per channel."""

    size: tuple[int, int]
    resample: str
    rescale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # A NaFlex repository's patch geometry (model_type 'siglip2'): each image is resized to its own grid of whole
    # patches within a patch budget (models/naflex.py), and `size` is the learned position grid's, in pixels.
    naflex: NaflexLayout | None = None


@dataclass(frozen=True)
class HubModel:
    """A hub model's files and what its configuration says: the source of `embed_dim`, the image size and filter
    the ingress resizes to, the preprocessing the image tower folds in and the text tower's context length."""

    source: ModelSource
    snapshot: RepoSnapshot
    files: dict[str, Path]
    config: dict[str, Any]  # config.json (transformers) or open_clip_config.json's model_cfg
    embed_dim: int
    context_length: int
    image: ImagePrep

    @property
    def label(self) -> str:
        """The weights' name with the revision the snapshot holds, pinned or resolved: where weights are recorded
        (bulk's rows, artifact manifests), a later commit on the main branch is other weights."""
        return f"hub:{self.source.repo}@{self.snapshot.revision}"


def _json(path: Path, source: ModelSource) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{_where(source)}: cannot read {path.name} ({type(exc).__name__})") from None
    if not isinstance(loaded, dict):
        raise ModelLoadError(f"{_where(source)}: {path.name} holds no JSON object")
    return loaded


def _pair(size: Any) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _normalisation(processor: dict[str, Any]) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """(rescale, mean, std) as a transformers SigLIP processor applies them; its defaults (0.5 both) where the file
    leaves one out, as SiglipImageProcessor's and Siglip2ImageProcessor's are."""
    normalize = processor.get("do_normalize", True)
    return (float(processor.get("rescale_factor", 1 / 255)) if processor.get("do_rescale", True) else 1.0,
            tuple(float(v) for v in processor.get("image_mean", (0.5,) * 3)) if normalize else (0.0,) * 3,
            tuple(float(v) for v in processor.get("image_std", (0.5,) * 3)) if normalize else (1.0,) * 3)


def _naflex_prep(source: ModelSource, vision: dict[str, Any], processor: dict[str, Any]) -> ImagePrep:
    """A NaFlex repository's preprocessing: Siglip2ImageProcessor's (its defaults, transformers'
    image_processing_siglip2.py, where the file leaves one out). `size` is the learned position grid's in pixels,
    what /v1/models shows."""
    kind_of = str(processor.get("image_processor_type", "Siglip2ImageProcessor"))
    if not kind_of.startswith("Siglip2ImageProcessor"):
        raise ModelLoadError(f"{source.repo}: a SigLIP 2 NaFlex model with image processor {kind_of}; served is "
                             "Siglip2ImageProcessor's (an aspect-preserving resize to a patch budget)")
    patch = int(processor.get("patch_size", 16))
    if patch != int(vision.get("patch_size", 16)) or not processor.get("do_resize", True):
        raise ModelLoadError(f"{source.repo}: its processor cuts {patch}-pixel patches (do_resize "
                             f"{processor.get('do_resize', True)}), its vision tower takes "
                             f"{vision.get('patch_size', 16)}-pixel ones, resized")
    positions = int(vision.get("num_patches", 256))
    grid = math.isqrt(positions)
    budget = int(processor.get("max_num_patches", 256))
    if grid * grid != positions or not 1 <= budget <= MAX_BUDGET:
        raise ModelLoadError(f"{source.repo}: num_patches {positions} is not a square grid, or max_num_patches "
                             f"{budget} is not between 1 and {MAX_BUDGET}")
    rescale, mean, std = _normalisation(processor)
    layout = NaflexLayout(patch, grid, budget, (budget,), int(vision.get("num_channels", 3)))
    return ImagePrep((grid * patch, grid * patch), PIL_FILTERS.get(int(processor.get("resample", 2)), "bilinear"),
                     rescale, mean, std, layout)


def _transformers_model(source: ModelSource, files: dict[str, Path]) -> tuple[dict[str, Any], int, int, ImagePrep]:
    config = _json(files[TRANSFORMERS_CONFIG.what], source)
    kind = config.get("model_type")
    if kind not in ("siglip", "siglip2"):
        raise ModelLoadError(f"{source.repo} is not a SigLIP: its config.json says model_type {kind!r} (transformers "
                             "SigLIP and SigLIP 2 repositories say 'siglip', SigLIP 2 NaFlex ones 'siglip2')")
    # Defaults are SiglipVisionConfig's and SiglipTextConfig's, for a config.json that leaves one out.
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    embed_dim = int(vision.get("hidden_size", 768))
    text_dim = int(text.get("projection_size") or text.get("hidden_size", 768))
    if text_dim != embed_dim:
        raise ModelLoadError(f"{source.repo}: its text tower's width {text_dim} is not its image tower's {embed_dim}")
    processor = _json(files[TRANSFORMERS_PROCESSOR.what], source)
    if kind == "siglip2":
        return config, embed_dim, int(text.get("max_position_embeddings", 64)), _naflex_prep(source, vision, processor)
    kind_of = str(processor.get("image_processor_type", "SiglipImageProcessor"))
    if not kind_of.startswith("SiglipImageProcessor"):
        raise ModelLoadError(f"{source.repo}: its image processor is {kind_of}; served are SiglipImageProcessor's "
                             "(a squash resize to a fixed size)")
    size = processor.get("size") or {"height": 224, "width": 224}
    if "height" not in size or "width" not in size or not processor.get("do_resize", True):
        raise ModelLoadError(f"{source.repo}: its image processor does not resize to a fixed height and width "
                             f"(size {size}); served models take one fixed size")
    image_size = (int(size["height"]), int(size["width"]))
    if _pair(vision.get("image_size", 224)) != image_size:
        raise ModelLoadError(f"{source.repo}: its processor resizes to {image_size}, its vision tower takes "
                             f"{vision.get('image_size', 224)}")
    # SiglipImageProcessor's own defaults (transformers' image_processing_siglip.py) where the file leaves one out.
    rescale, mean, std = _normalisation(processor)
    prep = ImagePrep(image_size, PIL_FILTERS.get(int(processor.get("resample", 3)), "bicubic"), rescale, mean, std)
    return config, embed_dim, int(text.get("max_position_embeddings", 64)), prep


def _open_clip_model(source: ModelSource, files: dict[str, Path]) -> tuple[dict[str, Any], int, int, ImagePrep]:
    whole = _json(files[OPEN_CLIP_CONFIG.what], source)
    config = whole.get("model_cfg")
    if not isinstance(config, dict) or "vision_cfg" not in config or "embed_dim" not in config:
        raise ModelLoadError(f"{source.repo}: its open_clip_config.json has no model_cfg with embed_dim and vision_cfg")
    prep = whole.get("preprocess_cfg") or {}
    # open_clip's PreprocessCfg defaults (open_clip/transform.py) where the file leaves one out.
    mode = prep.get("resize_mode", "shortest")
    if mode != "squash":
        raise ModelLoadError(f"{source.repo}: its preprocess_cfg resizes with resize_mode {mode!r}; served models "
                             "squash the image to the model's size (resize_mode 'squash', as SigLIP's configs say)")
    interpolation = str(prep.get("interpolation", "bicubic"))
    if interpolation not in PIL_FILTERS.values():
        raise ModelLoadError(f"{source.repo}: unknown interpolation {interpolation!r} in its preprocess_cfg")
    image = ImagePrep(size=_pair(config["vision_cfg"].get("image_size", 224)), resample=interpolation,
                      rescale=1 / 255, mean=tuple(prep.get("mean", OPENAI_DATASET_MEAN)),
                      std=tuple(prep.get("std", OPENAI_DATASET_STD)))
    return config, int(config["embed_dim"]), int((config.get("text_cfg") or {}).get("context_length", 77)), image


def hub_model(source: ModelSource, weights: bool = False, tokenizer: bool = False,
              cache_only: bool = False) -> HubModel:
    """The hub model's configuration (and, asked for, its weights and tokenizer files), fetched once (`cache_only`:
    from the cache or not at all)."""
    if source.kind == TRANSFORMERS:
        configs, weighed = [TRANSFORMERS_CONFIG, TRANSFORMERS_PROCESSOR], TRANSFORMERS_WEIGHTS
    elif source.kind == OPEN_CLIP_HUB:
        configs, weighed = [OPEN_CLIP_CONFIG], OPEN_CLIP_WEIGHTS
    else:
        raise ValueError(f"{source.name} is not a hub model")
    wanted = [weighed] if weights else []
    if tokenizer:
        # open_clip's hub format may name another repository's tokenizer (hf_tokenizer_name); it is then optional.
        wanted += [RepoFile(TOKENIZER.what, TOKENIZER.names, source.kind == TRANSFORMERS), *TOKENIZER_EXTRAS]
    try:
        # The configuration first: a repository that is not a SigLIP is named so before its weights are looked for.
        files = fetch(source, configs, cache_only)
        where = files[configs[0].what].parent  # snapshots/<commit>/: one revision for every file read
        snapshot = RepoSnapshot(where, where.name)
        read = _transformers_model if source.kind == TRANSFORMERS else _open_clip_model
        config, embed_dim, context, image = read(source, files)
        if wanted:
            files = {**files, **fetch(source, wanted, cache_only)}
    except HubUnreachable as exc:
        raise ModelLoadError(str(exc)) from None
    return HubModel(source, snapshot, files, config, embed_dim, context, image)
