"""What a backend is, torch-free: a record of the platform's facts, which every caller asks instead of
its name; the built-in records, the one list of their names (the CLI's --backend choices, the settings'
validation); and the lookup by name, backends registered at run time included. The towers and checks a
backend's module provides live beside that module (models/backends/implementation.py).

Modelled on vLLM's platforms (vllm/platforms/interface.py `Platform`: `ray_device_key`, the Ray
resource a worker holds, and `device_control_env_var`, the variable that names its devices; the
built-in ones listed by qualified name in vllm/platforms/__init__.py and resolved lazily) and on
Triton's `instance_group` (a kind of device and a count of instances per device,
docs/user_guide/model_configuration.md, "Instance Groups"). The config, the placement plan and the
command lines read records without loading a model.

A backend registered at run time (`register`, e.g. by a test) travels to the app's other processes in
EXTRA_BACKENDS_ENV (`extra_backends_env`), which each process reads when it meets a name it lacks.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

from siglip_serve.core.constants import (
    CUDA_VISIBLE_DEVICES_ENV,
    EXTRA_BACKENDS_ENV,
    NEURON_CORES,
    VISIBLE_CORES_ENV,
)

IMAGE = "image"
TEXT = "text"
# Answers zero vectors without running any model: what the host side alone can serve. Never a default.
NO_MODEL_BACKEND = "zeros-no-model"


@dataclass(frozen=True)
class BackendRecord:
    """One backend's facts. A replica of either tower holds `per_replica` of `ray_resource`.

    Its import strings ("module:attribute") are imported where they are used, never here: a module
    written with a leading dot (".cpu") is relative to the package that builds the towers,
    siglip_serve.models.backends, which resolves it (core names no module above it); a backend
    registered at run time writes the absolute module.
    """

    name: str
    # What torch calls the device the model runs on ("cpu", "cuda", "neuron"); "none": no model runs.
    device: str
    # Its Implementation (it imports torch and SDKs): imported on first use.
    implementation: str
    # Its Implementation has checks to run before any Ray process starts (check_available, check_tower).
    # False: none, so `siglip-serve run` checks it without importing torch, which would delay the start.
    preflight: bool = True
    # The Ray resource one replica holds (vLLM's ray_device_key; Ray's accelerator managers'
    # get_resource_name: "GPU", "neuron_cores"), and how much of it. None: it asks Ray for CPUs only.
    ray_resource: str | None = None
    per_replica: float = 0.0
    # The variable Ray sets to the devices a replica holds (vLLM's device_control_env_var; Ray's
    # get_visible_accelerator_ids_env_var); a process pinned by hand (the multi-core bench) sets it.
    visible_devices_env: str | None = None
    # The model's forward passes run on the host's cores, beside HTTP and decoding (threads, CPU plan).
    host_cores: bool = False
    # The ModelSettings flag that captures one CUDA graph per bucket (its runner then pads every chunk
    # to a bucket); None where it captures none.
    graphs_setting: str | None = None
    # It can decode JPEGs on its device inside the replica (`device_jpeg_decode`).
    device_decode: bool = False
    # The towers it builds.
    towers: tuple[str, ...] = (IMAGE, TEXT)
    # False: no model runs and no weights are read (zeros-no-model, the host ceiling).
    runs_model: bool = True
    # Its replicas load the model from a compiled artifact (artifact_dir), which holds the weights: none
    # are read or fetched for it (ModelSettings.needs_weights), on any node.
    reads_artifact: bool = False
    # A torch-free function: (ModelSettings) -> the environment its replica sets on itself before it
    # imports torch (neuron-native: the artifact's recipe). Called where the replica runs, since only
    # that node may see the artifact (serve/towers/replica_start.py).
    replica_env: str | None = None
    # The ModelSettings fields that are its own (shown beside its results, e.g. accuracy's sides).
    settings: tuple[str, ...] = ()
    # A pydantic model of its own options (ModelSettings.backend_options), declared by its module and
    # importable without torch: the config validates against it on any node.
    backend_options: str | None = None

    def builds(self, tower: str) -> bool:
        return tower in self.towers

    @property
    def resources(self) -> dict[str, float]:
        """The device resources one replica asks Ray for: {} where it runs on CPUs alone."""
        return {self.ray_resource: self.per_replica} if self.ray_resource and self.per_replica else {}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackendRecord:
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**values)


# A new backend adds its row here and its module in models/backends/; nothing else names it.
BUILTIN: tuple[BackendRecord, ...] = (
    # float32 on the host's cores (CPUs here have no bf16 units); torchvision decodes on the CPU device.
    BackendRecord("cpu", device="cpu", implementation=".cpu:IMPLEMENTATION", preflight=False, host_cores=True,
                  device_decode=True),
    # One GPU per replica of either tower; nvJPEG decode; static shapes once CUDA graphs are captured.
    BackendRecord("cuda", device="cuda", implementation=".cuda:IMPLEMENTATION", ray_resource="GPU",
                  per_replica=1, visible_devices_env=CUDA_VISIBLE_DEVICES_ENV, graphs_setting="cuda_graphs",
                  device_decode=True, settings=("cuda_dtype", "cuda_graphs")),
    # The trace line (torch-neuronx 2.9): one TorchScript per bucket, one logical NeuronCore per replica.
    BackendRecord("neuron", device="neuron", implementation=".neuron:IMPLEMENTATION",
                  ray_resource=NEURON_CORES, per_replica=1, visible_devices_env=VISIBLE_CORES_ENV,
                  settings=("artifact_dir",), reads_artifact=True),
    # TorchNeuron (2.33+): torch.compile graphs from the artifact's NEFF cache, one core per replica.
    BackendRecord("neuron-native", device="neuron", implementation=".neuron_native:IMPLEMENTATION",
                  ray_resource=NEURON_CORES, per_replica=1, visible_devices_env=VISIBLE_CORES_ENV,
                  settings=("artifact_dir",), reads_artifact=True,
                  replica_env="..neuron.env:replica_environment"),
    # NOT A MODEL: the host ceiling (models/backends/zeros_no_model.py).
    BackendRecord(NO_MODEL_BACKEND, device="none", implementation=".zeros_no_model:IMPLEMENTATION",
                  preflight=False, towers=(IMAGE,), runs_model=False),
)
BACKENDS: tuple[str, ...] = tuple(record.name for record in BUILTIN)

_BUILTIN = {record.name: record for record in BUILTIN}
_EXTRA: dict[str, BackendRecord] = {}


def register(record: BackendRecord) -> None:
    """Add a backend beside the built-in ones (its implementation named by `record.implementation`)."""
    if record.name in _BUILTIN:
        raise ValueError(f"backend {record.name!r} is built in")
    _EXTRA[record.name] = record


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)


@contextmanager
def registered(record: BackendRecord) -> Iterator[BackendRecord]:
    register(record)
    try:
        yield record
    finally:
        unregister(record.name)


def _from_environment(name: str) -> BackendRecord | None:
    for data in json.loads(os.environ.get(EXTRA_BACKENDS_ENV) or "[]"):
        if data.get("name") == name:
            _EXTRA[name] = BackendRecord.from_dict(data)
            return _EXTRA[name]
    return None


def names() -> tuple[str, ...]:
    return BACKENDS + tuple(sorted(_EXTRA))


def backend_record(name: str) -> BackendRecord:
    record = _BUILTIN.get(name) or _EXTRA.get(name) or _from_environment(name)
    if record is None:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(names())}")
    return record


def extra_backends_env() -> dict[str, str]:
    """What every process of an app needs to find the backends registered here (none: {})."""
    return {EXTRA_BACKENDS_ENV: json.dumps([r.as_dict() for r in _EXTRA.values()])} if _EXTRA else {}


# What a record's relative "module:attribute" is relative to: the backends' package (one leading dot), or,
# with two, models. A name, not an import: core imports nothing above it.
RECORD_PACKAGE = "siglip_serve.models.backends"


def load(spec: str) -> Any:
    """A record's "module:attribute", imported: a module written with a leading dot is one of the backends'
    package (RECORD_PACKAGE; with two, of models), as the built-in records write theirs."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module, package=RECORD_PACKAGE), attribute)
