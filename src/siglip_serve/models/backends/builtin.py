"""The built-in backends' records, the one list of their names (the CLI's --backend choices, the
settings' validation, the registry). A new backend adds its record here and its module beside this
one; nothing else names it. Each implementation lives in models/backends/<name with _ for ->.py.
"""

from __future__ import annotations

from siglip_serve.core.constants import CUDA_VISIBLE_DEVICES_ENV, NEURON_CORES, VISIBLE_CORES_ENV
from siglip_serve.models.backends.record import IMAGE, BackendRecord

_MODULE = "siglip_serve.models.backends"
# Answers zero vectors without running any model: what the host side alone can serve. Never a default.
NO_MODEL_BACKEND = "zeros-no-model"

BUILTIN: tuple[BackendRecord, ...] = (
    # float32 on the host's cores (CPUs here have no bf16 units); torchvision decodes on the CPU device.
    BackendRecord("cpu", device="cpu", implementation=f"{_MODULE}.cpu:IMPLEMENTATION", host_cores=True,
                  device_decode=True),
    # One GPU per replica of either tower; nvJPEG decode; static shapes once CUDA graphs are captured.
    BackendRecord("cuda", device="cuda", implementation=f"{_MODULE}.cuda:IMPLEMENTATION", ray_resource="GPU",
                  per_replica=1, visible_devices_env=CUDA_VISIBLE_DEVICES_ENV, graphs_setting="cuda_graphs",
                  device_decode=True, settings=("cuda_dtype", "cuda_graphs")),
    # The trace line (torch-neuronx 2.9): one TorchScript per bucket, one logical NeuronCore per replica.
    BackendRecord("neuron", device="neuron", implementation=f"{_MODULE}.neuron:IMPLEMENTATION",
                  ray_resource=NEURON_CORES, per_replica=1, visible_devices_env=VISIBLE_CORES_ENV,
                  static_shapes=True, settings=("artifact_dir",), reads_artifact=True),
    # TorchNeuron (2.33+): torch.compile graphs from the artifact's NEFF cache, one core per replica.
    BackendRecord("neuron-native", device="neuron", implementation=f"{_MODULE}.neuron_native:IMPLEMENTATION",
                  ray_resource=NEURON_CORES, per_replica=1, visible_devices_env=VISIBLE_CORES_ENV,
                  static_shapes=True, settings=("artifact_dir",), reads_artifact=True,
                  replica_env="siglip_serve.models.neuron.env:replica_environment"),
    # NOT A MODEL: the host ceiling (models/backends/zeros_no_model.py).
    BackendRecord(NO_MODEL_BACKEND, device="none", implementation=f"{_MODULE}.zeros_no_model:IMPLEMENTATION",
                  towers=(IMAGE,), runs_model=False),
)
BACKENDS: tuple[str, ...] = tuple(record.name for record in BUILTIN)
