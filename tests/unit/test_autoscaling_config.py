"""The autoscaling surface: validated at start, contradictions refused in one line, Serve's options derived."""

import pytest

from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.planner import plan_service

BASE = {"model": "tiny-siglip", "random_weights": True, "backend": "cpu"}


def test_autoscaling_passes_serves_options_with_the_derived_target() -> None:
    config = ServiceConfig.from_args({**BASE, "autoscaling": {"min_replicas": 1, "max_replicas": 3}})
    image = plan_service(config).model.image
    options = image.deployment.autoscaling_config
    assert options is not None and image.deployment.num_replicas is None
    assert (options["min_replicas"], options["max_replicas"], options["target_ongoing_requests"]) == (1, 3, 1)
    assert image.replicas == 3 and image.min_replicas == 1  # admission and coalescing are sized for the most
    assert plan_service(ServiceConfig.from_args(BASE)).model.image.deployment.autoscaling_config is None


@pytest.mark.parametrize("bad, words", [
    ({"replicas": 2, "autoscaling": {"max_replicas": 2}}, "contradict"),
    ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas 3 > max_replicas 2"),
    ({"autoscaling": {"max_replicas": 2, "upscale": 1}}, "upscale"),
])
def test_contradictions_are_refused_in_one_line(bad: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        ServiceConfig.from_args({**BASE, **bad})
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


INGRESS = {"min_replicas": 1, "max_replicas": 4, "target_busy_cores": 1.5}


def test_ingress_autoscaling_gives_serve_our_policy_and_plans_for_its_floor() -> None:
    from ray.serve.config import AutoscalingConfig

    from siglip_serve.serve.plan.ingress_scaling import BusyCoresPolicy

    config = ServiceConfig.from_args({**BASE, "ingress_autoscaling": INGRESS})
    planned = plan_service(config).ingress
    options = planned.deployment.autoscaling_config
    assert options is not None and "target_busy_cores" not in options
    serve_config = AutoscalingConfig(**options)  # Serve accepts it as it is
    assert (serve_config.min_replicas, serve_config.max_replicas) == (1, 4)
    policy = serve_config.policy
    assert policy.policy_kwargs == {"target_busy_cores": 1.5}
    assert policy.get_policy() is BusyCoresPolicy
    # Each ingress plans its share of the encoder calls for the fewest ingress replicas: never too few.
    assert planned.replicas == 1 and planned.max_replicas == 4
    assert plan_service(ServiceConfig.from_args(BASE)).ingress.deployment.autoscaling_config is None


def test_ingress_autoscaling_with_a_fixed_count_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        ServiceConfig.from_args({**BASE, "ingress_replicas": 2, "ingress_autoscaling": INGRESS})
    assert "contradict" in str(refused.value) and "\n" not in str(refused.value)


def _context(busy: dict[str, float] | None, current: int) -> object:
    """Serve's own AutoscalingContext, filled as its controller fills it for our policy."""
    from ray.serve._private.common import DeploymentID
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    return AutoscalingContext(
        deployment_id=DeploymentID(name="Ingress", app_name="app"), deployment_name="Ingress", app_name="app",
        current_num_replicas=current, target_num_replicas=current, running_replicas=[], total_num_requests=0.0,
        total_queued_requests=0.0, aggregated_metrics={"busy_cores": busy} if busy is not None else {},
        raw_metrics={}, capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={},
        last_scale_up_time=None, last_scale_down_time=None, current_time=None,
        config=AutoscalingConfig(min_replicas=1, max_replicas=8))


@pytest.mark.parametrize("busy, current, desired", [
    ({"a": 3.0, "b": 3.0}, 2, 4.0),  # both at twice the target: twice the replicas
    ({"a": 0.4, "b": 0.2}, 2, 0.4),  # nearly idle: Serve's bounds then keep min_replicas
    ({"a": 2.0}, 3, 4.0),            # two replicas not reported yet count as the mean
    (None, 2, 2),                    # no report at all: keep what there is
])
def test_the_ingress_policy_asks_for_the_replicas_that_put_each_at_the_target(
        busy: dict[str, float] | None, current: int, desired: float) -> None:
    from siglip_serve.serve.plan.ingress_scaling import BusyCoresPolicy

    wanted, state = BusyCoresPolicy(target_busy_cores=1.5)(_context(busy, current))
    assert wanted == pytest.approx(desired) and state == {}


def test_busy_cores_start_counting_at_the_first_read() -> None:
    import time

    from siglip_serve.serve.plan.ingress_scaling import BusyCores

    meter = BusyCores()
    assert meter.read() == 0.0  # the replica's start is not load
    wall, cpu = time.monotonic(), time.process_time()
    end = cpu + 0.05
    while time.process_time() < end:  # one core busy for 50 ms of its own time
        pass
    # What this process used over the same window, measured here: a loaded machine (the suite's other worker)
    # gives the loop less than a whole core, and the meter must say so, not 1.
    used = (time.process_time() - cpu) / (time.monotonic() - wall)
    read = meter.read()
    assert 0 < read <= 1.5 and abs(read - used) < 0.1, (read, used)


def test_a_local_ray_gets_cpus_for_the_ingress_ceiling() -> None:
    from siglip_serve.launcher.runner import ray_resources

    fixed = ServiceConfig.from_args({**BASE, "ingress_replicas": 1, "ingress_num_cpus": 8, "text_replicas": 0})
    scaled = ServiceConfig.from_args({**BASE, "ingress_autoscaling": {**INGRESS, "max_replicas": 4},
                                      "ingress_num_cpus": 8, "text_replicas": 0})
    assert (ray_resources(plan_service(scaled.model_copy(update={"replicas": 1})))["num_cpus"]
            - ray_resources(plan_service(fixed.model_copy(update={"replicas": 1})))["num_cpus"]) == 3 * 8
