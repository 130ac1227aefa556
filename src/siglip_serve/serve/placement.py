"""Where every replica goes and what it asks Ray for: one function (`plan`) turns a config into a Plan,
from its backend's record (models/backends/record.py), for the service (serve/tower_replica.py,
serve/cluster_fit.py, serve/app.py), bulk jobs (bulk/job.py), the bench and the multi-core bench.

A replica of either tower holds what the record asks (a GPU, a logical NeuronCore, a custom resource)
and CPUs from the config. `neuron_cores_per_replica`, where set, is the image replicas' NeuronCores on
any backend (the tests place CPU replicas on the test cluster's declared cores that way); a text replica
takes it only where its backend itself runs on NeuronCores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from siglip_serve.core.backends import BackendRecord, backend_record
from siglip_serve.core.constants import NEURON_CORES
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.config import ServiceConfig

GPU = "GPU"


def declare_hint(resource: str) -> str:
    """How a Ray node declares `resource` (GPUs: a count of its own; anything else: a custom resource)."""
    return "--num-gpus N" if resource == GPU else f"--resources='{{\"{resource}\": N}}'"


@dataclass(frozen=True)
class ReplicaAsk:
    """What one replica (or bulk actor) asks Ray for: CPUs and its backend's device resources."""

    num_cpus: float
    devices: Mapping[str, float] = field(default_factory=dict)

    def actor_options(self) -> dict[str, Any]:
        # Ray takes GPUs as num_gpus and refuses "GPU" or "CPU" inside `resources`
        # (ray/_common/ray_option_utils.py, _validate_resources).
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if GPU in self.devices:
            options["num_gpus"] = self.devices[GPU]
        if others := {k: v for k, v in self.devices.items() if k != GPU}:
            options["resources"] = others
        return options


@dataclass(frozen=True)
class Plan:
    backend: BackendRecord
    image: ReplicaAsk
    text: ReplicaAsk

    @property
    def device(self) -> str | None:
        """The device resource an image replica holds: what a bulk job counts its encoders in."""
        return next(iter(self.image.devices), None)

    @property
    def host_cores(self) -> bool:
        """The model's forward passes run on the host's cores (torch threads split them; CPU plan)."""
        return self.backend.host_cores

    def image_replicas_on(self, have: float, text_replicas: int = 0) -> int:
        """Image replicas that `have` of the image replica's device holds beside `text_replicas`."""
        if self.device is None:
            return 0
        left = have - text_replicas * self.text.devices.get(self.device, 0)
        return int((left + 1e-9) // self.image.devices[self.device])

    def pin(self, index: int) -> dict[str, str]:
        """The environment of a process started by hand as worker `index` (the multi-core bench): its
        one device, as Ray would set it for a replica (empty where the backend names no devices)."""
        variable = self.backend.visible_devices_env
        return {variable: str(index)} if variable else {}


def _positive(devices: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in devices.items() if v}


def plan(config: ServiceConfig | ModelSettings) -> Plan:
    """The one placement rule. A bare ModelSettings (the multi-core bench) plans with the service's defaults."""
    if not isinstance(config, ServiceConfig):
        config = ServiceConfig(**{name: getattr(config, name) for name in type(config).model_fields})
    record = backend_record(config.backend)
    image = dict(record.resources)
    if config.neuron_cores_per_replica is not None:
        image[NEURON_CORES] = config.neuron_cores_per_replica
    text = {resource: image[resource] for resource in record.resources}
    return Plan(record, ReplicaAsk(config.encoder_num_cpus, _positive(image)),
                ReplicaAsk(config.text_num_cpus, _positive(text)))
