"""The neuron-native backend: TorchNeuron (torch 2.14, `torch.compile(backend="neuron")`) on one
logical NeuronCore, from an artifact of `siglip-serve compile --backend neuron-native`.

A replica sets the artifact's environment on itself, read from the manifest on its own node before
it imports torch (the record's `replica_env`: models/neuron/env.py replica_environment). It then
refuses to start, in one line, unless: the SDK is TorchNeuron; the versions, LNC, NEURON_CC_FLAGS,
opt level and NEFF cache are the manifest's; it sees exactly one NeuronCore; every bucket's compiled
graph is in the cache. Only then does it load the weights, compile and warm each bucket (cache hits:
no neuronx-cc run), check that nothing new was compiled, and run every later call under
`torch.compiler.set_stance("fail_on_recompile")`, scoped to the call (run_warm): the stance is
process-wide, so one set for good would make a second encoder in the same process (the other side of
an accuracy run) fail its own warm-up.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from siglip_serve.core.backends import IMAGE, TEXT
from siglip_serve.core.constants import TORCHNEURON_RUNTIME_ENV
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.compiled import ArtifactChecks, ArtifactRunner, checked_artifact, manifest_model_info
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.encoder import Encoder
from siglip_serve.models.loading import ImageEmbedder, open_clip_module
from siglip_serve.models.model_info import SIGLIP_MEAN, SIGLIP_STD
from siglip_serve.models.neuron.env import (
    LNC_ENV,
    TorchNeuronRefusal,
    check_environment,
    check_native_sdk,
    check_one_core,
    check_versions,
    environment,
    installed_versions,
)
from siglip_serve.models.neuron.manifest import sha256_file
from siglip_serve.models.neuron.runtime import (
    NativeManifest,
    NativeRuntime,
    TorchNeuronRuntime,
    artifact_neff_dir,
    compile_buckets,
    missing_graphs,
    read_native_manifest,
    run_warm,
)
from siglip_serve.models.neuron.text import checked_text_entry, text_info_from_entry
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEmbedder, TextEncoder
from siglip_serve.models.tower import RunnerFactory, Tower

log = logging.getLogger(__name__)

# "module:Class" of another NativeRuntime for replicas; the tests put the recording double here to
# serve through the real application on a CPU. Unset (always, in production): TorchNeuron.
RUNTIME_ENV = TORCHNEURON_RUNTIME_ENV


def runtime_from_env() -> NativeRuntime:
    spec = os.environ.get(RUNTIME_ENV, "")
    if not spec:
        return TorchNeuronRuntime()
    module, _, name = spec.partition(":")
    runtime: NativeRuntime = getattr(importlib.import_module(module), name)()
    log.warning("neuron-native runs on %s (%s=%s), not TorchNeuron", runtime.name, RUNTIME_ENV, spec)
    return runtime


def native_artifact(settings: ModelSettings) -> tuple[Path, NativeManifest]:
    return checked_artifact(settings, "neuron-native", "siglip-serve compile --backend neuron-native",
                            read_native_manifest, TorchNeuronRefusal)


def adopt_unset(expected: Mapping[str, str], env: MutableMapping[str, str]) -> None:
    """A standalone process (accuracy, a bench worker) may leave the recipe unset: take the
    artifact's. Set this late, after torch is imported, TorchNeuron may have read some values
    already (the docs do not say when it reads them); replicas and bench workers get them earlier."""
    adopted = {k: v for k, v in expected.items() if k not in env}
    if adopted:
        env.update(adopted)
        log.warning("took %s from the artifact's manifest in-process; export them before starting Python to be "
                    "sure TorchNeuron reads them (docs/torchneuron.md, step 4)", sorted(adopted))


@dataclass
class NativeStart:
    """What every neuron-native tower has checked before it loads weights: the artifact, its NEFF
    cache and the one NeuronCore this process holds."""

    runtime: NativeRuntime
    directory: Path
    manifest: NativeManifest
    neff_dir: Path
    cores: str


class NativeRunner(ArtifactRunner):
    """One tower's graphs, compiled from the artifact's NEFF cache, run under fail_on_recompile."""

    backend = "neuron-native"
    manifest: NativeManifest

    def __init__(self, compiled: Any, start: NativeStart) -> None:
        super().__init__(start.directory, start.manifest, start.manifest.lnc, start.cores)
        self.compiled = compiled
        self.runtime = start.runtime

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return run_warm(self.compiled, self.runtime, batch)

    def artifact_details(self) -> dict[str, Any]:
        return {"runtime": self.runtime.name}


def check_start(settings: ModelSettings, runtime: NativeRuntime | None = None,
                env: Mapping[str, str] | None = None) -> NativeStart:
    """The SDK line, the artifact's versions and environment, and one NeuronCore, or a refusal."""
    runtime = runtime or runtime_from_env()
    env = os.environ if env is None else env
    runtime.check_sdk()
    directory, manifest = native_artifact(settings)
    check_versions(manifest.versions, runtime.versions(), str(directory))
    expected = environment(manifest.recipe_env, directory)
    if env is os.environ:
        adopt_unset(expected, os.environ)
    check_environment(expected, env, str(directory))
    return NativeStart(runtime, directory, manifest, artifact_neff_dir(directory), check_one_core(env))


def check_weights(start: NativeStart, name: str, sha256: str) -> Path:
    path = start.directory / name
    if sha256_file(path) != sha256:
        raise TorchNeuronRefusal(f"{path} is not the file the artifact was compiled with (sha256 differs); "
                                 f"compile the artifact again")
    return path


