"""`model_apps`: each model's towers in a Serve application of its own (serve/app.py build_model_app), whose
args hold that model's settings alone, so adding or removing another model leaves them (and Serve's code version
of its deployments) as they were; the front application's ingress rolls with a surge."""

from __future__ import annotations

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from siglip_serve.serve.plan.config import FRONT_ONLY, ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import INGRESS_SURGE_PERCENT, plan_service
from siglip_serve.serve.plan.served_models import model_app_args
from siglip_serve.serve.serve_yaml import BUILDER, MODEL_BUILDER, model_apps_config, service_args
from tests.helpers import REPO

OLD = {"name": "old", "model": "tiny-siglip", "replicas": 1}
NEW = {"name": "new", "model": "tiny-siglip2", "replicas": 1, "text_replicas": 0}
THIRD = {"name": "third", "model": "tiny-siglip", "seed": 2, "replicas": 1}
SHARED = {"backend": "cpu", "torch_threads": 1, "api_key": "k", "ingress_replicas": 1, "embedding_cache_mib": 8}


def test_a_models_application_is_unchanged_by_adding_or_removing_another() -> None:
    two = model_apps_config("svc", "/", {**SHARED, "models": [OLD, NEW]})
    three = model_apps_config("svc", "/", {**SHARED, "models": [OLD, NEW, THIRD]})
    ServeDeploySchema.model_validate(three)
    assert [app["name"] for app in three["applications"]] == ["svc", "svc-old", "svc-new", "svc-third"]
    assert three["applications"][1:3] == two["applications"][1:]  # the same args: the same code version
    front = three["applications"][0]
    assert front["import_path"] == BUILDER and front["args"]["model_apps"] is True
    for app in three["applications"][1:]:
        assert app["import_path"] == MODEL_BUILDER and app["route_prefix"] is None
        assert not (FRONT_ONLY - {"models"}) & set(app["args"]) and len(app["args"]["models"]) == 1
    # bulk's --service-config still finds the service's own args: the front application's.
    assert service_args(three)["models"] == [OLD, NEW, THIRD]


def test_the_front_and_a_models_application_plan_that_models_towers_alike() -> None:
    front = {**SHARED, "models": [OLD, NEW], "model_apps": True}
    plan = plan_service(ServiceConfig.from_args(front))
    own = plan_service(ServiceConfig.from_args(model_app_args(front, "new")))
    assert own.models == (plan.named("new"),)  # the ingress's links size what the model's application runs


def test_only_an_ingress_whose_models_can_change_in_place_rolls_with_a_surge() -> None:
    """Several models (`model_apps`, or `run`'s SIGHUP over `models:`): the ingress is replaced as they change, the
    new replica up first. One model: Serve's default roll."""
    one = {**SHARED, "model": "tiny-siglip"}
    assert plan_service(ServiceConfig.from_args(one)).ingress.deployment.max_surge_percent is None
    args = {**SHARED, "models": [OLD, NEW]}
    for several in (args, {**args, "model_apps": True}):
        surged = plan_service(ServiceConfig.from_args(several)).ingress.deployment
        assert surged.options()["max_surge_percent"] == INGRESS_SURGE_PERCENT


def test_model_apps_needs_models_and_a_models_application_one_model() -> None:
    from siglip_serve.serve.app import AppRefused, build_model_app

    with pytest.raises(ConfigError, match="model_apps: true needs models"):
        ServiceConfig.from_args({"model": "tiny-siglip", "model_apps": True})
    with pytest.raises(AppRefused, match="one models: entry"):
        build_model_app({**SHARED, "models": [OLD, NEW]})
    with pytest.raises(ConfigError, match="'fourth'"):
        model_app_args({"models": [OLD]}, "fourth")


def test_the_shipped_model_apps_yaml_is_what_the_generator_writes() -> None:
    document = yaml.safe_load((REPO / "deploy" / "model-apps.yaml").read_text())
    ServeDeploySchema.model_validate(document)
    front = document["applications"][0]
    ServiceConfig.from_args(front["args"])
    written = model_apps_config(front["name"], front["route_prefix"], front["args"])
    assert written["applications"] == document["applications"]
