"""What one replica asks Ray for: one function (`replica_asks`) turns a config into each tower's ask, from its
backend's record (core/backends.py), for the service's plan (serve/plan/planner.py), bulk jobs
(bulk/job.py) and the multi-core bench.

A replica of either tower holds what the record asks (a GPU, a logical NeuronCore, a custom resource)
and CPUs from the config. `neuron_cores_per_replica`, where set, is the image replicas' NeuronCores on
any backend (the tests place CPU replicas on the test cluster's declared cores that way); a text replica
takes it only where its backend itself runs on NeuronCores.
"""

from __future__ import annotations

from dataclasses import dataclass

from siglip_serve.core.backends import BackendRecord, backend_record
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.policy import policy_of
from siglip_serve.serve.plan.service_plan import GPU, ReplicaAsk, image_devices


def declare_hint(resource: str) -> str:
    """How a Ray node declares `resource` (GPUs: a count of its own; anything else: a custom resource)."""
    return "--num-gpus N" if resource == GPU else f"--resources='{{\"{resource}\": N}}'"


@dataclass(frozen=True)
class ReplicaAsks:
    backend: BackendRecord
    image: ReplicaAsk
    text: ReplicaAsk

    @property
    def device_resource(self) -> str | None:
        """The device resource an image replica holds: what `replicas: auto` and a bulk job count."""
        return self.image.device_resource

    @property
    def host_cores(self) -> bool:
        """The model's forward passes run on the host's cores (torch threads split them; CPU plan)."""
        return self.backend.host_cores

    def image_replicas_on(self, have: float, text_replicas: int = 0) -> int:
        """Image replicas that `have` of the image replica's device holds beside `text_replicas`."""
        device = self.device_resource
        if device is None:
            return 0
        left = have - text_replicas * self.text.devices.get(device, 0)
        return int((left + 1e-9) // self.image.devices[device])

    def pin(self, index: int) -> dict[str, str]:
        """The environment of a process started by hand as worker `index` (the multi-core bench): its
        one device, as Ray would set it for a replica (empty where the backend names no devices)."""
        variable = self.backend.visible_devices_env
        return {variable: str(index)} if variable else {}


def replica_asks(config: ServiceConfig | ModelSettings) -> ReplicaAsks:
    """The one placement rule. A bare ModelSettings (the multi-core bench) plans with the service's defaults."""
    if not isinstance(config, ServiceConfig):
        config = ServiceConfig(**{name: getattr(config, name) for name in type(config).model_fields})
    record = backend_record(config.backend)
    image = image_devices(record.resources, config.neuron_cores_per_replica)
    text = {resource: image[resource] for resource in record.resources if resource in image}
    return ReplicaAsks(record, ReplicaAsk(num_cpus=config.encoder_num_cpus, devices=image),
                       ReplicaAsk(num_cpus=config.text_num_cpus, devices=text))


def auto_device(config: ServiceConfig) -> str | None:
    """The device resource `replicas: auto` counts in the Ray cluster (what each image replica holds), or None
    where the count is named or counts the host's cores: only such a plan needs the cluster's resources."""
    device = replica_asks(config).device_resource
    return device if policy_of(config).replica_setting == "auto" else None
