"""The service's plan (serve/plan/planner.py, serve/plan/service_plan.py): made once from a config, as data, and read as
it is by the application's deployments; `replicas: auto` counts the backend record's own device; `run --print-plan`
shows it without starting anything."""

from __future__ import annotations

import json
from typing import Any

import pytest

from siglip_serve.core.backends import BUILTIN, registered
from siglip_serve.serve import app
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.service_plan import ServicePlan

CPU = next(record for record in BUILTIN if record.name == "cpu")


def test_the_plan_is_data_that_survives_json() -> None:
    config = ServiceConfig(model="tiny-siglip", random_weights=True, replicas=2, text_replicas=1,
                           ingress_autoscaling={"min_replicas": 1, "max_replicas": 3})
    plan = plan_service(config)
    assert ServicePlan.model_validate_json(plan.model_dump_json()) == plan
    assert [tower.tower for tower in plan.towers()] == ["image", "text"]
    assert plan.ingress.replicas == 1 and plan.ingress.max_replicas == 3
    assert plan.ingress.deployment.num_replicas is None and plan.ingress.deployment.autoscaling_config is not None


def test_auto_over_replicas_that_hold_no_device_is_refused_by_the_planner_naming_the_fix() -> None:
    """`replicas: auto` counts the device each image replica holds, or the host's cores on cpu; a backend whose
    replicas hold neither is refused where the count is made, naming the setting that gives them one."""
    config = ServiceConfig.from_args({"replicas": "auto", "backend": "zeros-no-model"})
    with pytest.raises(ConfigError, match="replicas hold none: set neuron_cores_per_replica: 1, or name a count"):
        plan_service(config)
    assert plan_service(config.model_copy(update={"replicas": 2})).model.image.replicas == 2


def test_auto_counts_the_device_a_registered_backend_names() -> None:
    """No literal resource name: a backend registered with a device of its own is counted in it."""
    chip = CPU.__class__(**{**CPU.as_dict(), "name": "chip-test", "ray_resource": "chip", "per_replica": 1.0,
                            "host_cores": False, "towers": ("image", "text")})
    with registered(chip):
        config = ServiceConfig(model="tiny-siglip", backend="chip-test", replicas="auto", text_replicas=1)
        plan = plan_service(config, {"CPU": 16.0, "chip": 5.0})
        assert plan.model.image.replicas == 4  # one of the five chips is the text replica's
        assert plan.model.image.ask.devices == {"chip": 1.0} and plan.model.text is not None
        assert plan.model.image.deployment.ray_actor_options["resources"] == {"chip": 1.0}
        assert plan.needs() == {"CPU": 4 * 1.0 + 0.5 + plan.ingress.replicas * 0.5, "chip": 5.0}
        with pytest.raises(ConfigError, match="chip"):
            plan_service(config)  # no cluster to count in


def test_the_application_is_built_from_the_plan_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.serve import Application

    config = ServiceConfig(model="tiny-siglip", random_weights=True, replicas=3, text_replicas=1, ingress_replicas=2,
                           request_timeout_s=12)
    made: list[ServicePlan] = []

    def plan_once(*args: Any, **keywords: Any) -> ServicePlan:
        made.append(plan_service(*args, **keywords))
        return made[-1]

    monkeypatch.setattr(app, "plan_service", plan_once)
    ingress = app.build_app(config.model_dump(exclude_none=True, mode="json"))._bound_deployment
    (plan,) = made  # made once for the whole application
    (bound,) = ingress.init_args[0].values()  # per served model, its towers
    towers = {app._bound_deployment.name: app._bound_deployment for app in bound.values()
              if isinstance(app, Application)}
    for deployment, planned in ((ingress, plan.ingress.deployment), (towers["Encoder"], plan.model.image.deployment),
                                (towers["TextEncoder"], plan.model.text.deployment)):  # type: ignore[union-attr]
        assert deployment.name == planned.name
        assert deployment.num_replicas == planned.num_replicas
        assert deployment.max_ongoing_requests == planned.max_ongoing_requests
        assert deployment.ray_actor_options == planned.ray_actor_options
    assert towers["Encoder"].num_replicas == 3 and ingress.num_replicas == 2
    # Each deployment is bound with its own slice of the plan, never the config (serve/plan/replica_slices.py).
    assert towers["Encoder"].init_args == (plan.model.run, plan.model.image)
    assert towers["TextEncoder"].init_args == (plan.model.run, plan.model.text)
    assert ingress.init_args[1] == plan and plan.ingress.front.live.request_timeout_s == 12
    assert plan.model.front.weights == config.weights_source and plan.model.run.settings == config.model_settings()
    assert not any(isinstance(arg, ServiceConfig) for bound in (ingress, *towers.values()) for arg in bound.init_args)
    assert plan.model.image.deployment.graceful_shutdown_timeout_s == 12


