"""How many encoders and decoders a bulk job runs, from the Ray cluster's declared resources."""

from __future__ import annotations

import pytest

from siglip_serve.bulk.job import JobSpec, PlanError, plan_workers
from siglip_serve.serve.plan.config import ServiceConfig

SPEC = JobSpec(source="in", output="out")


def test_cpu_runs_one_encoder_beside_a_decoder_per_core() -> None:
    from siglip_serve.bulk.job import local_cpus

    config = ServiceConfig(model="tiny-siglip")
    assert local_cpus(config, SPEC, cores=8) == 9  # the encoder's torch threads share the cores
    plan = plan_workers(config, SPEC, {"CPU": 9.0})
    assert (plan.encoders, plan.encoder_options, plan.decode_workers) == (1, {"num_cpus": 1}, 8)
    named = JobSpec("in", "out", decode_workers=12, encoders=2)
    assert local_cpus(config, named, cores=8) == 14
    assert plan_workers(config, named, {"CPU": 14.0}).decode_workers == 12


def test_neuron_runs_one_encoder_per_logical_core_group_and_cuda_one_per_gpu() -> None:
    neuron = ServiceConfig(model="tiny-siglip", backend="neuron", neuron_cores_per_replica=1)
    plan = plan_workers(neuron, SPEC, {"CPU": 12.0, "neuron_cores": 4.0})
    assert (plan.encoders, plan.encoder_options["resources"], plan.decode_workers) == (4, {"neuron_cores": 1}, 8)
    cuda = plan_workers(ServiceConfig(model="tiny-siglip", backend="cuda"), SPEC, {"CPU": 16.0, "GPU": 2.0})
    assert (cuda.encoders, cuda.encoder_options["num_gpus"], cuda.decode_workers) == (2, 1, 14)


def test_a_cluster_without_the_backends_device_is_refused_in_one_line() -> None:
    with pytest.raises(PlanError, match="declares no GPU for backend cuda"):
        plan_workers(ServiceConfig(model="tiny-siglip", backend="cuda"), SPEC, {"CPU": 4.0})
