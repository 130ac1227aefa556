"""The CPU plan (serve/plan/cpu_plan.py): how many encoder replicas `auto` runs and how many torch threads
each gets. The machine (cores, memory) is set through the two functions that read it; the model
sizes are open_clip's own, counted on the meta device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from siglip_serve.models.loading import ParameterCounts, load_clip, parameter_counts
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.source import model_source
from siglip_serve.serve.plan import cpu_plan
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.policy import policy_of

GiB = 2**30


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Set this machine's usable cores and available memory as cpu_plan sees them."""
    def set_machine(cores: int, available_bytes: int) -> None:
        monkeypatch.setattr(cpu_plan, "usable_cpus", lambda: cores)
        monkeypatch.setattr(cpu_plan.psutil, "virtual_memory", lambda: SimpleNamespace(available=available_bytes))
    return set_machine


def test_parameter_counts_are_the_built_models() -> None:
    model, _ = load_clip(ModelSettings(model="tiny-siglip", random_weights=True))
    counts = parameter_counts(model_source("tiny-siglip"))
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.image == sum(p.numel() for p in model.get_submodule("visual").parameters())


def test_measured_models_fall_on_the_measured_side_of_the_split() -> None:
    assert parameter_counts(model_source("ViT-B-16-SigLIP")).image <= cpu_plan.SPLIT_MAX_IMAGE_PARAMETERS
    assert parameter_counts(model_source("ViT-SO400M-14-SigLIP-384")).image > cpu_plan.SPLIT_MAX_IMAGE_PARAMETERS


def test_config_defaults_to_auto_on_cpu_only() -> None:
    assert policy_of(ServiceConfig.from_args({})).replica_setting == "auto"
    assert policy_of(ServiceConfig.from_args({"backend": "neuron"})).replica_setting == 1
    assert policy_of(ServiceConfig.from_args({"backend": "cuda"})).replica_setting == 1
    assert policy_of(ServiceConfig.from_args({"replicas": 3})).replica_setting == 3


def test_small_model_gets_a_replica_per_core_with_one_thread(machine) -> None:
    machine(cores=8, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "tiny-siglip"})
    assert plan_service(config).model.image.replicas == 8
    assert cpu_plan.image_torch_threads(config, 8) == 1


def test_named_threads_set_the_replicas_per_core(machine) -> None:
    machine(cores=8, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "tiny-siglip", "torch_threads": 2})
    assert plan_service(config).model.image.replicas == 4
    assert cpu_plan.image_torch_threads(config, 4) == 2


def test_large_model_keeps_one_replica_with_every_core(machine) -> None:
    machine(cores=8, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "ViT-SO400M-14-SigLIP-384", "random_weights": True})
    assert plan_service(config).model.image.replicas == 1
    assert cpu_plan.image_torch_threads(config, 1) is None  # the replica takes its machine's cores


