"""`siglip-serve compile`: trace the SigLIP image tower for Trainium2, once per batch bucket.

The recipe is seed 000's (`--lnc N --auto-cast matmult --optlevel 3 --model-type transformer`),
applied to the `ImageEmbedder` (uint8 in, normalisation folded in), for each bucket. A SigLIP 2 NaFlex model's
tower (models/naflex_vision.py: packed patches, mask and position embeddings in) is traced once per (batch,
patch budget) bucket: its input's shape is the bucket's whatever the images' shapes, so no graph is per image.
The result is an artifact directory (siglip_serve.models.neuron.manifest): one `torch.jit.save`d TorchScript per
bucket and a manifest. Same inputs reuse the artifact with no recompile; any changed input makes a new one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from siglip_serve.core.cli import add_log_level, run_main, setup_logging
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.cli_args import add_model_arguments, settings_from_args
from siglip_serve.models.loading import image_geometry
from siglip_serve.models.model_info import ModelInfo
from siglip_serve.models.model_towers import image_model
from siglip_serve.models.naflex import NaflexLayout, served_layout
from siglip_serve.models.neuron.base import NeuronOptions, add_recipe_arguments
from siglip_serve.models.neuron.manifest import (
    ArtifactError,
    Manifest,
    WeightsDigest,
    artifact_name,
    bucket_file,
    cache_key,
    digest_weights,
    file_sizes,
    is_complete,
    read_manifest,
)
from siglip_serve.models.neuron.sdk import LNC_ENV, require_torch_neuronx, runtime_lnc, sdk_versions
from siglip_serve.models.neuron.text import text_cache_inputs, trace_text_buckets
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import load_text_tower, text_context_length

log = logging.getLogger("siglip_serve.compile")

DEFAULT_CACHE_ROOT = Path("artifacts")


@dataclass(frozen=True, kw_only=True)
class CompileOptions(NeuronOptions):
    """The recipe as torch_neuronx.trace's compiler arguments."""

    verbose: str | None = "error"

    def compiler_args(self) -> list[str]:
        args = ["--target", self.target, "--lnc", str(self.lnc), "--auto-cast", self.auto_cast]
        if self.auto_cast != "none":
            # The cast type means nothing without a cast; leaving it out keeps "none" artifacts'
            # arguments exactly what the compiler acts on.
            args += ["--auto-cast-type", self.auto_cast_type]
        args += ["--optlevel", str(self.optlevel), "--model-type", self.model_type]
        if self.verbose:
            args += ["--verbose", self.verbose]
        return args + list(self.extra_args)


@dataclass
class CompilePlan:
    settings: ModelSettings
    options: CompileOptions
    image_size: tuple[int, int]
    weights: WeightsDigest
    versions: dict[str, str | None]
    key: str
    artifact_dir: Path
    buckets: tuple[int, ...] = field(default=())
    # A NaFlex model's layout and its graph's input width (patch values + mask + position embedding width).
    naflex: NaflexLayout | None = None
    naflex_width: int = 0

    def units(self) -> list[tuple[int, int | None]]:
        """Every graph this plan traces: (batch, None) per bucket; a NaFlex model's (batch, budget) per bucket and
        served budget."""
        if self.naflex is None:
            return [(bucket, None) for bucket in self.buckets]
        return [(bucket, budget) for bucket in self.buckets for budget in self.naflex.budgets]

    def input_shape(self, bucket: int, budget: int | None = None) -> list[int]:
        if self.naflex is not None:
            return [bucket, budget or self.naflex.default_budget, self.naflex_width]
        return [bucket, 3, *self.image_size]

    @property
    def input_dtype(self) -> str:
        return "float32" if self.naflex is not None else "uint8"

    def file(self, bucket: int, budget: int | None = None) -> str:
        return bucket_file(bucket) if budget is None else f"bucket-{bucket}-patches-{budget}.pt"

    @staticmethod
    def unit_name(bucket: int, budget: int | None) -> str:
        """The manifest's name of a graph: its batch, and a NaFlex graph's patch budget."""
        return str(bucket) if budget is None else f"{bucket}x{budget}"

    def as_json(self) -> dict[str, Any]:
        args = self.options.compiler_args()
        return {
            "model": self.settings.model,
            "weights": self.weights.as_dict(),
            "lnc": self.options.lnc,
            "auto_cast": self.options.auto_cast,
            "auto_cast_type": self.options.auto_cast_type if self.options.auto_cast != "none" else None,
            "cache_key": self.key,
            "artifact_dir": str(self.artifact_dir),
            "versions": self.versions,
            "buckets": [
                {"batch": b, **({"patch_budget": budget} if budget is not None else {}),
                 "input_shape": self.input_shape(b, budget), "input_dtype": self.input_dtype,
                 "compiler_args": args, "artifact": str(self.artifact_dir / self.file(b, budget))}
                for b, budget in self.units()
            ],
        }


