"""`siglip-serve compile [--backend neuron|neuron-native] ...`: one command, both Neuron lines.

--backend neuron (the default) is the trace line (siglip_serve.models.neuron.trace). --backend neuron-native is
TorchNeuron: this module parses its options and sets the compile environment before torch is
imported (torch autoloads torch-neuronx), then hands over to siglip_serve.models.neuron.native. It imports
nothing that imports torch until then.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from siglip_serve.core.cli import SettingsError, add_log_level, run_main, setup_logging
from siglip_serve.core.constants import InvalidLnc, lnc_setting
from siglip_serve.models.cli_args import add_model_arguments, settings_from_args
from siglip_serve.models.neuron.base import add_recipe_arguments
from siglip_serve.models.neuron.env import (
    NativeOptions,
    environment,
    installed_versions,
    sdk_tag,
)

# The two Neuron lines this command compiles for (their backends' names), the trace line first: the default.
LINES = ("neuron", "neuron-native")
DEFAULT_CACHE_ROOT = Path("artifacts")
log = logging.getLogger("siglip_serve.compile")


def build_native_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve compile --backend neuron-native",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=LINES, default="neuron",
                        help="neuron: the trace line (torch-neuronx 2.9); neuron-native: TorchNeuron (2.14)")
    add_model_arguments(parser, backend=False, extra=("text_buckets",))
    parser.add_argument("--text", action="store_true",
                        help="also compile the text tower, one graph per --text-buckets size (for /v1/classify and "
                             "text), into the same artifact")
    recipe = parser.add_argument_group("TorchNeuron recipe (NEURON_CC_FLAGS, NEURON_COMPILER_OPT_LEVEL, LNC)")
    add_recipe_arguments(recipe)
    parser.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT,
                        help="artifacts go to CACHE_ROOT/<SDK tag>/<model>-lnc<N>-<key>/")
    parser.add_argument("--link", type=Path, help="also point this symlink at the artifact (stable path for configs)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan as JSON; needs no SDK and reads no weights")
    parser.add_argument("--force", action="store_true", help="recompile even if a complete artifact exists")
    add_log_level(parser)
    return parser


def native_options(args: argparse.Namespace) -> NativeOptions:
    lnc = args.lnc
    if lnc is None:
        try:
            lnc, _ = lnc_setting()
        except InvalidLnc as exc:
            raise SettingsError(str(exc)) from None
    return NativeOptions.from_args(args, lnc)


def native_main(argv: Sequence[str]) -> int:
    args = build_native_parser().parse_args(argv)
    setup_logging(args.log_level)
    return run_main(lambda: _native(args), log)


def _native(args: argparse.Namespace) -> int:
    saved = dict(os.environ)
    try:
        settings = settings_from_args(args)
        options = native_options(args)
        versions = installed_versions()
        if not args.dry_run:
            staging = args.cache_root / sdk_tag(versions) / f".partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            env = environment(options.recipe_env(), staging)
            if "torch" in sys.modules:
                log.warning("torch was imported before the TorchNeuron environment was set; values it read at import "
                            "time are not this plan's")
            os.environ.update(env)
            log.info("TorchNeuron environment: %s", " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
        native = importlib.import_module("siglip_serve.models.neuron.native")  # torch is imported from here on
        if args.dry_run:
            print(json.dumps(native.dry_run_plan(settings, options, args.cache_root, versions, args.text).as_json(),
                             indent=2))
            return 0
        from siglip_serve.models.neuron.runtime import TorchNeuronRuntime

        result = native.compile_native_artifact(settings, options, args.cache_root, staging, TorchNeuronRuntime(),
                                                force=args.force, text=args.text)
        if args.link is not None:
            importlib.import_module("siglip_serve.models.neuron.trace").point_link(args.link, result.artifact_dir)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    print(result.artifact_dir)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--backend", choices=LINES, default="neuron")
    known, rest = probe.parse_known_args(argv)
    if known.backend == "neuron-native":
        return native_main(argv)
    if {"-h", "--help"} & set(rest):
        print("(the trace line's options follow; for TorchNeuron: siglip-serve compile --backend neuron-native --help)")
    return int(importlib.import_module("siglip_serve.models.neuron.trace").main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
