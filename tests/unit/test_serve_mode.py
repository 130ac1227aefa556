"""Serve's throughput-optimized mode reaches every replica of the app where it is on: by default the ingress
always and the towers where the model is not on the host's cores; off leaves Serve's defaults (docs/capacity.md)."""

from __future__ import annotations

from typing import Any

import pytest

from siglip_serve.core.constants import SERVE_THROUGHPUT_ENV
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.policy import policy_of


def replica_envs(config: ServiceConfig) -> dict[str, dict[str, Any]]:
    from ray.serve import Application

    from siglip_serve.serve.app import build
    from siglip_serve.serve.plan.planner import plan_service

    ingress = build(config, plan_service(config))._bound_deployment  # the application's root, bound to its towers
    towers = [app._bound_deployment for model in ingress.init_args[0].values() for app in model.values()
              if isinstance(app, Application)]
    deployments = {d.name: d for d in (ingress, *towers)}
    return {name: d.ray_actor_options.get("runtime_env", {}).get("env_vars", {}) for name, d in deployments.items()}


def test_every_replica_runs_serve_in_throughput_mode_with_its_log_on_stderr_and_the_front_end_kept() -> None:
    envs = replica_envs(ServiceConfig(model="tiny-siglip", random_weights=True, replicas=2, text_replicas=1,
                                      env_vars={"MY_VAR": "1"}, throughput_optimized=True))
    assert set(envs) == {"Ingress", "Encoder", "TextEncoder"}
    for name, env in envs.items():
        assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1", name
        # The mode alone would send a replica's stderr (our log lines) to Serve's files only, and turn
        # direct ingress on in replicas whose controller may run Serve's proxy actor.
        assert env["RAY_SERVE_LOG_TO_STDERR"] == "1", name
        assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0", name
    assert envs["Encoder"]["MY_VAR"] == "1"


@pytest.mark.parametrize("override", [{"throughput_optimized": False},
                                      {"throughput_optimized": True,
                                       "env_vars": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}}],
                         ids=["config-off", "env-var-wins"])
def test_serve_defaults_when_turned_off(override: dict[str, Any]) -> None:
    envs = replica_envs(ServiceConfig(model="tiny-siglip", random_weights=True, replicas=1, text_replicas=1,
                                      **override))
    assert envs["Encoder"].get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0") == "0"
    if "env_vars" not in override:
        assert not any(name in env for env in envs.values() for name in SERVE_THROUGHPUT_ENV)


def test_on_cpu_by_default_the_ingress_runs_the_mode_and_the_towers_do_not() -> None:
    # Measured per deployment (docs/dev/benchmark-log.md, "Serve's mode per deployment"): the ingress saves host
    # CPU in the mode; towers that share the host's cores with it lose images per second.
    config = ServiceConfig(model="tiny-siglip", random_weights=True, replicas=1, text_replicas=1)
    envs = replica_envs(config)
    assert {k: envs["Ingress"].get(k) for k in SERVE_THROUGHPUT_ENV} == SERVE_THROUGHPUT_ENV
    # Explicitly off: a Ray that `siglip-serve run` started in the mode hands its environment to every worker.
    assert envs["Encoder"]["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"
    assert envs["TextEncoder"]["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"
    assert policy_of(config).tower_calls_by_grpc  # the ingress's own choice: every replica serves gRPC


@pytest.mark.parametrize(("backend", "on"), [("cpu", False), ("cuda", True), ("neuron", True),
                                             ("neuron-native", True), ("zeros-no-model", True)])
def test_the_mode_is_on_by_default_where_the_model_is_not_on_the_hosts_cores(backend: str, on: bool) -> None:
    # On cpu the mode cost ViT-B-16 about 15 % of its img/s and doubled its p99 (docs/capacity.md).
    default = policy_of(ServiceConfig.model_construct(backend=backend, throughput_optimized=None))
    assert default.towers_throughput_mode is on and default.tower_calls_by_grpc
    assert default.ingress_throughput_mode  # the ingress runs it on every backend unless turned off
    flipped = policy_of(ServiceConfig.model_construct(backend=backend, throughput_optimized=not on))
    assert flipped.towers_throughput_mode is not on
    off = policy_of(ServiceConfig.model_construct(backend=backend, throughput_optimized=False))
    assert not off.ingress_throughput_mode and not off.tower_calls_by_grpc


def test_a_handle_built_without_the_mode_calls_by_reference() -> None:
    # What a builder without the mode in its environment pickles into the ingress: so the ingress picks
    # gRPC itself (integration: tests/integration/test_http_api.py reads its log line).
    from ray.serve.handle import DeploymentHandle

    from siglip_serve.serve.ingress.tower_client import TowerClient

    handle: DeploymentHandle = DeploymentHandle("Encoder", "siglip")
    client = TowerClient(handle, replicas=1, ingress_replicas=1, max_images=8, retry_after_s=1, max_in_flight=2)
    assert client.transport == "Ray actor tasks"
