"""A test double of `torch_neuronx`, for machines without the Neuron SDK.

`trace(func, example_inputs, compiler_args=..., compiler_workdir=...)` is `torch.jit.trace` on the
CPU. It records every call (in `CALLS`, and as a JSON line in the file named by
$TORCH_NEURONX_DOUBLE_LOG, so calls made in other processes can be checked too).

What it proves: our code calls `torch_neuronx.trace` once per bucket with the uint8 example of that
bucket's shape and exactly the compiler arguments we meant, saves and reloads the result with
`torch.jit.save`/`torch.jit.load`, and serves it end to end.

It also records the caller's grad mode (`grad_enabled`, `inference_mode`); it does not fail
under inference mode as the real trace does, so a test must check the recorded mode.

What it does NOT prove: that neuronx-cc accepts these arguments or compiles this graph (no
compiler runs), that a NEFF is produced or loads (no NEFF exists), bf16 auto-cast numerics (this
runs float32), compile times, or placement on a NeuronCore (no Neuron runtime: NEURON_RT_VISIBLE_CORES
and NEURON_LOGICAL_NC_CONFIG are only read by our own code). Tests marked `neuron` do that on a trn2.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

__version__ = "0.0.0+test-double"

CALLS: list[dict[str, Any]] = []


def trace(func: torch.nn.Module, example_inputs: torch.Tensor, *_: Any, compiler_args: Any = None,
          compiler_workdir: str | None = None, **kwargs: Any) -> torch.jit.ScriptModule:
    call = {
        "compiler_args": list(compiler_args) if isinstance(compiler_args, (list, tuple)) else compiler_args,
        "input_shape": list(example_inputs.shape),
        "input_dtype": str(example_inputs.dtype),
        "compiler_workdir": compiler_workdir,
        "lnc_env": os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
        "kwargs": sorted(kwargs),
        # The grad mode the caller traced under: the real trace fails under inference_mode (XLA
        # tensors are not inference tensors), so the double records it for the tests to check.
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
    }
    CALLS.append(call)
    log_path = os.environ.get("TORCH_NEURONX_DOUBLE_LOG")
    if log_path:
        with open(log_path, "a") as f:
            f.write(json.dumps(call) + "\n")
    with torch.no_grad():
        return torch.jit.trace(func, example_inputs)
