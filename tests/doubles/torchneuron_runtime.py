"""A test double of the TorchNeuron runtime (siglip_serve.models.neuron.runtime.NativeRuntime) for machines
without Trainium.

It keeps the real seam's signatures and runs the REAL `torch.compile` (Dynamo, guards, fullgraph,
dynamic=False, recompiles, `set_stance`) on the CPU. Its compile backend is a recording function
that stands in for TorchNeuron's persistent NEFF cache: it keys each graph by its code, input
shapes/dtypes and the recipe environment (NEURON_CC_FLAGS, NEURON_COMPILER_OPT_LEVEL,
NEURON_LOGICAL_NC_CONFIG), looks for `<key>.neff` under TORCH_NEURONX_NEFF_CACHE_DIR (two shard
levels, like the real cache), records a compile and writes the file on a miss, records a hit
otherwise, and returns `gm.forward` (eager CPU execution of the captured graph).

What it proves: our code compiles the whole model as one graph per bucket with fullgraph and static
shapes, finds those graphs again after a restart without compiling, refuses to start on each wrong
input, and forbids recompiles after warm-up.

What it does NOT prove: that TorchNeuron lowers this graph (StableHLO, neuronx-cc), that the flags
reach neuronx-cc or that later flags override its defaults, TorchNeuron's real cache key and layout,
bf16 auto-cast numerics (this runs float32), the `neuron` device, NeuronCore placement or LNC in the
runtime, compile times, or throughput, nor that `synchronize` waits for anything (CPU work is done when
its call returns; the double counts the calls) or that an NKI kernel runs eagerly on the `neuron` device
(the kernel tests call the fake NKI with its CPU tensors). tests/device/test_neuron_native_trn2.py and
tests/device/test_kernels_neuron.py do those on a trn2.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from siglip_serve.models.neuron.env import (
    CC_FLAGS_ENV,
    LNC_ENV,
    NEFF_CACHE_ENV,
    NEURONX_CC_VERSION,
    OPT_LEVEL_ENV,
    TORCH_VERSION,
    check_native_sdk,
)
from siglip_serve.models.neuron.runtime import neff_files

# The versions the double reports as its SDK: the exact torch TorchNeuron is built for (this venv's
# own torch may be another 2.14 patch; the double runs on it all the same).
DOUBLE_VERSIONS = {"torch": TORCH_VERSION, "torch_neuronx": "2.14.3.0.0+recording-double",
                   "neuronx_cc": NEURONX_CC_VERSION}


@dataclass
class RecordingRuntime:
    """The seam's double. `compiles` and `hits` list (input shapes, cache file) per backend call."""

    sdk_versions: dict[str, str | None] = field(default_factory=lambda: dict(DOUBLE_VERSIONS))
    compiles: list[dict[str, Any]] = field(default_factory=list)
    hits: list[dict[str, Any]] = field(default_factory=list)
    syncs: int = 0
    name: str = "recording-double"

    def check_sdk(self) -> None:
        check_native_sdk(self.sdk_versions)

    def versions(self) -> dict[str, str | None]:
        return dict(self.sdk_versions)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def synchronize(self) -> None:
        self.syncs += 1  # eager CPU work is done when its call returns: nothing to wait for

    def graph_files(self, neff_dir: Path) -> dict[str, int]:
        return neff_files(neff_dir)

    @property
    def compile_backend(self) -> Any:
        def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
            recipe = "|".join(os.environ.get(k, "") for k in (CC_FLAGS_ENV, OPT_LEVEL_ENV, LNC_ENV))
            signature = f"{gm.code}|{[(list(t.shape), str(t.dtype)) for t in tensors]}|{recipe}"
            key = hashlib.sha256(signature.encode()).hexdigest()
            cache = Path(os.environ[NEFF_CACHE_ENV])
            path = cache / key[:2] / key[2:4] / f"{key}.neff"
            # The images are the graph's one uint8 input, token ids its int64 one (parameters may be
            # lifted to inputs too).
            images = [list(t.shape) for t in tensors if t.dtype == torch.uint8]
            ids = [list(t.shape) for t in tensors if t.dtype == torch.int64]
            record = {"image_shapes": images, "id_shapes": ids, "file": str(path.relative_to(cache)), "graph": gm}
            if path.is_file():
                self.hits.append(record)
            else:
                self.compiles.append(record)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"recorded graph " + key.encode())
            return gm.forward

        return recording_backend