@dataclass
class CompileResult:
    artifact_dir: Path
    manifest: Manifest
    reused: bool


def make_plan(settings: ModelSettings, options: CompileOptions, cache_root: Path,
              versions: dict[str, str | None], embedder: torch.nn.Module | None = None,
              download: bool = True, text: dict[str, Any] | None = None) -> CompilePlan:
    geometry = image_geometry(settings.source)
    image_size = geometry.size
    naflex = served_layout(geometry.naflex, settings.patch_budgets, settings.model)
    weights = digest_weights(settings, embedder, download)
    # Text graphs (--text) join the key only when asked for: image-only artifacts keep their keys; a NaFlex model's
    # budgets and packed input only for it.
    extra: dict[str, Any] = {"text": text} if text else {}
    width = 0
    if naflex is not None:
        width = naflex.patch_values + 1 + geometry.embed_dim
        extra["naflex"] = {"patch_size": naflex.patch_size, "budgets": list(naflex.budgets), "input_width": width}
    key = cache_key({
        **extra,
        "model": settings.model,
        "weights_sha256": weights.sha256,
        "image_size": list(image_size),
        "buckets": list(settings.buckets),
        "compiler_args": options.compiler_args(),
        "versions": versions,
        "input": {"dtype": "uint8", "layout": "NCHW"} if naflex is None else
                 {"dtype": "float32", "layout": "patches, mask, position embeddings"},
    })
    directory = Path(cache_root) / artifact_name(settings.model, options.lnc, key)
    return CompilePlan(settings, options, image_size, weights, versions, key, directory, settings.buckets, naflex,
                       width)


def dry_run_plan(settings: ModelSettings, options: CompileOptions, cache_root: Path) -> CompilePlan:
    """The plan without the SDK. Random weights are built (and hashed) on the CPU; the versions are
    this environment's, so the artifact path is the one a compile here would write. Pretrained
    weights are hashed only if already cached: a dry run downloads nothing."""
    embedder = image_model(settings)[0] if settings.uses_random_weights else None
    try:
        neuronx: ModuleType | None = require_torch_neuronx()
    except BackendUnavailable:
        neuronx = None
    return make_plan(settings, options, cache_root, sdk_versions(neuronx), embedder, download=False)


@contextlib.contextmanager
def runtime_lnc_as(lnc: int) -> Iterator[None]:
    """Seed 000 compiles with NEURON_LOGICAL_NC_CONFIG equal to --lnc; do the same, then restore."""
    before = os.environ.get(LNC_ENV)
    if before is not None and before != str(lnc):
        log.warning("%s=%s in this shell, compiling for LNC=%d: the artifact will only load where "
                    "%s=%d", LNC_ENV, before, lnc, LNC_ENV, lnc)
    os.environ[LNC_ENV] = str(lnc)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LNC_ENV, None)
        else:
            os.environ[LNC_ENV] = before


