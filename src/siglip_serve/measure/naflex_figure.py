"""`python -m siglip_serve.measure.naflex_figure`: SigLIP 2 NaFlex against a fixed-resolution SigLIP 2 on images of
mixed aspect ratios, for the Benchmarks page.

The set is the sample photos (core/photos) and a wide (4:1) and a tall (1:4) crop of each, as JPEG files. The
models: google/siglip2-base-patch16-naflex's architecture at patch budget 256 (its configuration written here from
transformers' defaults, which are that checkpoint's, into a temporary Hugging Face cache: nothing is downloaded)
and open_clip's ViT-B-16-SigLIP2 at 224, both with random weights, on the CPU. In one sitting, in rounds that
alternate which model goes first, so that a drift of the machine falls on both.

In process, no HTTP and no Ray: each image is handled as the server handles it (decoded and checked, then resized
or packed as the ingress does; models/preprocess.py, models/naflex_prep.py), then embedded by the model's tower in
batches of `--batch`. img/s is images over wall seconds; CPU-ms per image is this process's CPU time (every
thread: decoding and the forward pass) over images, what a server spends per image less its HTTP and Ray hops
(`siglip-serve bench` measures those). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

NAFLEX_REPO = "google/siglip2-base-patch16-naflex"
FIXED_MODEL = "ViT-B-16-SigLIP2"
# google/siglip2-base-patch16-naflex's config.json and preprocessor_config.json: transformers' Siglip2 config
# defaults (its docstrings name that checkpoint) and Siglip2ImageProcessor's; a text tower is built too (random
# weights need the whole model), cut to one layer and a small vocabulary as no text is embedded here.
BASE_NAFLEX_CONFIG: dict[str, Any] = {
    "model_type": "siglip2",
    "text_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 1, "num_attention_heads": 12,
                    "max_position_embeddings": 64, "vocab_size": 64, "pad_token_id": 0, "eos_token_id": 1,
                    "bos_token_id": 2},
    "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                      "num_attention_heads": 12, "num_channels": 3, "patch_size": 16, "num_patches": 256}}
BASE_NAFLEX_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Siglip2ImageProcessor", "do_resize": True, "do_rescale": True, "do_normalize": True,
    "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "max_num_patches": 256, "patch_size": 16, "resample": 2,
    "rescale_factor": 1 / 255}


@dataclass
class ModelRun:
    """One model's rounds: images, wall seconds and CPU seconds each."""

    model: str
    what: str
    rounds: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        images = sum(r["images"] for r in self.rounds)
        return {"img_per_s": images / sum(r["wall_s"] for r in self.rounds),
                "cpu_ms_per_image": 1e3 * sum(r["cpu_s"] for r in self.rounds) / images,
                "img_per_s_median_round": statistics.median(r["images"] / r["wall_s"] for r in self.rounds)}


def mixed_aspect_set() -> list[bytes]:
    """The sample photos and a 4:1 and a 1:4 crop of each, as JPEG files."""
    from PIL import Image

    from siglip_serve.core.sample_photos import PHOTOS, photo_array

    out = []
    for name in PHOTOS:
        photo = photo_array(name)
        height, width = photo.shape[:2]
        wide = photo[: max(1, min(height, width // 4)), :]  # full width, a quarter of it high
        tall = photo[:, : max(1, min(width, height // 4))]
        for array in (photo, wide, tall):
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=90)
            out.append(buffer.getvalue())
    return out


def naflex_cache(root: Path) -> None:
    """The base NaFlex repository's two configuration files as a Hugging Face cache snapshot under `root`."""
    snapshot = root / f"models--{NAFLEX_REPO.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(BASE_NAFLEX_CONFIG))
    (snapshot / "preprocessor_config.json").write_text(json.dumps(BASE_NAFLEX_PROCESSOR))
    (root / f"models--{NAFLEX_REPO.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{NAFLEX_REPO.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)


def contenders(batch: int, threads: int | None) -> list[tuple[ModelRun, Callable[[bytes], np.ndarray], Any]]:
    """Each model's record, its per-image preparation as the ingress does it, and its encoder."""
    from siglip_serve.models.backends.implementation import create_encoder
    from siglip_serve.models.naflex_prep import naflex_image
    from siglip_serve.models.preprocess import preprocess_image
    from siglip_serve.models.settings import ModelSettings

    naflex = create_encoder(ModelSettings(model=NAFLEX_REPO, random_weights=True, buckets=(batch,),
                                          torch_threads=threads))
    fixed = create_encoder(ModelSettings(model=FIXED_MODEL, random_weights=True, buckets=(batch,),
                                         torch_threads=threads))
    layout = naflex.info.naflex
    assert layout is not None

    def packed(data: bytes) -> np.ndarray:
        return naflex_image(data, layout, 256, resample=naflex.info.resample)

    def squashed(data: bytes) -> np.ndarray:
        return preprocess_image(data, fixed.image_size, resample=fixed.info.resample)

    return [(ModelRun(NAFLEX_REPO, "NaFlex base, budget 256 (random weights)"), packed, naflex),
            (ModelRun(FIXED_MODEL, f"fixed {fixed.image_size[0]}x{fixed.image_size[1]} (random weights)"), squashed,
             fixed)]


def one_round(files: Sequence[bytes], prepare: Callable[[bytes], np.ndarray], encoder: Any,
              batch: int) -> dict[str, float]:
    began, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(files), batch):
        encoder.encode(np.stack([prepare(data) for data in files[start:start + batch]]))
    return {"images": float(len(files)), "wall_s": time.perf_counter() - began, "cpu_s": time.process_time() - cpu}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m siglip_serve.measure.naflex_figure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per model, alternating which goes first")
    parser.add_argument("--batch", type=int, default=8, help="images per forward pass")
    parser.add_argument("--images", type=int, default=0, help="only the first N images of the set (0: all)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch threads (default: the usable cores)")
    parser.add_argument("--json", type=Path, default=Path("naflex-figure.json"), help="where the JSON goes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        # Before huggingface_hub is imported: it reads these once.
        os.environ["HF_HUB_CACHE"], os.environ["HF_HUB_OFFLINE"] = root, "1"
        naflex_cache(Path(root))
        files = mixed_aspect_set()
        files = files[: args.images] if args.images else files
        runs = contenders(args.batch, args.torch_threads)
        for _, prepare, encoder in runs:  # one untimed round each: caches, allocator, threads
            one_round(files[: args.batch], prepare, encoder, args.batch)
        for number in range(args.rounds):
            for run, prepare, encoder in runs if number % 2 == 0 else runs[::-1]:
                run.rounds.append(one_round(files, prepare, encoder, args.batch))
    rows = [(run, run.summary()) for run, _, _ in runs]
    print(f"{len(files)} images (sample photos, 4:1 and 1:4 crops), {args.rounds} alternating rounds, batch "
          f"{args.batch}, CPU, in process")
    print(f"{'model':<40} {'img/s':>8} {'CPU-ms/img':>11}")
    for run, summary in rows:
        print(f"{run.what:<40} {summary['img_per_s']:>8.2f} {summary['cpu_ms_per_image']:>11.1f}")
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
              "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
              "images": len(files), "rounds": args.rounds, "batch": args.batch,
              "models": [{**asdict(run), **summary} for run, summary in rows]}
    args.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
