"""The seam between the neuron-native backend and TorchNeuron, the compile-and-warm loop both the
compile command and a replica run, and the artifact's manifest.

`NativeRuntime` is everything the backend asks of the SDK: how to compile (a `torch.compile`
backend), where the device is, how tensors move, which compiled graphs the NEFF cache holds.
`TorchNeuronRuntime` is the real one; tests/doubles/torchneuron_runtime.py runs the real
`torch.compile` on the CPU with a recording backend in its place.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from siglip_serve.models.neuron.env import NEFF_DIR, TorchNeuronRefusal, check_native_sdk, installed_versions
from siglip_serve.models.neuron.manifest import MANIFEST_NAME, ArtifactManifest

log = logging.getLogger(__name__)

LINE = "neuron-native"
WEIGHTS_NAME = "weights.pt"
TEXT_WEIGHTS_NAME = "text-weights.pt"
# Graphs this process compiled through compile_buckets: two encoders of one model (an accuracy run
# with neuron-native on both sides) are entries of the same code object, and Dynamo's recompile
# limit counts them all.
_graphs_in_process = 0


class NativeRuntime(Protocol):
    name: str

    @property
    def compile_backend(self) -> str | Callable[..., Any]: ...

    @property
    def device(self) -> torch.device: ...

    def check_sdk(self) -> None:
        """Raise TorchNeuronRefusal unless this runtime's SDK is present and is the native line."""

    def versions(self) -> dict[str, str | None]: ...

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def synchronize(self) -> None:
        """Wait until the device has run everything queued on it."""

    def graph_files(self, neff_dir: Path) -> dict[str, int]:
        """Compiled graphs the persistent NEFF cache in `neff_dir` holds: relative path -> bytes."""


def neff_files(neff_dir: Path) -> dict[str, int]:
    root = Path(neff_dir)
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*.neff") if p.is_file()}


class TorchNeuronRuntime:
    """TorchNeuron: `torch.compile(backend="neuron")` on the `neuron` device (a PrivateUse1 device).

    The persistent cache writes one `<key>.neff` per compiled graph under TORCH_NEURONX_NEFF_CACHE_DIR
    (sharded into two directory levels), keyed by the graph's IR, the compiler arguments and the
    compiler version: the same graph with the same flags is found again after a restart.
    """

    name = "torchneuron"
    compile_backend = "neuron"

    def check_sdk(self) -> None:
        check_native_sdk(self.versions())
        # torch autoloads torch-neuronx; the PrivateUse1 device is then named "neuron".
        if torch._C._get_privateuse1_backend_name() != "neuron":
            import torch_neuronx  # noqa: F401 - registers the device where autoload is off

        if torch._C._get_privateuse1_backend_name() != "neuron":
            raise TorchNeuronRefusal("torch-neuronx is installed but registered no 'neuron' device; check `neuron-ls` "
                                     "and that this is a trn2 with the Neuron driver (docs/torchneuron.md step 1)")

    @property
    def device(self) -> torch.device:
        # With NEURON_RT_VISIBLE_CORES naming one core, the process sees it as device 0.
        return torch.device("neuron", 0)

    def versions(self) -> dict[str, str | None]:
        return installed_versions()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cpu()

    def synchronize(self) -> None:
        # TorchNeuron is a PrivateUse1 device: "code written against torch.accelerator needs no change".
        torch.accelerator.synchronize()

    def graph_files(self, neff_dir: Path) -> dict[str, int]:
        return neff_files(neff_dir)


@dataclass
class BucketCompile:
    bucket: int
    seconds: float
    new_graphs: list[str]


def image_input(image_size: tuple[int, int]) -> Callable[[int], torch.Tensor]:
    """The image tower's example of one bucket: uint8 [bucket, 3, H, W]."""
    return lambda bucket: torch.zeros((bucket, 3, *image_size), dtype=torch.uint8)


def text_input(context_length: int) -> Callable[[int], torch.Tensor]:
    """The text tower's example of one bucket: int64 token ids [bucket, context_length]."""
    return lambda bucket: torch.zeros((bucket, context_length), dtype=torch.int64)