def warm_from_cache(start: NativeStart, module: torch.nn.Module, buckets: tuple[int, ...],
                    graphs: Mapping[str, list[str]], example: Callable[[int], torch.Tensor],
                    tower: str = "") -> tuple[Any, dict[int, float]]:
    """Compile and run each bucket once, every graph found in the artifact's NEFF cache, or refuse:
    missing graphs would compile for minutes at start, and new ones mean another build of the model."""
    absent = missing_graphs(buckets, graphs, start.runtime.graph_files(start.neff_dir))
    if absent:
        raise TorchNeuronRefusal(f"the compiled graphs of {tower}buckets {sorted(absent)} are not in {start.neff_dir} "
                                 f"(missing: {absent}); a replica would compile them for minutes. Compile again: "
                                 f"siglip-serve compile --backend neuron-native")
    compiled, warmed = compile_buckets(module.to(start.runtime.device), buckets, example, start.runtime,
                                       start.neff_dir)
    compiled_here = sorted(w.bucket for w in warmed if w.new_graphs)
    if compiled_here:
        raise TorchNeuronRefusal(f"{tower}buckets {compiled_here} were compiled at start instead of found in "
                                 f"{start.neff_dir}: this replica's graphs differ from the artifact's (another "
                                 f"torch/open_clip build?). Compile again in this venv: siglip-serve compile "
                                 f"--backend neuron-native")
    return compiled, {w.bucket: w.seconds for w in warmed}


def _module(start: NativeStart, tower: str, weights_name: str, weights_sha256: str) -> torch.nn.Module:
    """The tower's architecture from open_clip, filled with the weights file the artifact was compiled with."""
    model = open_clip_module().create_model(start.manifest.model, pretrained=None)  # architecture only
    module = ImageEmbedder(model.visual, SIGLIP_MEAN, SIGLIP_STD) if tower == IMAGE else TextEmbedder(model.text)
    module.eval()
    module.load_state_dict(torch.load(check_weights(start, weights_name, weights_sha256), map_location="cpu",
                                      weights_only=True), strict=True)
    module.requires_grad_(False)
    return module


def _runner(start: NativeStart, module: torch.nn.Module, graphs: Mapping[str, list[str]], tower: str) -> RunnerFactory:
    def warm(buckets: Sequence[int], example: Callable[[int], torch.Tensor]) -> NativeRunner:
        compiled, seconds = warm_from_cache(start, module, tuple(buckets), graphs, example,
                                            "" if tower == IMAGE else f"{tower} ")
        # From here every forward runs under fail_on_recompile (run_warm): another shape is a bug that
        # must fail, not compile for minutes.
        log.info("neuron-native %s: buckets %s warm on NeuronCore %s (%s)", tower, list(buckets), start.cores,
                 {b: f"{s:.1f} s" for b, s in seconds.items()})
        return NativeRunner(compiled, start)
    return warm


def load_native_tower(settings: ModelSettings, tower: str, runtime: NativeRuntime | None = None,
                      env: Mapping[str, str] | None = None) -> Tower:
    """The start checks (SDK, versions, environment, one core), then the tower's weights and every one
    of its buckets' graphs from the artifact's NEFF cache."""
    start = check_start(settings, runtime, env)
    manifest = start.manifest
    if tower == IMAGE:
        module = _module(start, tower, manifest.weights_file, manifest.weights_file_sha256)
        return Encoder(manifest_model_info(manifest), settings.buckets, _runner(start, module, manifest.graphs, tower))
    text = manifest.text
    checked_text_entry(settings, start.directory, text, "siglip-serve compile --backend neuron-native")
    tokenizer, info = text_info_from_entry(settings, manifest.model, text)
    module = _module(start, tower, text["weights_file"], text["weights_file_sha256"])
    return TextEncoder(tokenizer, info, settings.text_buckets, _runner(start, module, text["graphs"], tower))


def load_native_encoder(settings: ModelSettings, runtime: NativeRuntime | None = None,
                        env: Mapping[str, str] | None = None) -> Encoder:
    return cast(Encoder, load_native_tower(settings, IMAGE, runtime, env))


def load_native_text_encoder(settings: ModelSettings, runtime: NativeRuntime | None = None) -> TextEncoder:
    return cast(TextEncoder, load_native_tower(settings, TEXT, runtime))


def check_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """The serving CLI's check before Ray starts: the SDK line (from package metadata, without
    initialising the Neuron runtime in the driver), the artifact and its versions."""
    try:
        versions = installed_versions()
        check_native_sdk(versions)
        directory, manifest = native_artifact(settings)
        check_versions(manifest.versions, versions, str(directory))
        # Replicas get the artifact's LNC from runtime_env, but the Ray node counted its NeuronCores
        # (and hands out their indices) under the LNC of the environment it was started in.
        here, compiled = (env or {}).get(LNC_ENV), manifest.recipe_env.get(LNC_ENV)
        if env is not None and here is not None and here != compiled:
            raise TorchNeuronRefusal(f"{LNC_ENV}={here} here but artifact {directory} was compiled for LNC={compiled}: "
                                     f"Ray would count this node's NeuronCores at LNC={here} while the replicas run "
                                     f"LNC={compiled}. Fix: export {LNC_ENV}={compiled} (before `ray start` too), or "
                                     f"compile for this LNC: siglip-serve compile --backend neuron-native --lnc {here}")
    except TorchNeuronRefusal as exc:
        raise BackendUnavailable(str(exc)) from None


def build(settings: ModelSettings, tower: str) -> Tower:
    try:
        return load_native_tower(settings, tower)
    except TorchNeuronRefusal as exc:
        raise BackendUnavailable(str(exc)) from None


CHECKS = ArtifactChecks(native_artifact, "siglip-serve compile --backend neuron-native")


IMPLEMENTATION = Implementation(build=build, check_available=check_available, check_tower=CHECKS.check_tower,
                                compiled_for=CHECKS.compiled_for)
