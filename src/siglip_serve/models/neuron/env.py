"""TorchNeuron (the native PyTorch backend of Neuron 2.33): its package set, the environment that
carries the compile recipe, and every start-up refusal of the `neuron-native` backend.

This module imports neither torch nor the SDK: the environment must be chosen before `import torch`,
because torch >= 2.9 autoloads torch-neuronx through its `torch.backends` entry point (Neuron docs,
"What is TorchNeuron?" FAQ), so whatever the SDK reads at load time is read then.

Sources (Neuron docs, awsdocs-neuron.readthedocs-hosted.com):
- release-notes/components/torchneuron (2.33.0): torch-neuronx 2.14.3.0.* is the family for
  PyTorch 2.14.0, Python 3.12-3.14; standalone wheels for Ubuntu 26.04 only; on 24.04 use the DLAMI.
- v2.33.0 release-notes/components/index: Neuron Compiler 2.28.7631.0, NKI 0.7.0.
- v2.33.0 setup/pytorch/update-dlami: the DLAMI venv /opt/aws_neuronx_venv_torch_neuronx_2_14_0.
- torch/compile/reference-torch-compile: fullgraph=True recommended; dynamic=True rejected.
- torch/reference/env-vars: the TorchNeuron environment variables page.
The docs pages found do not spell out how NEURON_CC_FLAGS and NEURON_COMPILER_OPT_LEVEL reach
neuronx-cc on the torch.compile path; the torch-neuronx source appends NEURON_CC_FLAGS after its
own defaults ("--model-type transformer --auto-cast=none") and reads NEURON_COMPILER_OPT_LEVEL
("-O1" when unset). That later flags win is neuronx-cc's command-line behaviour, to be confirmed on
a trn2 (tests/device/test_neuron_native_trn2.py compares embeddings against the CPU model).
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from siglip_serve.core.constants import LNC_ENV, VISIBLE_CORES_ENV, expand_visible_cores, package_version
from siglip_serve.models.neuron.base import NeuronOptions, NeuronRefusal
from siglip_serve.models.neuron.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    from siglip_serve.models.settings import ModelSettings

SDK_RELEASE = "2.33.1"
# The Neuron release each torch-neuronx build of either line shipped in, so a refusal and trn2-check name the
# SDK found beside the one pinned: 2.31.0's trace build (constraints-neuron-2.31.txt) and 2.33's TorchNeuron
# families from the release notes above; 2.34's (30 Nov 2026, TorchNeuron 2.13.3.1 and 2.14.3.1, still beta)
# as issue 59 reports them, not read in the Neuron docs from here. Moving to 2.34 waits on its TorchNeuron
# release notes (the PyTorch, Python and neuronx-cc versions each family pairs with) and a trn2-check run
# on its DLAMI (compile, cosines against the CPU model, warm starts): docs/torchneuron.md.
NEURON_RELEASES = {"2.9.0.2.15": "2.31.0", "2.13.3.0": "2.33", "2.14.3.0": "2.33", "2.13.3.1": "2.34",
                   "2.14.3.1": "2.34"}
# The pinned set (also pyproject's `neuron-native` extra and constraints-neuron-native.txt).
TORCH_NEURONX_FAMILY = "2.14.3.0"
NEURONX_CC_VERSION = "2.28.7631.0"
TORCH_SERIES = "2.14"
# TorchNeuron's release notes (release-notes/components/torchneuron, 2.33.0) pair the 2.14.3.0.* family
# with PyTorch 2.14.0 exactly; torchvision 0.29.0 is that torch's own pair (pytorch/vision README).
# A later torch patch (pip may pull one in for another package) is not what TorchNeuron was built for.
TORCH_VERSION = "2.14.0"
TORCHVISION_VERSION = "0.29.0"
NEURON_PIP_REPOSITORY = "https://pip.repos.neuron.amazonaws.com"
DLAMI_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
INSTALL_HINT = (
    f"on a trn2 use the TorchNeuron DLAMI venv (source {DLAMI_VENV}/bin/activate) or, on Ubuntu 26.04, a "
    f"fresh venv: pip install -c constraints-neuron-native.txt -e '.[neuron-native]' --extra-index-url "
    f"{NEURON_PIP_REPOSITORY} --extra-index-url https://download.pytorch.org/whl/cpu (docs/torchneuron.md)"
)

CC_FLAGS_ENV = "NEURON_CC_FLAGS"
OPT_LEVEL_ENV = "NEURON_COMPILER_OPT_LEVEL"
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
# TorchNeuron's NEFF caches where the variables are unset: the persistent cache "neff_cache" and its local
# tier "local_cache" in the temp directory (torch-neuronx's cache configuration: TORCH_NEURONX_NEFF_CACHE_DIR,
# default /tmp/neff_cache; TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR, default /tmp/local_cache).
LOCAL_NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
DEFAULT_NEFF_CACHE_NAMES = ("neff_cache", "local_cache")
# The trace line's (torch-xla's) persistent compile cache: NEURON_COMPILE_CACHE_URL, a folder or s3:// URL,
# default /var/tmp/neuron-compile-cache (Neuron docs, "Neuron Persistent Cache").
COMPILE_CACHE_URL_ENV = "NEURON_COMPILE_CACHE_URL"
DEFAULT_COMPILE_CACHE = "/var/tmp/neuron-compile-cache"
# Every variable that decides what is compiled, or where the compiled graphs are looked up.
RECIPE_ENV = (LNC_ENV, CC_FLAGS_ENV, OPT_LEVEL_ENV, NEFF_CACHE_ENV)
NEFF_DIR = "neff"


class TorchNeuronRefusal(NeuronRefusal):
    """The neuron-native backend will not start here; the message is one line with the fix."""


@dataclass(frozen=True, kw_only=True)
class NativeOptions(NeuronOptions):
    """The recipe as TorchNeuron reads it: from the environment (NEURON_CC_FLAGS and the rest)."""

    def cc_flags(self) -> str:
        flags = ["--target", self.target, "--lnc", str(self.lnc), f"--auto-cast={self.auto_cast}"]
        if self.auto_cast != "none":
            flags.append(f"--auto-cast-type={self.auto_cast_type}")
        flags += ["--model-type", self.model_type, *self.extra_args]
        return shlex.join(flags)

    def recipe_env(self) -> dict[str, str]:
        """The environment that decides the compiled graphs (the NEFF cache location comes apart)."""
        return {LNC_ENV: str(self.lnc), CC_FLAGS_ENV: self.cc_flags(), OPT_LEVEL_ENV: f"-O{self.optlevel}"}


def environment(recipe: Mapping[str, str], artifact_dir: Path) -> dict[str, str]:
    """What a compile or a replica runs with: the recipe, and the artifact's own NEFF cache."""
    return {**recipe, NEFF_CACHE_ENV: str(Path(artifact_dir).resolve() / NEFF_DIR)}


