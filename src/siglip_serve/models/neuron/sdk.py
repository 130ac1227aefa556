"""What the Neuron SDK gives this machine: is torch-neuronx really there, and which LNC runs here.

Nothing here imports the SDK at module import; `require_torch_neuronx` does, when asked. PyPI's
`torch-neuronx` 1.0 is an empty placeholder whose import raises "WRONG PACKAGE"; the real package
comes only from the Neuron pip repository (or the Neuron DLAMI's preinstalled venv).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from types import ModuleType

from packaging.version import InvalidVersion, Version

from siglip_serve.core.constants import LNC_ENV as LNC_ENV
from siglip_serve.core.constants import VALID_LNC as VALID_LNC
from siglip_serve.core.constants import VISIBLE_CORES_ENV as VISIBLE_CORES_ENV
from siglip_serve.core.constants import InvalidLnc, lnc_setting, package_version
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.neuron.base import NeuronRefusal

NEURON_PIP_REPOSITORY = "https://pip.repos.neuron.amazonaws.com"
# TorchNeuron (the native PyTorch backend) starts at torch-neuronx 2.13 (Neuron 2.33 ships 2.13.3.0 and
# 2.14.3.0); the trace line is torch-neuronx 2.9.x. Both are the distribution `torch-neuronx`.
NATIVE_FROM = (2, 13)
DLAMI_VENV = "/opt/aws_neuronx_venv_pytorch_2_9_nxd_inference"
INSTALL_HINT = (
    f"on a trn2 use the Neuron 2.31 DLAMI's venv (source {DLAMI_VENV}/bin/activate; docs/trn2.md step 1) "
    f"or install the pinned set from the Neuron pip repository: pip install -e '.[neuron]' "
    f"-c constraints-neuron-2.31.txt --extra-index-url {NEURON_PIP_REPOSITORY}"
)


class NeuronSdkMissing(BackendUnavailable):
    """torch-neuronx is absent, is PyPI's placeholder, or does not import."""


class LncMismatch(NeuronRefusal):
    """The artifact's compiled LNC differs from the runtime's; the Neuron runtime would refuse it."""


def sdk_line(version: str | None, has_trace: bool) -> str | None:
    """'trace', 'native' or None for a torch-neuronx of this version (``has_trace``: it has trace())."""
    if not version:
        return None
    try:
        release = Version(version).release
    except InvalidVersion:
        release = ()
    if release[:2] >= NATIVE_FROM:
        return "native"
    return "trace" if has_trace else None


def installed_line() -> str | None:
    """The Neuron line installed here, from torch-neuronx's package metadata (nothing imported): None where
    the distribution is absent or is PyPI's 1.0 placeholder."""
    version = package_version("torch-neuronx")
    return None if version in (None, "1.0") else sdk_line(version, has_trace=True)


def nki_status() -> tuple[bool, str]:
    """(usable, reason). PyPI's ``nki`` 0.0.1 is an empty placeholder and does not count."""
    try:
        import nki
    except ImportError as exc:
        return False, f"nki is not installed ({exc})"
    try:
        importlib.import_module("nki.isa")
        importlib.import_module("nki.language")
    except ImportError as exc:
        version = getattr(nki, "__version__", "unknown")
        return False, f"nki {version} has no nki.language/nki.isa (the PyPI placeholder?): {exc}"
    if not hasattr(nki, "jit"):
        return False, "nki has no nki.jit; need NKI 0.2+ (Neuron SDK 2.27+)"
    return True, f"nki {getattr(nki, '__version__', 'unknown')}"


def require_torch_neuronx() -> ModuleType:
    """Import torch_neuronx, or raise NeuronSdkMissing with one line naming what to install."""
    try:
        module = importlib.import_module("torch_neuronx")
    except ImportError as exc:
        if "WRONG PACKAGE" in str(exc) or package_version("torch-neuronx") == "1.0":
            raise NeuronSdkMissing(
                "the neuron backend needs the AWS Neuron SDK, but the torch-neuronx installed here is "
                f"PyPI's empty placeholder (pip uninstall torch-neuronx, then {INSTALL_HINT})"
            ) from None
        raise NeuronSdkMissing(
            f"the neuron backend needs the AWS Neuron SDK (torch-neuronx, neuronx-cc), which is not "
            f"installed here ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from None
    except Exception as exc:  # broad on purpose: a broken SDK install raises anything at import
        raise NeuronSdkMissing(
            f"torch-neuronx is installed but does not import ({type(exc).__name__}: {exc}); "
            f"reinstall it: {INSTALL_HINT}"
        ) from None
    if not hasattr(module, "trace"):
        raise NeuronSdkMissing(
            f"the torch_neuronx imported from {getattr(module, '__file__', '?')} has no trace(): "
            f"not the Neuron SDK; {INSTALL_HINT}"
        )
    return module


def sdk_versions(torch_neuronx: ModuleType | None = None) -> dict[str, str | None]:
    """Versions that decide what a compiled artifact is; all go into its cache key."""
    import torch

    neuronx = package_version("torch-neuronx")
    if torch_neuronx is not None and (neuronx is None or neuronx == "1.0"):
        # Not installed as a distribution (a source checkout, or the tests' double): ask the module.
        neuronx = str(getattr(torch_neuronx, "__version__", "unknown"))
    return {
        "torch": torch.__version__,
        "torch_neuronx": neuronx,
        "neuronx_cc": package_version("neuronx-cc"),
        "open_clip": package_version("open_clip_torch"),
    }


def runtime_lnc(env: Mapping[str, str] | None = None, target: str = "trn2") -> tuple[int, bool]:
    """(the LNC the Neuron runtime will use, whether NEURON_LOGICAL_NC_CONFIG set it explicitly)."""
    try:
        return lnc_setting(env, target)
    except InvalidLnc as exc:
        raise LncMismatch(str(exc)) from None


def check_lnc(artifact_lnc: int, artifact: str, env: Mapping[str, str] | None = None,
              target: str = "trn2") -> int:
    """Raise LncMismatch naming both values and the fix unless the runtime LNC equals the artifact's."""
    lnc, explicit = runtime_lnc(env, target)
    if lnc == artifact_lnc:
        return lnc
    how = f"{LNC_ENV}={lnc}" if explicit else f"{LNC_ENV} unset, so the {target} default LNC={lnc}"
    raise LncMismatch(
        f"artifact {artifact} was compiled for LNC={artifact_lnc} (--lnc {artifact_lnc}) but the Neuron "
        f"runtime here runs LNC={lnc} ({how}); it would refuse to load it (\"Cannot run Neff ... with "
        f"Logical Core Size of {artifact_lnc}\"). Fix: export {LNC_ENV}={artifact_lnc} before `ray start` / "
        f"`siglip-serve run` (trn2.3xlarge: LNC=2 -> 4 logical cores, LNC=1 -> 8), or compile for this "
        f"runtime: siglip-serve compile --lnc {lnc}"
    )
