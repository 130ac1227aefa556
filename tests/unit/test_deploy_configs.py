"""The trn2 Serve configs: valid for Ray Serve, valid for our config, and consistent (LNC everywhere
the same, one replica per declared logical NeuronCore). The KubeRay RayService: test_kuberay_manifest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.placement import replica_asks
from siglip_serve.serve.plan.planner import plan_service
from tests.helpers import REPO

DEPLOY = REPO / "deploy"


def app_args(serve_config: dict) -> dict:
    ServeDeploySchema.model_validate(serve_config)
    (app,) = serve_config["applications"]
    assert app["import_path"] == "siglip_serve.serve.app:build_app"
    return app["args"]


@pytest.mark.parametrize("lnc,cores", [(2, 4), (1, 8)])
def test_trn2_serve_configs(lnc: int, cores: int) -> None:
    path = DEPLOY / f"serve-trn2-lnc{lnc}.yaml"
    text = path.read_text()
    config = yaml.safe_load(text)
    args = app_args(config)
    service = ServiceConfig.from_args(args)
    assert service.backend == "neuron" and service.replicas == cores
    assert replica_asks(service).image.devices == {"neuron_cores": 1}
    assert service.env_vars == {"NEURON_LOGICAL_NC_CONFIG": str(lnc)}
    assert Path(args["artifact_dir"]).is_absolute() and f"lnc{lnc}" in args["artifact_dir"]
    assert config["http_options"]["host"] == "127.0.0.1"
    assert f"NEURON_LOGICAL_NC_CONFIG={lnc}" in text and f'"neuron_cores": {cores}' in text
    assert f"--lnc {lnc}" in text
    # The CPUs the config asks for fit a trn2.3xlarge's 12 vCPUs.
    cpus = cores * service.encoder_num_cpus + service.ingress_replicas * service.ingress_num_cpus
    assert cpus <= 12


def test_systemd_unit_sends_sigterm_to_the_main_process_and_waits_out_the_drain() -> None:
    from siglip_serve.launcher import cli
    from tests.helpers import read_unit, unit_command

    unit = read_unit()
    service = unit["Service"]
    # mixed: SIGTERM to the main process only, which relays it to the service; control-group would also
    # send it to Ray's own processes (every process of the cgroup) before the service has drained.
    assert service["KillMode"] == ["mixed"] and service.get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]
    command = unit_command(unit)
    assert command[0].endswith("/.venv/bin/siglip-serve"), command
    args = cli.build_parser().parse_args(command[2:])
    assert command[1] == "run" and args.address is None
    assert args.host == "127.0.0.1" and args.metrics_host == "127.0.0.1"
    drain_s = ServiceConfig.from_args(cli.run_settings(args)).drain_timeout_s
    (stop_s,) = service["TimeoutStopSec"]
    # Room for the drain and a few seconds to stop Serve and Ray, before systemd's SIGKILL.
    assert stop_s.isdigit() and drain_s + 10 <= int(stop_s) <= drain_s + 30, (drain_s, stop_s)
    assert args.model == "ViT-SO400M-14-SigLIP-384" and args.pretrained == "webli"


def test_the_cpu_configs_autoscaling_example_validates() -> None:
    text = (DEPLOY / "serve-cpu.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("# autoscaling:"))
    example = "\n".join(line.strip().removeprefix("# ") for line in lines[start:start + 2])
    args = {**app_args(yaml.safe_load(text)), **yaml.safe_load(example)}
    args.pop("replicas")
    options = plan_service(ServiceConfig.from_args(args)).model.image.deployment.autoscaling_config
    assert options is not None and options["target_ongoing_requests"] == 1 and options["max_replicas"] == 4


def test_the_cpu_configs_ingress_autoscaling_example_validates() -> None:
    text = (DEPLOY / "serve-cpu.yaml").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("# ingress_autoscaling:"))
    args = {**app_args(yaml.safe_load(text)), **yaml.safe_load(line.strip().removeprefix("# "))}
    args.pop("ingress_replicas", None)
    options = plan_service(ServiceConfig.from_args(args)).ingress.deployment.autoscaling_config
    assert options is not None and options["max_replicas"] == 2
    assert options["policy"]["policy_kwargs"] == {"target_busy_cores": 1.0}


def serve_configs() -> list[tuple[str, dict]]:
    """Every Serve config we ship: the YAMLs and the RayService's serveConfigV2."""
    configs = [(path.name, yaml.safe_load(path.read_text())) for path in sorted(DEPLOY.glob("serve-*.yaml"))]
    service = yaml.safe_load((DEPLOY / "kuberay" / "rayservice.yaml").read_text())
    configs.append(("rayservice.yaml", yaml.safe_load(service["spec"]["serveConfigV2"])))
    return configs


@pytest.mark.parametrize("name,serve_config", serve_configs(), ids=[name for name, _ in serve_configs()])
def test_serves_own_timeout_stands_just_behind_the_apps_deadline(name: str, serve_config: dict) -> None:
    from siglip_serve.core.front_door import FRONT_END_TIMEOUT_MARGIN_S

    # Serve's proxy holds a request before the ingress sees it (its deadline starts there): Serve's own
    # timeout bounds that wait, and must not cut a request the app still works on.
    deadline = ServiceConfig.from_args(app_args(serve_config)).request_timeout_s
    assert serve_config["http_options"]["request_timeout_s"] == deadline + FRONT_END_TIMEOUT_MARGIN_S, name


@pytest.mark.parametrize("name,serve_config", serve_configs(), ids=[name for name, _ in serve_configs()])
def test_serve_accepts_the_import_paths_builder(name: str, serve_config: dict) -> None:
    """Serve's own call of the builder (ray/serve/_private/api.py) refuses any function that does not take
    exactly one parameter; a config it reaches the checks of is refused as the app's own AppRefused."""
    import importlib

    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    from siglip_serve.serve.app import AppRefused

    (app,) = serve_config["applications"]
    module, _, attribute = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attribute)
    with pytest.raises(AppRefused, match="max_batch_size"):
        call_user_app_builder_with_args_if_necessary(builder, {**app["args"], "max_batch_size": 0})
