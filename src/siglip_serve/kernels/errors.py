"""The kernel tools' user-facing errors: `siglip-serve kernels` prints them as one `error:` line.

They keep their builtin bases (ValueError, RuntimeError) for library callers; anything else a
command raises is a bug and keeps its traceback.
"""

from __future__ import annotations

from siglip_serve.core.errors import UserError


class KernelInputError(UserError, ValueError):
    """A shape, config or option the kernels cannot run (not MxKxN, not a multiple of 128, ...)."""


class KernelUnavailable(UserError, RuntimeError):
    """What a benchmark needs (a NeuronCore, the real nki, a profiler) is not here, or its run failed."""


class DeviceUnavailableError(KernelUnavailable):
    """The requested device (neuron or cuda) cannot be used on this machine."""