def _example(embedder: torch.nn.Module, plan: CompilePlan, bucket: int, budget: int | None) -> torch.Tensor:
    """The bucket's example: zero uint8 images, or a NaFlex model's blank images of the budget as its graph's input
    (their position embeddings resized on the host, as served)."""
    if plan.naflex is None or budget is None:
        return torch.zeros(plan.input_shape(bucket), dtype=torch.uint8)
    from siglip_serve.models.naflex_vision import NaflexVision, PositionCache, blank_batch

    assert isinstance(embedder, NaflexVision)
    return blank_batch(plan.naflex, PositionCache(embedder.position_table()), bucket, budget)


def _trace_buckets(neuronx: ModuleType, embedder: torch.nn.Module, plan: CompilePlan,
                   work: Path) -> dict[str, float]:
    args = plan.options.compiler_args()
    seconds: dict[str, float] = {}
    units = plan.units()
    for i, (bucket, budget) in enumerate(units, start=1):
        name = plan.unit_name(bucket, budget)
        example = _example(embedder, plan, bucket, budget)
        log.info("[%d/%d] bucket %s: compiling %s with %s (this takes minutes)",
                 i, len(units), name, plan.input_shape(bucket, budget), " ".join(args))
        began = time.monotonic()
        traced = neuronx.trace(embedder, example, compiler_args=list(args),
                               compiler_workdir=str(work / "workdir" / f"bucket-{name}"))
        seconds[name] = round(time.monotonic() - began, 3)
        torch.jit.save(traced, str(work / plan.file(bucket, budget)))
        log.info("[%d/%d] bucket %s compiled in %.1f s", i, len(units), name, seconds[name])
    return seconds


def _publish(work: Path, final: Path, force: bool) -> bool:
    """Rename the finished temp directory into place; False if another compile got there first."""
    if force and final.exists():
        retired = final.with_name(f".{final.name}.retired-{uuid.uuid4().hex[:8]}")
        os.rename(final, retired)
        shutil.rmtree(retired, ignore_errors=True)
    try:
        os.rename(work, final)
    except OSError:
        if is_complete(final):
            shutil.rmtree(work, ignore_errors=True)
            return False
        raise
    return True


def compile_artifact(settings: ModelSettings, options: CompileOptions,
                     cache_root: Path = DEFAULT_CACHE_ROOT, force: bool = False, text: bool = False) -> CompileResult:
    """Compile every bucket into `cache_root/<model>-lnc<N>-<key12>/`, or reuse it if complete.

    text: also one graph per text bucket (models/neuron/text.py), in the same directory and manifest."""
    neuronx = require_torch_neuronx()
    versions = sdk_versions(neuronx)
    # Random weights are hashed from the built model; file weights are hashed first, so a reused
    # artifact never pays for building the model.
    loaded = image_model(settings) if settings.uses_random_weights else None
    text_key = text_cache_inputs(settings, text_context_length(settings.model)) if text else None
    plan = make_plan(settings, options, cache_root, versions, loaded[0] if loaded else None, text=text_key)
    if not force and is_complete(plan.artifact_dir):
        log.info("reusing %s: same model, weights, buckets, compiler args and versions (key %s)",
                 plan.artifact_dir, plan.key[:12])
        return CompileResult(plan.artifact_dir, read_manifest(plan.artifact_dir), reused=True)
    info: ModelInfo
    embedder, info = loaded or image_model(settings)

    Path(cache_root).mkdir(parents=True, exist_ok=True)
    # A hidden name that no lookup ever takes for an artifact: only the final rename publishes it.
    work = Path(cache_root) / f".{plan.artifact_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    log.info("compiling %s (%s) for LNC=%d, auto-cast %s, buckets %s into %s",
             settings.model, plan.weights.source, options.lnc, options.auto_cast, list(plan.buckets), plan.artifact_dir)
    began = time.monotonic()
    try:
        # no_grad, not inference_mode: torch_neuronx.trace runs the model on XLA tensors, which fail
        # under inference mode; seed 000 traced with no grad context at all.
        with runtime_lnc_as(options.lnc), torch.no_grad():
            seconds = _trace_buckets(neuronx, embedder, plan, work)
            text_entry = {}
            if text:
                text_embedder, _, text_info = load_text_tower(settings, with_tokenizer=False)
                text_entry = trace_text_buckets(neuronx, text_embedder, text_info, settings.text_buckets,
                                                options.compiler_args(), work)
        shutil.rmtree(work / "workdir", ignore_errors=True)
        manifest = Manifest(
            model=settings.model, weights=plan.weights.as_dict(), image_size=list(plan.image_size),
            embed_dim=info.embed_dim, buckets=list(plan.buckets), lnc=options.lnc, auto_cast=options.auto_cast,
            auto_cast_type=options.auto_cast_type if options.auto_cast != "none" else None,
            target=options.target, compiler_args=options.compiler_args(), versions=versions,
            cache_key=plan.key, files={plan.unit_name(b, p): plan.file(b, p) for b, p in plan.units()},
            compile_seconds=seconds,
            text=text_entry, sizes=file_sizes(work),
        )
        manifest.write(work)
    except BaseException:
        log.error("compile failed; the partial output stays at %s for inspection (it is never taken for "
                  "an artifact; delete it when done)", work)
        raise
    published = _publish(work, plan.artifact_dir, force)
    log.info("%s %s in %.1f s", "wrote" if published else "another compile finished first; using",
             plan.artifact_dir, time.monotonic() - began)
    return CompileResult(plan.artifact_dir, read_manifest(plan.artifact_dir), reused=not published)