def artifact_environment(artifact_dir: Path) -> dict[str, str]:
    """The environment a process that loads this artifact must start with (read from its manifest
    as JSON, without torch), so a launcher can set it before the child imports torch."""
    import json

    directory = Path(artifact_dir)
    try:
        recipe = json.loads((directory / MANIFEST_NAME).read_text())["recipe_env"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TorchNeuronRefusal(f"{directory} has no readable neuron-native manifest with a recipe_env ({exc}); "
                                 f"compile it with siglip-serve compile --backend neuron-native") from None
    return environment(recipe, directory)


def replica_environment(settings: ModelSettings) -> dict[str, str]:
    """The neuron-native replica's environment (the backend record's `replica_env`): read from the
    artifact's manifest on the replica's own node, before it imports torch. No artifact_dir: nothing,
    and the start checks say what to set."""
    if settings.artifact_dir is None:
        return {}
    return artifact_environment(Path(settings.artifact_dir).expanduser().resolve())


def default_neff_caches() -> list[Path]:
    """Where TorchNeuron keeps NEFFs when no variable says otherwise: both tiers, in the system temp directory
    and in /tmp (the source's literal default), once each."""
    temps = dict.fromkeys((Path(tempfile.gettempdir()), Path("/tmp")))
    return [temp / name for name in DEFAULT_NEFF_CACHE_NAMES for temp in temps]


def neff_cache_dir(env: Mapping[str, str]) -> Path:
    """The persistent NEFF cache TorchNeuron writes to under ``env``."""
    return Path(env.get(NEFF_CACHE_ENV) or default_neff_caches()[0])


def installed_versions() -> dict[str, str | None]:
    """Versions of the packages that make the compiled graphs, from package metadata (no import)."""
    return {"torch": package_version("torch"), "torch_neuronx": package_version("torch-neuronx"),
            "neuronx_cc": package_version("neuronx-cc")}


def sdk_tag(versions: Mapping[str, str | None]) -> str:
    """The directory name for everything compiled with this SDK: a new SDK never reads old graphs."""
    return f"torchneuron-{versions.get('torch_neuronx') or 'none'}-cc{versions.get('neuronx_cc') or 'none'}"


def neuron_release(torch_neuronx: str | None) -> str | None:
    """The Neuron release a torch-neuronx version shipped in, where NEURON_RELEASES knows its family."""
    return next((release for family, release in NEURON_RELEASES.items()
                 if torch_neuronx and torch_neuronx.startswith(family + ".")), None)


def check_native_sdk(versions: Mapping[str, str | None]) -> None:
    """Refuse unless the TorchNeuron line (torch-neuronx 2.14.3.0.*, torch 2.14) is installed."""
    neuronx, torch_version = versions.get("torch_neuronx"), versions.get("torch") or "?"
    if neuronx is None:
        raise TorchNeuronRefusal(f"the neuron-native backend needs TorchNeuron (torch-neuronx "
                                 f"{TORCH_NEURONX_FAMILY}.*, torch {TORCH_SERIES}, neuronx-cc {NEURONX_CC_VERSION}), "
                                 f"which is not installed here; {INSTALL_HINT}")
    if neuronx == "1.0":
        raise TorchNeuronRefusal(f"the torch-neuronx installed here is PyPI's empty placeholder 1.0, not TorchNeuron; "
                                 f"pip uninstall torch-neuronx, then {INSTALL_HINT}")
    if neuronx.startswith("2.9."):
        raise TorchNeuronRefusal(f"this venv has the trace line (torch-neuronx {neuronx}, torch {torch_version}), not "
                                 f"TorchNeuron: serve it with --backend neuron, or make a separate venv for "
                                 f"--backend neuron-native (the two lines share the package name and cannot share a "
                                 f"venv); {INSTALL_HINT}")
    if not neuronx.startswith(TORCH_NEURONX_FAMILY + ".") or not torch_version.startswith(TORCH_SERIES + "."):
        found = neuron_release(neuronx)
        release = f"Neuron {found}" if found else "a Neuron release not known here"
        raise TorchNeuronRefusal(f"neuron-native is pinned to Neuron {SDK_RELEASE} (torch-neuronx "
                                 f"{TORCH_NEURONX_FAMILY}.* with torch {TORCH_VERSION}), but this venv has "
                                 f"torch-neuronx {neuronx} ({release}) with torch {torch_version}; {INSTALL_HINT}")
    # The PyTorch CPU index labels its wheels (2.14.0+cpu): the release is what TorchNeuron is built for.
    if torch_version.split("+")[0] != TORCH_VERSION:
        raise TorchNeuronRefusal(f"TorchNeuron {neuronx} is built for torch {TORCH_VERSION} but this venv has torch "
                                 f"{torch_version} (pip replaced it?); pip install torch=={TORCH_VERSION} "
                                 f"torchvision=={TORCHVISION_VERSION} --index-url "
                                 f"https://download.pytorch.org/whl/cpu, or start again from the DLAMI venv "
                                 f"(constraints-neuron-native.txt)")
    if versions.get("neuronx_cc") is None:
        raise TorchNeuronRefusal(f"TorchNeuron compiles with neuronx-cc, which is not installed here; pip install "
                                 f"neuronx-cc=={NEURONX_CC_VERSION} --extra-index-url {NEURON_PIP_REPOSITORY}")


def visible_core_count(raw: str | None) -> int | None:
    """How many NeuronCores NEURON_RT_VISIBLE_CORES names ("3", "0-3", "0,2"); None when unset."""
    if raw is None or not raw.strip():
        return None
    try:
        return len(expand_visible_cores(raw))
    except ValueError:
        raise TorchNeuronRefusal(f"{VISIBLE_CORES_ENV}={raw!r} is not a core index or range") from None


def check_one_core(env: Mapping[str, str]) -> str:
    """One replica, one logical NeuronCore: refuse a replica that would hold more (or all) of them."""
    raw = env.get(VISIBLE_CORES_ENV)
    count = visible_core_count(raw)
    if count is None:
        raise TorchNeuronRefusal(f"{VISIBLE_CORES_ENV} is unset, so the Neuron runtime would reserve every NeuronCore "
                                 f"for this one replica; give each replica one core (neuron_cores_per_replica: 1, Ray "
                                 f"then sets it) or export {VISIBLE_CORES_ENV}=<core index>")
    if count != 1:
        raise TorchNeuronRefusal(f"{VISIBLE_CORES_ENV}={raw} gives this replica {count} NeuronCores; a neuron-native "
                                 f"replica runs on exactly one (neuron_cores_per_replica: 1, or export "
                                 f"{VISIBLE_CORES_ENV}=<one core index>)")
    return str(raw)


def check_environment(expected: Mapping[str, str], env: Mapping[str, str], artifact: str) -> None:
    """Refuse unless the compile recipe and NEFF cache in `env` are the artifact's, value for value."""
    for name in RECIPE_ENV:
        # Unset is refused too, even for LNC (trn2 defaults to 2): the replica gets the artifact's
        # environment from Ray, so a missing value means it did not come from there.
        want, have = expected.get(name), env.get(name)
        if have != want:
            raise TorchNeuronRefusal(
                f"{name} is {have!r} here but artifact {artifact} was compiled with {name}={want!r}; TorchNeuron would "
                f"look for (or compile) other graphs. Fix: run with the artifact's environment (siglip-serve run sets "
                f"it from the manifest; by hand: export {name}={shlex.quote(want or '')}), or compile for this one: "
                f"siglip-serve compile --backend neuron-native")


def check_versions(expected: Mapping[str, str | None], versions: Mapping[str, str | None], artifact: str) -> None:
    for name in ("torch", "torch_neuronx", "neuronx_cc"):
        if expected.get(name) != versions.get(name):
            raise TorchNeuronRefusal(
                f"artifact {artifact} was compiled with {name} {expected.get(name)} but this venv has "
                f"{versions.get(name)}; its graphs do not apply here. Install the artifact's set "
                f"(constraints-neuron-native.txt) or compile again here: siglip-serve compile --backend neuron-native")