def compile_buckets(model: torch.nn.Module, buckets: Sequence[int], example: Callable[[int], torch.Tensor],
                    runtime: NativeRuntime, neff_dir: Path,
                    progress: Callable[[int, int, int, BucketCompile | None], None] | None = None,
                    ) -> tuple[Any, list[BucketCompile]]:
    """`torch.compile` the model once, then run each bucket's example once: one static graph per bucket.

    Returns the compiled callable and, per bucket, which graph files appeared in the NEFF cache
    while it ran (none when the cache already held it).
    """
    global _graphs_in_process
    _graphs_in_process += len(buckets)
    # dynamic=False gives every bucket its own guarded entry on the same code object; Dynamo's
    # default limit (8) would send bucket 9 and on to eager execution without a word.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _graphs_in_process + 1)
    compiled = torch.compile(model, backend=runtime.compile_backend, fullgraph=True, dynamic=False)
    results = []
    for i, bucket in enumerate(buckets, start=1):
        if progress is not None:
            progress(i, len(buckets), bucket, None)
        before = set(runtime.graph_files(neff_dir))
        began = time.monotonic()
        with torch.no_grad():
            runtime.to_host(compiled(runtime.to_device(example(bucket))))
        new = sorted(set(runtime.graph_files(neff_dir)) - before)
        results.append(BucketCompile(bucket, round(time.monotonic() - began, 3), new))
        if progress is not None:
            progress(i, len(buckets), bucket, results[-1])
    return compiled, results


def run_warm(compiled: Any, runtime: NativeRuntime, batch: torch.Tensor) -> torch.Tensor:
    """One forward pass of a warmed model, where any new shape raises instead of compiling for minutes.

    The stance is scoped to the call, not set for the process (`set_stance` is process-wide): a
    second encoder in this process (the other side of an accuracy run, or the text tower) still
    compiles its own buckets during its warm-up."""
    with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
        return runtime.to_host(compiled(runtime.to_device(batch)))


@dataclass(kw_only=True)
class NativeManifest(ArtifactManifest):
    """TorchNeuron's: the recipe environment, the weights file replicas load, and each bucket's graphs."""

    weights_file: str
    weights_file_sha256: str
    recipe_env: dict[str, str]
    # bucket -> graph files (relative to neff/) its compile wrote into the NEFF cache
    graphs: dict[str, list[str]]
    line: str = LINE

    def recipe_summary(self) -> dict[str, Any]:
        return {"line": self.line, "recipe_env": self.recipe_env}


def read_native_manifest(directory: Path) -> NativeManifest:
    """The manifest of a complete neuron-native artifact, or TorchNeuronRefusal saying what to do."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise TorchNeuronRefusal(f"{directory} holds no {MANIFEST_NAME}: not a neuron-native artifact; build one with "
                                 f"siglip-serve compile --backend neuron-native")
    try:
        data: Mapping[str, Any] = json.loads(path.read_text())
    except ValueError as exc:
        raise TorchNeuronRefusal(f"{path} is not valid JSON ({exc}); compile the artifact again") from None
    if data.get("line") != LINE:
        raise TorchNeuronRefusal(f"{directory} is an artifact of the trace line (--backend neuron), not of "
                                 f"neuron-native; serve it with --backend neuron or compile with "
                                 f"--backend neuron-native")
    try:
        manifest = NativeManifest.from_dict(data)
    except TypeError as exc:
        raise TorchNeuronRefusal(f"{path} lacks fields ({exc}); compile the artifact again") from None
    for weights in (manifest.weights_file, *([manifest.text["weights_file"]] if manifest.text else [])):
        if not (directory / weights).is_file():
            raise TorchNeuronRefusal(f"artifact {directory} lacks its weights file {weights}; compile it again")
    return manifest


def missing_graphs(buckets: Sequence[int], graphs: Mapping[str, list[str]],
                   present: Mapping[str, int]) -> dict[int, list[str]]:
    """Buckets whose compiled graphs are not in the NEFF cache (or that recorded none at all)."""
    missing = {}
    for bucket in buckets:
        files = graphs.get(str(bucket), [])
        absent = [f for f in files if f not in present] or ([] if files else ["<no graph recorded>"])
        if absent:
            missing[bucket] = absent
    return missing


def artifact_neff_dir(directory: Path) -> Path:
    return Path(directory).resolve() / NEFF_DIR
