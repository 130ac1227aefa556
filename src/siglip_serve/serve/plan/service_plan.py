"""The service's plan: what a configuration becomes once, before anything is built, as data.

serve/plan/planner.py makes it (`plan_service`); the application (serve/app.py), the cluster check
(serve/plan/cluster_fit.py), the replicas, the ingress's front door and tower links, `siglip-serve run` (its
Ray's size) and the benchmarks read its fields, and `siglip-serve run --print-plan` shows it as JSON.
Each deployment's part is named as Serve names it (Ray Serve's `DeploymentSchema`, ray/serve/schema.py):
a count or an autoscaling config, `ray_actor_options` (resources and runtime_env), `max_ongoing_requests`,
graceful timeouts; beside it what Serve does not take: torch threads, readiness floors, the front door's
limits, and what each deployment's replicas read instead of the config (serve/plan/replica_slices.py). Models are
a list, one per served model. Torch-free: the ingress reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from siglip_serve.core.constants import NEURON_CORES
from siglip_serve.core.front_door import FrontDoorLimits
from siglip_serve.serve.plan.replica_slices import FrontSettings, ModelFront, PlanRecord, TowerRun

GPU = "GPU"
# Among a model's tower handles (serve/app.py to the ingress): the image replica kept for the interactive lane.
KEPT_IMAGE = "image:interactive"


def model_app_name(front: str, name: str) -> str:
    """The Serve application of model `name`'s towers under `model_apps`, beside the front application `front`."""
    return f"{front}-{name}"


def image_devices(backend_resources: Mapping[str, float], neuron_cores_per_replica: int | None) -> dict[str, float]:
    """The device resources one image replica holds: its backend's (the record's resources), with
    `neuron_cores_per_replica`, where set, as its NeuronCores on any backend (the tests place cpu
    replicas on a cluster's declared cores that way; 0 holds none)."""
    devices = dict(backend_resources)
    if neuron_cores_per_replica is not None:
        devices[NEURON_CORES] = neuron_cores_per_replica
    return {name: amount for name, amount in devices.items() if amount}


class ReplicaAsk(PlanRecord):
    """What one replica (or bulk actor) asks Ray for: CPUs and its backend's device resources."""

    num_cpus: float
    devices: dict[str, float] = Field(default_factory=dict)

    @property
    def device_resource(self) -> str | None:
        """The device resource it holds (what `replicas: auto` counts), or None on CPUs alone."""
        return next(iter(self.devices), None)

    def actor_options(self) -> dict[str, Any]:
        # Ray takes GPUs as num_gpus and refuses "GPU" or "CPU" inside `resources`
        # (ray/_common/ray_option_utils.py, _validate_resources).
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if GPU in self.devices:
            options["num_gpus"] = self.devices[GPU]
        if others := {k: v for k, v in self.devices.items() if k != GPU}:
            options["resources"] = others
        return options


class DeploymentPlan(PlanRecord):
    """What `serve.deployment` takes for one deployment: a count or `autoscaling_config`, never both."""

    name: str
    num_replicas: int | None = None
    autoscaling_config: dict[str, Any] | None = None
    ray_actor_options: dict[str, Any]
    max_ongoing_requests: int
    max_queued_requests: int | None = None
    graceful_shutdown_timeout_s: float | None = None
    health_check_period_s: float | None = None
    max_surge_percent: int | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments of `serve.deployment`; what is unset stays Serve's default."""
        return self.model_dump(exclude_none=True)


class TowerPlan(PlanRecord):
    """One tower's deployment (image or text) and what its replicas and the ingress's link read."""

    tower: str
    served_as: str  # the served model's name (what requests' `model` names), which its replicas publish
    deployment: DeploymentPlan
    ask: ReplicaAsk
    replicas: int  # the most it runs (autoscaled: max_replicas): what the ingress admits and coalesces for
    min_replicas: int  # the fewest (a fixed count: all of them)
    min_ready: int  # warm replicas that make it ready (/readyz)
    largest_bucket: int
    torch_threads: int | None  # each replica's (None: the backend's own default)
    # The variables Ray sets to the devices a replica holds (NEURON_RT_VISIBLE_CORES, CUDA_VISIBLE_DEVICES).
    visible_devices_env: tuple[str, ...] = ()
    # `interactive_encoder`: the deployment of the one replica of `replicas` kept for the interactive lane;
    # `deployment` then runs the others.
    interactive: DeploymentPlan | None = None

    @property
    def shared_replicas(self) -> int:
        """The replicas `deployment` runs, which the other lanes' requests meet: all but the one kept for the
        interactive lane."""
        return self.replicas - 1 if self.interactive is not None else self.replicas

    def kept(self) -> TowerPlan | None:
        """The kept replica's own plan (what it runs and the ingress's link to it reads), or None."""
        if self.interactive is None:
            return None
        return self.model_copy(update={"deployment": self.interactive, "interactive": None, "replicas": 1,
                                       "min_replicas": 1, "min_ready": 1})


class IngressPlan(PlanRecord):
    deployment: DeploymentPlan
    ask: ReplicaAsk
    # A fixed count, or the autoscaling floor: what each ingress plans its share of the tower calls for
    # (scaled out, the towers get more calls than they need, never fewer).
    replicas: int
    max_replicas: int
    limits: FrontDoorLimits  # per ingress replica (serve/ingress/front_door.py, HAProxy's maxconn and queue)
    front: FrontSettings

    @property
    def sharing_replicas(self) -> int:
        """The replicas HAProxy spreads the traffic over: all but the one kept for the interactive lane
        (`limits.interactive_server`), which sees only that lane's few requests."""
        return self.replicas - 1 if self.limits.interactive_server else self.replicas


class ModelPlan(PlanRecord):
    """One served model: its towers on its own replicas."""

    name: str  # what requests' `model` names
    model: str  # the open_clip model it runs
    backend: str
    image: TowerPlan
    text: TowerPlan | None = None
    run: TowerRun  # what its tower replicas run with
    front: ModelFront  # what the ingress checks of its requests

    @property
    def towers(self) -> dict[str, TowerPlan]:
        return {"image": self.image, **({"text": self.text} if self.text is not None else {})}


class ServicePlan(PlanRecord):
    models: tuple[ModelPlan, ...]
    ingress: IngressPlan

    @property
    def model(self) -> ModelPlan:
        """The default model (the first): it answers requests that name none."""
        return self.models[0]

    def named(self, name: str) -> ModelPlan:
        return next(model for model in self.models if model.name == name)

    def towers(self) -> list[TowerPlan]:
        return [tower for model in self.models for tower in model.towers.values()]

    def needs(self, most: bool = False) -> dict[str, float]:
        """CPUs and device resources every replica together asks Ray for: at the fewest each deployment runs
        (a fixed count: all), or with `most` at the most autoscaling may add."""
        total: dict[str, float] = {}

        def add(ask: ReplicaAsk, count: int) -> None:
            total["CPU"] = total.get("CPU", 0.0) + count * ask.num_cpus
            for device, amount in ask.devices.items():
                total[device] = total.get(device, 0.0) + count * amount

        for tower in self.towers():
            add(tower.ask, tower.replicas if most else tower.min_replicas)
        add(self.ingress.ask, self.ingress.max_replicas if most else self.ingress.replicas)
        return total

    def shortfalls(self, have: Mapping[str, float], most: bool = False) -> dict[str, tuple[float, float]]:
        """Resource -> (asked, declared) for each the cluster's totals `have` cannot hold."""
        return {name: (asked, have.get(name, 0.0)) for name, asked in self.needs(most).items()
                if asked > have.get(name, 0.0) + 1e-9}
