"""`siglip-serve accuracy`: do two encoders give the same embeddings on a folder of images?

Each side is a backend plus what it loads, as `key=value` pairs of the model settings:

    siglip-serve accuracy --images photos/ \\
        --a backend=cpu,checkpoint=~/siglip/model.pt \\
        --b backend=neuron,artifact_dir=artifacts/so400m-lnc2

A value may itself hold commas (`buckets=1,2,4`): a piece without `=` continues the previous value.
Images are preprocessed with siglip_serve.models.preprocess, as the server does. It prints the cosine
similarity (min and mean over images), the mean and max absolute error over all embedding values,
and exits 1 when the minimum cosine is below --threshold (0.999, seed 000's bar between the
`--auto-cast matmult` and uncast compiles), so one image that drifts fails the check. With
`--texts FILE` (one text per line) it compares the two sides' text towers the same way, and both
must pass.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from siglip_serve.core.backends import backend_record
from siglip_serve.core.cli import (
    SettingsError,
    UserError,
    add_log_level,
    key_value,
    run_main,
    settings_values,
    setup_logging,
)
from siglip_serve.models.backends.implementation import create_encoder
from siglip_serve.models.cli_args import validate_settings
from siglip_serve.models.encoder import Encoder
from siglip_serve.models.settings import ModelSettings

log = logging.getLogger("siglip_serve.accuracy")

DEFAULT_THRESHOLD = 0.999
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


class NoImages(UserError, FileNotFoundError):
    """The image folder (or texts file) is missing, empty, or holds nothing that decodes."""


class NotComparable(UserError, ValueError):
    """The two encoders cannot be compared (different image sizes or embedding shapes)."""


def parse_spec(spec: str, defaults: dict[str, Any] | None = None) -> ModelSettings:
    """'backend=cpu,model=tiny-siglip,buckets=1,2' -> validated ModelSettings (defaults underneath)."""
    items: list[str] = []
    for piece in (p.strip() for p in spec.split(",")):
        if piece and ("=" in piece or not items):
            items.append(piece)
        elif piece:
            items[-1] = f"{items[-1]},{piece}"
    pairs = []
    for item in items:
        try:
            pairs.append(key_value(item))
        except argparse.ArgumentTypeError:
            raise SettingsError(f"encoder spec {spec!r}: {item!r} is not key=value") from None
    values: dict[str, Any] = {**(defaults or {}), **settings_values(pairs)}
    for path_key in ("checkpoint", "artifact_dir"):
        if isinstance(values.get(path_key), str):
            values[path_key] = str(Path(values[path_key]).expanduser())
    return validate_settings(values)


def image_files(folder: Path, limit: int | None = None) -> list[Path]:
    if not folder.is_dir():
        raise NoImages(f"image folder {folder} does not exist")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise NoImages(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {folder}")
    return files[:limit] if limit else files


def load_images(files: Sequence[Path], size: tuple[int, int]) -> tuple[np.ndarray, list[str], list[str]]:
    """uint8 [N, 3, H, W] of the images that decode, their names, and the names rejected."""
    from siglip_serve.models.preprocess import ImageRejected, preprocess_image

    arrays, names, rejected = [], [], []
    for path in files:
        try:
            arrays.append(preprocess_image(path.read_bytes(), size))
            names.append(str(path))
        except ImageRejected as exc:
            log.warning("skipping %s: %s", path, exc)
            rejected.append(str(path))
    if not arrays:
        raise NoImages("none of the images could be decoded")
    return np.stack(arrays), names, rejected


def compare_embeddings(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Per-image cosine (min, mean, argmin) and absolute error over every value (mean, max)."""
    if a.shape != b.shape:
        raise NotComparable(f"embeddings differ in shape: {a.shape} vs {b.shape}")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    cosine = np.sum(a64 * b64, axis=1) / np.maximum(norms, 1e-12)
    error = np.abs(a64 - b64)
    return {
        "images": int(a.shape[0]),
        "cosine_min": float(cosine.min()),
        "cosine_mean": float(cosine.mean()),
        "mae": float(error.mean()),
        "max_abs_error": float(error.max()),
        "worst_index": int(cosine.argmin()),
    }


