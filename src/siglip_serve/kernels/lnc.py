"""The one LNC the kernels use: the Neuron runtime's, read through ``siglip_serve.models.neuron.sdk.runtime_lnc``.

The Neuron docs (NKI "Using Logical NeuronCores", SDK 2.33; compiler error NCC_EVRF066) say an
NKI kernel compiled into a graph must use the graph's LNC degree, and the runtime refuses a NEFF
whose LNC differs from ``NEURON_LOGICAL_NC_CONFIG``. So every kernel launch, every traced graph
and every roofline here uses the runtime's LNC; a different ``--lnc`` on a NeuronCore is an error,
not a silent second setting. ``siglip_serve.models.neuron.sdk`` imports torch, hence the lazy imports.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable


class KernelLncError(KernelUnavailable):
    """A kernel or benchmark was asked to run at an LNC the Neuron runtime here does not use."""


def _how(explicit: bool, lnc: int) -> str:
    from siglip_serve.models.neuron.sdk import LNC_ENV

    return f"{LNC_ENV}={lnc}" if explicit else f"{LNC_ENV} unset, so the trn2 default LNC={lnc}"


def runtime_kernel_lnc(env: Mapping[str, str] | None = None) -> int:
    """The LNC the runtime will launch kernels at (1 or 2); an invalid setting raises LncMismatch."""
    from siglip_serve.models.neuron.sdk import runtime_lnc

    return runtime_lnc(env)[0]


def resolve_lnc(requested: int | None, on_neuron: bool, env: Mapping[str, str] | None = None) -> int:
    """``--lnc`` if given, else the runtime's. On a NeuronCore the two must agree.

    Off Neuron (cpu/cuda) ``--lnc`` only chooses the trn2 roofline the numbers are compared with.
    """
    from siglip_serve.models.neuron.sdk import LNC_ENV, VALID_LNC, runtime_lnc

    lnc, explicit = runtime_lnc(env)
    if requested is None:
        return lnc
    if requested not in VALID_LNC:
        raise KernelInputError(f"--lnc must be one of {VALID_LNC}, got {requested}")
    if on_neuron and requested != lnc:
        raise KernelLncError(
            f"--lnc {requested} differs from the Neuron runtime's LNC={lnc} ({_how(explicit, lnc)}); kernels "
            f"and graphs must use the runtime's LNC. Fix: export {LNC_ENV}={requested}, or drop --lnc"
        )
    return requested


def require_kernel_lnc(kernel: str, supported: tuple[int, ...], lnc: int,
                       env: Mapping[str, str] | None = None) -> None:
    """Raise KernelLncError naming the fix when ``kernel`` cannot launch at ``lnc``."""
    if lnc in supported:
        return
    from siglip_serve.models.neuron.sdk import LNC_ENV, runtime_lnc

    runtime, explicit = runtime_lnc(env)
    where = _how(explicit, runtime) if lnc == runtime else f"requested LNC={lnc}"
    wanted = " or ".join(str(v) for v in supported)
    raise KernelLncError(
        f"kernel {kernel} runs only at LNC={wanted}, but it would launch at LNC={lnc} ({where}). "
        f"Fix: export {LNC_ENV}={supported[0]} before running it"
    )


def pin_launch_lnc(lnc: int, env: MutableMapping[str, str] | None = None, on_device: bool = True) -> None:
    """Set NEURON_LOGICAL_NC_CONFIG to the LNC a kernel launches at, before the first launch.

    NKI 0.7's ``nki.jit`` (SDK 2.33.1) takes the kernel's LNC from this variable and, unset, uses LNC=1,
    while the trn2 runtime and neuronx-cc default to 2 (compiler error NCC_EVRF066: "Kernel implicitly
    defaults to LNC=1; neuronx-cc defaults to LNC=2 on Trn2"). A different value already set is the
    runtime's and was refused earlier (kernels/lnc.py resolve_lnc); here it is refused again, not changed.
    The CPU simulator has no runtime: there each launch sets the LNC it runs at (``on_device=False``).
    """
    from siglip_serve.models.neuron.sdk import LNC_ENV

    env = os.environ if env is None else env
    current = (env.get(LNC_ENV) or "").strip()
    if not current or not on_device:
        env[LNC_ENV] = str(lnc)
    elif current != str(lnc):
        raise KernelLncError(f"a kernel would launch at LNC={lnc} but {LNC_ENV}={current}; "
                             f"export {LNC_ENV}={lnc} or run at LNC={current}")


def launch_grid(lnc: int) -> int | None:
    """The launch grid a kernel at ``lnc`` gets: ``kernel[lnc]`` whenever LNC > 1, on every NKI version and in
    ``nki.simulate``; None (the plain call) at LNC=1.

    NKI 0.5 (SDK 2.31) takes the LNC only from the grid ("The default is LNC=1"). NKI 0.7's ``nki.jit`` reads
    NEURON_LOGICAL_NC_CONFIG, but the SPMD-grid notice (announce-intent-eos-nki-spmd-launch-grid) says that
    "kernels that continue to pass a matching SPMD grid will keep working", and the CPU simulator's docs
    describe LNC2 only as ``nki.simulate(kernel[2])``: a grid that matches the environment is right on both,
    a missing one may run an LNC=2 row as one program. ``pin_launch_lnc`` sets the environment beside it.
    """
    return lnc if lnc > 1 else None