def test_print_plan_shows_the_plan_and_starts_nothing(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from siglip_serve.launcher import cli

    def started(*_: object, **__: object) -> None:
        raise AssertionError("--print-plan started Ray")

    monkeypatch.setattr(ray, "init", started)  # the suite's own Ray may run in this process: not a sign
    assert cli.main(["--model", "tiny-siglip", "--random-weights", "--replicas", "2", "--set", "text_replicas=0",
                     "--print-plan"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == json.loads(plan_service(ServiceConfig(model="tiny-siglip", random_weights=True, replicas=2,
                                                          text_replicas=0)).model_dump_json())
    assert shown["models"][0]["image"]["deployment"]["num_replicas"] == 2 and shown["models"][0]["text"] is None


def test_print_plan_plans_no_text_tower_where_the_default_turns_it_off_and_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The text tower's default decided by the config's shape (serve/app.py text_by_shape) is the planner's input:
    no text replicas planned, the reason in the model's part of the plan, the config as written."""
    from siglip_serve.launcher import cli

    assert cli.main(["--model", "ViT-B-16-SigLIP", "--random-weights", "--replicas", "1", "--print-plan"]) == 0
    model = json.loads(capsys.readouterr().out)["models"][0]
    assert model["text"] is None and "set text_replicas: 1" in model["front"]["text_off_reason"]


def test_run_checks_the_text_tower_the_planner_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run`'s checks load the text tower only where the plan will have one: not where the tokenizer check turned
    the default's text off."""
    from siglip_serve.launcher import cli
    from siglip_serve.models.backends import implementation
    from siglip_serve.serve.plan import model_checks

    towers: list[str] = []
    monkeypatch.setattr(implementation, "check_tower", lambda settings, tower: towers.append(tower))
    args = cli.build_parser().parse_args(["--model", "tiny-siglip", "--replicas", "1"])
    config = cli.service_config(args, {})
    assert cli.checked(config, args) is None and towers == ["text"]  # the tiny model's tokenizer is bundled
    towers.clear()
    monkeypatch.setattr(model_checks, "preflight_tokenizer", lambda config: "no tokenizer")
    assert cli.checked(config, args) == "no tokenizer" and towers == []
    assert plan_service(config, text_off="no tokenizer").model.text is None and config.text_replicas is None


def test_print_plan_counts_the_neuron_cores_it_is_told_of(capsys: pytest.CaptureFixture[str]) -> None:
    from siglip_serve.launcher import cli

    assert cli.main(["--backend", "neuron", "--model", "tiny-siglip", "--replicas", "auto", "--neuron-cores", "4",
                     "--set", "text_replicas=1", "--print-plan"]) == 0
    model = json.loads(capsys.readouterr().out)["models"][0]
    assert model["image"]["replicas"] == 3 and model["text"]["ask"]["devices"] == {"neuron_cores": 1.0}
    assert model["image"]["visible_devices_env"] == ["NEURON_RT_VISIBLE_CORES"]


def test_several_models_each_get_deployments_of_their_own_and_the_default_comes_first() -> None:
    config = ServiceConfig.from_args({
        "replicas": 1, "ingress_replicas": 1, "default_model": "new",
        "models": [{"name": "old", "model": "tiny-siglip", "text_replicas": 1},
                   {"name": "new", "model": "tiny-siglip2", "replicas": 2, "text_replicas": 0}]})
    plan = plan_service(config)
    assert [(m.name, m.model, m.image.replicas) for m in plan.models] == [("new", "tiny-siglip2", 2),
                                                                         ("old", "tiny-siglip", 1)]
    assert [t.deployment.name for t in plan.towers()] == ["Encoder-new", "Encoder-old", "TextEncoder-old"]
    assert {t.served_as for t in plan.named("old").towers.values()} == {"old"}  # what its replicas publish
    assert plan.needs()["CPU"] == 3 * 1.0 + 0.5 + 0.5  # every model's replicas beside the one ingress


@pytest.mark.parametrize("models, words", [
    ([{"model": "tiny-siglip"}], "give each model a name"),
    ([{"name": "a b"}], "give each model a name"),
    ([{"name": "a"}, {"name": "a"}], "named twice"),
    ([{"name": "a", "port": 1}], "port belong to the service"),
    ([{"name": "a", "buckets": [0]}], "models[0] (a): buckets"),
    ([{"name": "a", "replicas": 1}, {"name": "b"}], "models b: with several models name each one's replicas"),
])
def test_a_bad_models_entry_is_refused_naming_it(models: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_service(ServiceConfig.from_args({"models": models}))
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_default_model_must_be_served() -> None:
    with pytest.raises(ConfigError, match="'c' is none of the models: a, b"):
        plan_service(ServiceConfig.from_args({"replicas": 1, "default_model": "c",
                                              "models": [{"name": "a"}, {"name": "b"}]}))
    with pytest.raises(ConfigError, match="is not a served model"):
        plan_service(ServiceConfig.from_args({"model": "tiny-siglip", "replicas": 1, "default_model": "other"}))


def test_two_models_on_one_neuron_node_hold_cores_of_their_own_that_must_fit_it_together() -> None:
    """Each model's replicas ask Ray for whole `neuron_cores` (Ray hands each actor core ids no other actor
    holds, and sets NEURON_RT_VISIBLE_CORES to them), and the plan counts every model's cores against the node:
    two models never share a core, and a node too small for both is refused rather than oversubscribed."""
    from siglip_serve.serve.plan.cluster_fit import check_cluster_fits

    config = ServiceConfig.from_args({
        "ingress_replicas": 1, "text_replicas": 0,
        "models": [{"name": "old", "model": "tiny-siglip", "replicas": 2, "neuron_cores_per_replica": 1},
                   {"name": "new", "model": "tiny-siglip2", "replicas": 2, "neuron_cores_per_replica": 1}]})
    plan = plan_service(config)
    for name, cores in (("old", 1), ("new", 1)):
        image = plan.named(name).image
        assert image.deployment.ray_actor_options["resources"] == {"neuron_cores": cores}
        assert image.visible_devices_env == ("NEURON_RT_VISIBLE_CORES",)  # what each replica publishes
    assert plan.needs()["neuron_cores"] == 2 + 2
    check_cluster_fits(plan, total={"CPU": 16.0, "neuron_cores": 4.0})
    with pytest.raises(ConfigError, match="needs 4 neuron_cores .* declares 3"):
        check_cluster_fits(plan, total={"CPU": 16.0, "neuron_cores": 3.0})


def test_run_pins_each_deployment_to_its_own_slice_so_adding_a_model_leaves_the_others_towers_alone() -> None:
    from ray.serve import Application

    base = {"replicas": 1, "text_replicas": 0, "ingress_replicas": 1}
    one = ServiceConfig.from_args({**base, "models": [{"name": "a", "model": "tiny-siglip"}]})
    two = ServiceConfig.from_args({**base, "models": [{"name": "a", "model": "tiny-siglip"},
                                                      {"name": "b", "model": "tiny-siglip2"}]})

    def versions(config: ServiceConfig, live: dict[str, Any] | None = None) -> dict[str, str | None]:
        ingress = app.build(config, plan_service(config), live=live, pin=True)._bound_deployment
        towers = [bound._bound_deployment for model in ingress.init_args[0].values() for bound in model.values()
                  if isinstance(bound, Application)]
        return {deployment.name: deployment.version for deployment in (ingress, *towers)}

    first, second = versions(one), versions(two)
    assert set(first) == {"Ingress", "Encoder-a"} and set(second) == {"Ingress", "Encoder-a", "Encoder-b"}
    assert second["Encoder-a"] == first["Encoder-a"] and second["Ingress"] != first["Ingress"]
    # A live setting travels as the ingress's user_config: no version changes.
    assert versions(one, live={"retry_after_s": 5}) == first
    assert versions(one.model_copy(update={"batch_wait_timeout_s": 0.01})) != first  # a tower's own setting
    assert app.build(one, plan_service(one))._bound_deployment.version is None  # not pinned: Serve's own
