"""The cluster check's decisions (serve/plan/cluster_fit.py): which cluster grows, refused or warned, and how
`replicas: auto` waits for NeuronCores that have not registered yet. The cluster is a resources function
here; tests/integration/test_multinode.py deploys on a real one before its workers join."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from siglip_serve.launcher.runner import run_growth
from siglip_serve.serve.plan import cluster_fit
from siglip_serve.serve.plan.cluster_fit import (
    FIXED,
    Growth,
    check_cluster_fits,
    cluster_growth,
    planning_resources,
    settled_count,
)
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from tests.bounds import scaled

# As the KubeRay manifest's application: one encoder per logical core, the ingress beside them.
NEURON = {"model": "tiny-siglip", "backend": "neuron", "replicas": 8, "ingress_replicas": 2,
          "encoder_num_cpus": 1, "ingress_num_cpus": 1}
HEAD_ONLY = {"memory": 8e9, "node:__internal_head__": 1.0}  # a head started with num-cpus 0
GROWS = Growth(True, "KubeRay's cluster: RAY_CLUSTER_NAME is set")


def config(**args: Any) -> ServiceConfig:
    return ServiceConfig.from_args({**NEURON, **args})


def counts(*seen: float) -> Callable[[], Mapping[str, float]]:
    """A cluster whose neuron_cores read `seen` in turn, the last one for ever."""
    calls = iter(seen)
    last = {"value": 0.0}

    def resources() -> Mapping[str, float]:
        last["value"] = next(calls, last["value"])
        return {"CPU": 0.0, "neuron_cores": last["value"]}
    return resources


# -- which cluster grows -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["RAY_CLUSTER_NAME", "KUBERAY_GEN_RAY_START_CMD"])
def test_kuberays_environment_means_a_cluster_that_grows(name: str) -> None:
    growth = cluster_growth(config(), {name: "siglip-serve-raycluster-x"})
    assert growth.grows and name in growth.why


def test_without_kuberay_or_the_field_the_cluster_is_fixed() -> None:
    assert not cluster_growth(config(), {"RAY_ADDRESS": "127.0.0.1:6379"}).grows


def test_the_field_wins_over_the_environment() -> None:
    kuberay = {"RAY_CLUSTER_NAME": "x"}
    assert not cluster_growth(config(cluster_grows=False), kuberay).grows
    assert cluster_growth(config(cluster_grows=True), {}).grows


def test_siglip_serve_run_decides_from_address_unless_the_config_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_CLUSTER_NAME", "x")  # run inside a KubeRay pod: the Ray it starts is still its own
    assert run_growth(config(), None) == cluster_fit.LOCAL_RUN
    assert run_growth(config(), "10.0.0.5:6379").grows
    assert not run_growth(config(cluster_grows=False), "10.0.0.5:6379").grows
    with pytest.raises(ConfigError, match=r"declares 1;.*--neuron-cores N"):
        check_cluster_fits(plan_service(config()), run_growth(config(), None), {"CPU": 16, "neuron_cores": 1})


# -- refused or warned ---------------------------------------------------------------------------

def test_a_fixed_cluster_refuses_what_it_cannot_hold_and_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"needs 10 CPUs .* has 0;.*set cluster_grows: true") as refused:
        check_cluster_fits(plan_service(config()), cluster_growth(config(), {}), HEAD_ONLY)
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"needs 8 neuron_cores .* declares 4;"):
        check_cluster_fits(plan_service(config()), FIXED, {"CPU": 16, "neuron_cores": 4})


def test_a_growing_cluster_deploys_with_one_warning_naming_the_numbers(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="siglip_serve"):
        check_cluster_fits(plan_service(config()), GROWS, HEAD_ONLY)  # no raise: the workers have not registered yet
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "needs 10 CPUs" in warning and "has 0" in warning
    assert "needs 8 neuron_cores" in warning and "declares 0 now" in warning
    assert "RAY_CLUSTER_NAME" in warning and "as nodes join" in warning


def test_a_growing_cluster_takes_an_autoscaling_floor_that_does_not_fit_yet(caplog: pytest.LogCaptureFixture) -> None:
    scaled = ServiceConfig.from_args({**{k: v for k, v in NEURON.items() if k != "replicas"},
                                      "autoscaling": {"min_replicas": 8, "max_replicas": 16}})
    with pytest.raises(ConfigError, match="needs 10 CPUs"):
        check_cluster_fits(plan_service(scaled), FIXED, HEAD_ONLY)
    with caplog.at_level(logging.WARNING, logger="siglip_serve"):
        check_cluster_fits(plan_service(scaled), GROWS, HEAD_ONLY)
    assert any("needs 8 neuron_cores" in r.getMessage() for r in caplog.records)


def test_a_cluster_that_holds_the_app_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="siglip_serve"):
        check_cluster_fits(plan_service(config()), GROWS, {"CPU": 22, "neuron_cores": 8})
        check_cluster_fits(plan_service(config()), FIXED, {"CPU": 22, "neuron_cores": 8})
    assert not caplog.records


# -- replicas: auto waits for the NeuronCores ----------------------------------------------------

def test_auto_waits_until_the_count_holds_not_for_the_first_worker(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing, then the first worker's 4, then the second's: 8 is counted, once it has held.
    with caplog.at_level(logging.INFO, logger="siglip_serve"):
        cores = settled_count(10, GROWS, settle_s=0.3, resources=counts(0, 0, 4, 4, 8))
    assert cores == 8
    progress = [r.getMessage() for r in caplog.records if "registered after" in r.getMessage()]
    assert [line.split()[2] for line in progress] == ["0", "4", "8"]  # a line per change, with the count


def test_auto_refuses_when_no_core_registers_in_time() -> None:
    with pytest.raises(ConfigError, match=r"no neuron_cores .* within cluster_wait_s 0.2 s .*replicas: N"):
        settled_count(0.2, GROWS, settle_s=0.05, resources=counts(0))


def test_a_stop_ends_the_wait_at_once_without_a_refusal() -> None:
    stopping = iter([False, False, True])
    began = time.monotonic()
    assert settled_count(30, GROWS, settle_s=0.05, resources=counts(0),
                                stop=lambda: next(stopping, True)) == 0
    assert time.monotonic() - began < scaled(5)


def test_auto_counts_what_is_there_when_the_count_never_holds(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="siglip_serve"):
        cores = settled_count(0.3, GROWS, settle_s=0.4, resources=counts(*range(1, 1000)))
    assert cores >= 1
    assert any("still changing" in r.getMessage() for r in caplog.records)


def test_auto_waits_only_where_the_cluster_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_fit, "CORES_SETTLE_S", 0.2)
    monkeypatch.setattr(cluster_fit.ray, "cluster_resources", counts(0, 4, 8))
    auto = config(replicas="auto", ingress_replicas=1)
    with pytest.raises(ConfigError, match="found 0 neuron_cores"):  # counted at once, as before
        plan_service(auto, planning_resources(auto, FIXED))
    planned = plan_service(auto, planning_resources(auto, GROWS))
    assert planned.model.image.replicas == 8 and planned.ingress.replicas == 1
    named = plan_service(config(), planning_resources(config(), GROWS))  # a named count needs no wait
    assert named.model.image.replicas == 8