def test_memory_caps_the_replicas_and_the_cores_are_split_among_those(machine, monkeypatch) -> None:
    total = 100_000_000  # 0.8 GB of float32 weights: each replica needs ~2.1 GiB while it loads
    monkeypatch.setattr(cpu_plan, "parameter_counts", lambda _model: ParameterCounts(image=total // 2, total=total))
    need = cpu_plan.replica_load_bytes(total)
    machine(cores=8, available_bytes=int(3.5 * need / cpu_plan.MEMORY_SHARE))
    config = ServiceConfig.from_args({"model": "tiny-siglip"})
    assert plan_service(config).model.image.replicas == 3
    assert cpu_plan.image_torch_threads(config, 3) == 2
    machine(cores=8, available_bytes=need // 10)
    assert plan_service(config).model.image.replicas == 1  # never none


def test_a_named_replica_count_splits_the_cores_without_oversubscribing(machine) -> None:
    machine(cores=2, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "tiny-siglip", "replicas": 2})
    assert cpu_plan.image_torch_threads(config, 2) == 1
    assert cpu_plan.image_torch_threads(config, 4) == 1  # more replicas than cores: still one thread
    assert cpu_plan.image_torch_threads(ServiceConfig.from_args({"replicas": 1}), 1) is None
    assert cpu_plan.image_torch_threads(ServiceConfig.from_args({"backend": "cuda", "replicas": 2}), 2) is None


def test_the_plan_decides_the_count_before_ray_except_a_devices_auto(machine) -> None:
    machine(cores=2, available_bytes=64 * GiB)
    assert plan_service(ServiceConfig.from_args({"model": "tiny-siglip"})).model.image.replicas == 2
    assert plan_service(ServiceConfig.from_args({"backend": "cuda"})).model.image.replicas == 1
    neuron_auto = ServiceConfig.from_args({"backend": "neuron", "replicas": "auto"})
    with pytest.raises(ConfigError, match="counts the neuron_cores a Ray cluster declares"):
        plan_service(neuron_auto)  # counted from the cluster's neuron_cores
    assert plan_service(neuron_auto, {"CPU": 12, "neuron_cores": 4}).model.image.replicas == 4
    # Any backend's device: a GPU host's auto counts its GPUs, beside a text replica that holds one too.
    cuda_auto = ServiceConfig.from_args({"backend": "cuda", "replicas": "auto", "text_replicas": 1})
    assert plan_service(cuda_auto, {"CPU": 16, "GPU": 4}).model.image.replicas == 3


def test_a_running_clusters_cpus_cap_auto_beside_the_ingress_and_text(machine) -> None:
    machine(cores=8, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "tiny-siglip", "text_replicas": 1})  # 0.5 + 0.5 CPUs beside
    assert cpu_plan.auto_cpu_replicas(config, 1, cluster_cpus=8) == 7
    assert cpu_plan.auto_cpu_replicas(config, 1, cluster_cpus=2) == 1  # `ray start` on a 2-core machine
    assert cpu_plan.auto_cpu_replicas(config, 1, cluster_cpus=64) == 8  # the cores still count
    # The planner counts the text replicas it plans: none where the start's checks turned the default's text off.
    default = ServiceConfig.from_args({"model": "tiny-siglip"})
    assert plan_service(default, {"CPU": 2.5}).model.image.replicas == 1  # 0.5 ingress + 0.5 text beside
    off = plan_service(default, {"CPU": 2.5}, text_off="no tokenizer").model
    assert off.text is None and off.image.replicas == 2


def test_auto_on_cpu_placed_on_neuron_cores_still_counts_neuron_cores(machine) -> None:
    """The tests' stand-in for neuron (cpu replicas asking for neuron_cores) keeps 'auto' on the cluster."""
    machine(cores=2, available_bytes=64 * GiB)
    config = ServiceConfig.from_args({"model": "tiny-siglip", "replicas": "auto", "neuron_cores_per_replica": 1})
    with pytest.raises(ConfigError, match="neuron_cores"):
        plan_service(config)
    assert plan_service(config, {"CPU": 16, "neuron_cores": 3}).model.image.replicas == 3


@pytest.mark.parametrize("backend,cores,encoders,expected", [
    ("cpu", 2, 2, 1),        # the encoders take the cores: one ingress, as before auto
    ("cpu", 64, 1, 1),       # one replica with every core (SO400M): still one
    ("cuda", 16, 1, 6),      # the lent H100 host: (16 - 1 - 2) // 2
    ("zeros-no-model", 16, 1, 6),
    ("neuron", 12, 4, 3),    # trn2.3xlarge at LNC=2
    ("neuron", 12, 8, 1),    # trn2.3xlarge at LNC=1
    ("neuron", 192, 64, 63),  # trn2.48xlarge at LNC=2
])
def test_auto_ingress_replicas_take_the_cores_the_encoders_leave(machine, backend: str, cores: int, encoders: int,
                                                                 expected: int) -> None:
    machine(cores, 64 * GiB)
    config = ServiceConfig(model="tiny-siglip", backend=backend, replicas=encoders)
    assert cpu_plan.ingress_replicas_for(config, encoders) == expected
    assert cpu_plan.ingress_replicas_for(config.model_copy(update={"ingress_replicas": 2}), encoders) == 2


def test_the_plan_decides_the_ingress_count(machine) -> None:
    machine(16, 64 * GiB)
    config = ServiceConfig(model="tiny-siglip", backend="cuda")
    assert config.ingress_replicas == "auto"
    assert plan_service(config).ingress.replicas == 6


def test_the_text_replica_gets_its_ray_cpus_in_threads_not_every_core(machine) -> None:
    from siglip_serve.models.text import TextEncoder
    from siglip_serve.serve.towers.text_deployment import TextReplica

    machine(cores=16, available_bytes=64 * GiB)
    assert cpu_plan.text_torch_threads(ServiceConfig(model="tiny-siglip")) == 1  # text_num_cpus 0.5
    assert cpu_plan.text_torch_threads(ServiceConfig(model="tiny-siglip", text_num_cpus=3)) == 3
    assert cpu_plan.text_torch_threads(ServiceConfig(model="tiny-siglip", torch_threads=2)) == 2
    assert cpu_plan.text_torch_threads(ServiceConfig(model="tiny-siglip", backend="cuda")) is None
    # The replica class builds its encoder with that count (as Serve builds it, here without Ray).
    before = torch.get_num_threads()
    try:
        config = ServiceConfig(model="tiny-siglip", random_weights=True, text_num_cpus=2)
        model = plan_service(config).model
        text = model.text
        assert text is not None and text.torch_threads == 2
        replica = TextReplica(model.run, text)
        assert isinstance(replica.tower, TextEncoder) and replica.tower.runner.threads == 2
    finally:
        torch.set_num_threads(before)


def test_a_deterministic_model_runs_one_thread_per_replica_and_a_replica_per_core(machine) -> None:
    machine(cores=8, available_bytes=64 * GiB)
    large = {"model": "ViT-SO400M-14-SigLIP-384", "random_weights": True}
    config = ServiceConfig.from_args({**large, "deterministic": True})
    assert config.torch_threads == 1
    replicas = plan_service(config).model.image.replicas
    # Planned as one thread named: a replica per core (the text replica's share aside), not one with every core.
    assert replicas == plan_service(ServiceConfig.from_args({**large, "torch_threads": 1})).model.image.replicas > 1
    assert cpu_plan.image_torch_threads(config, replicas) == 1
    assert cpu_plan.text_torch_threads(config) == 1