def point_link(link: Path, target: Path) -> None:
    """Make `link` a symlink to `target`, replacing an older link atomically."""
    if link.exists() and not link.is_symlink():
        raise ArtifactError(f"--link {link} exists and is not a symlink; refusing to replace it")
    link.parent.mkdir(parents=True, exist_ok=True)
    temp = link.with_name(f".{link.name}.link-{uuid.uuid4().hex[:8]}")
    os.symlink(os.path.relpath(target.resolve(), link.parent.resolve()), temp)
    os.replace(temp, link)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve compile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, backend=False, extra=("text_buckets",))
    neuron = parser.add_argument_group("neuronx-cc")
    add_recipe_arguments(neuron)
    neuron.add_argument("--verbose", default="error", help="compiler verbosity ('' to leave it out)")
    neuron.add_argument("--extra-args", default="", help='more compiler arguments in one string, e.g. "--foo 1"')
    parser.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT, help="where artifacts live")
    parser.add_argument("--link", type=Path, help="also point this symlink at the artifact (stable path for configs)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan as JSON; needs no Neuron SDK")
    parser.add_argument("--force", action="store_true", help="recompile even if a complete artifact exists")
    parser.add_argument("--text", action="store_true",
                        help="also compile the text tower, one graph per --text-buckets size "
                             "(for /v1/classify and text)")
    add_log_level(parser)
    return parser


def options_from_args(args: argparse.Namespace) -> CompileOptions:
    # No --lnc: the LNC the runtime will use here (an invalid NEURON_LOGICAL_NC_CONFIG is refused).
    lnc = args.lnc if args.lnc is not None else runtime_lnc(target=args.target)[0]
    return CompileOptions.from_args(args, lnc, shlex.split(args.extra_args), verbose=args.verbose or None)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return run_main(lambda: _compile(args), log)


def _compile(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    options = options_from_args(args)
    if args.dry_run:
        print(json.dumps(dry_run_plan(settings, options, args.cache_root).as_json(), indent=2))
        return 0
    result = compile_artifact(settings, options, args.cache_root, force=args.force, text=args.text)
    if args.link is not None:
        point_link(args.link, result.artifact_dir)
        log.info("%s -> %s", args.link, result.artifact_dir)
    print(result.artifact_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