def describe_side(settings: ModelSettings, encoder: Encoder) -> dict[str, Any]:
    side = {"backend": settings.backend, "model": encoder.info.name, "weights": encoder.info.weights}
    # The backend's own settings (cuda: its dtype and graphs; the Neuron lines: their artifact).
    for name in backend_record(settings.backend).settings:
        value = getattr(settings, name)
        if value is not None:
            side[name] = str(value) if isinstance(value, Path) else value
    return side


def compare_text(a: ModelSettings, b: ModelSettings, texts: Sequence[str]) -> dict[str, Any]:
    """The text towers of both sides on the same texts: the same statistics, per text."""
    from siglip_serve.models.backends.implementation import create_text_encoder

    stats = compare_embeddings(create_text_encoder(a).encode(texts), create_text_encoder(b).encode(texts))
    stats["texts"] = stats.pop("images")
    stats["worst_text"] = texts[stats.pop("worst_index")]
    return stats


def run_accuracy(a: ModelSettings, b: ModelSettings, folder: Path, limit: int | None = None,
                 threshold: float = DEFAULT_THRESHOLD, texts: Sequence[str] | None = None) -> dict[str, Any]:
    encoder_a = create_encoder(a)
    encoder_b = create_encoder(b)
    if encoder_a.image_size != encoder_b.image_size:
        raise NotComparable(f"the encoders take different image sizes: {encoder_a.image_size} vs "
                            f"{encoder_b.image_size}")
    images, names, rejected = load_images(image_files(folder, limit), encoder_a.image_size)
    log.info("embedding %d images with A (%s) and B (%s)", len(names), a.backend, b.backend)
    stats = compare_embeddings(encoder_a.encode(images), encoder_b.encode(images))
    stats["worst_image"] = names[stats.pop("worst_index")]
    text = compare_text(a, b, texts) if texts else None
    return {
        "a": describe_side(a, encoder_a),
        "b": describe_side(b, encoder_b),
        **stats,
        "rejected_images": rejected,
        "text": text,
        "threshold": threshold,
        "gate": "cosine_min",
        "passed": stats["cosine_min"] >= threshold and (text is None or text["cosine_min"] >= threshold),
    }


def format_report(result: dict[str, Any]) -> str:
    def side(s: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in s.items())

    verdict = "PASS" if result["passed"] else "FAIL"
    return "\n".join([
        f"A: {side(result['a'])}",
        f"B: {side(result['b'])}",
        f"images         {result['images']} ({len(result['rejected_images'])} rejected)",
        f"cosine min     {result['cosine_min']:.6f}   (worst: {result['worst_image']})",
        f"cosine mean    {result['cosine_mean']:.6f}",
        f"MAE            {result['mae']:.6g}",
        f"max abs error  {result['max_abs_error']:.6g}",
        *([f"texts          {text['texts']}",
           f"text cosine min {text['cosine_min']:.6f}   (worst: {text['worst_text']!r})",
           f"text max abs error {text['max_abs_error']:.6g}"] if (text := result.get("text")) else []),
        f"{verdict}: min cosine {min(result['cosine_min'], (text or {}).get('cosine_min', 1.0)):.6f} "
        f"{'>=' if result['passed'] else '<'} threshold {result['threshold']}",
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, metavar="SPEC", help="encoder A, e.g. backend=cpu,checkpoint=model.pt")
    parser.add_argument("--b", required=True, metavar="SPEC", help="encoder B, e.g. backend=neuron,artifact_dir=DIR")
    parser.add_argument("--model", help="model for both sides unless a spec says otherwise")
    parser.add_argument("--images", required=True, type=Path, help="folder of images (searched recursively)")
    parser.add_argument("--limit", type=int, help="use at most this many images")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="minimum cosine (default 0.999)")
    parser.add_argument("--texts", type=Path,
                        help="also compare the text towers on these texts (a file, one text per line)")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the results here")
    add_log_level(parser)
    return parser


def read_texts(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise NoImages(f"--texts {path}: {exc.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return run_main(lambda: _compare(args), log)


def _compare(args: argparse.Namespace) -> int:
    defaults = {"model": args.model} if args.model else {}
    texts = read_texts(args.texts) if args.texts else None
    result = run_accuracy(parse_spec(args.a, defaults), parse_spec(args.b, defaults), args.images,
                          args.limit, args.threshold, texts)
    print(format_report(result))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
