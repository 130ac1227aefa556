"""A start on fewer cores than replicas runs the replicas the first answer needs first (serve/plan/start_order.py), and
the second wave adds the rest to the same deployments: same versions, so Serve keeps the first wave's replicas."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ray.serve import Application

from siglip_serve.serve.app import build
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.start_order import first_wave, starting_replicas

TWO_CORES = {"CPU": 2.0}


def _plan(**args: Any) -> tuple[ServiceConfig, Any]:
    config = ServiceConfig.from_args({"model": "tiny-siglip", "torch_threads": 1, **args})
    return config, plan_service(config, TWO_CORES)


def test_on_two_cores_one_image_replica_and_the_text_replica_start_first() -> None:
    _, plan = _plan(replicas=2)
    assert starting_replicas(plan) == 4  # the ingress, two image replicas, one text replica
    assert first_wave(plan, cores=2) == {"tiny-siglip": 1}
    assert first_wave(plan, cores=1) == {"tiny-siglip": 1}  # never below what /readyz counts
    assert first_wave(plan, cores=4) is None  # as many cores as replicas: all at once
    _, eight = _plan(replicas=8)
    assert first_wave(eight, cores=8) == {"tiny-siglip": 6}  # only as many deferred as the cores lack


@pytest.mark.parametrize("args", [
    {"replicas": 2, "min_ready_replicas": 2},  # /readyz waits for both: nothing to defer
    {"replicas": 1},
    {"autoscaling": {"min_replicas": 1, "max_replicas": 3}},  # Serve starts it at its floor already
    {"replicas": 3, "interactive_encoder": True},  # the kept replica is one the first answer may need
])
def test_nothing_is_deferred_where_the_first_answer_may_need_it_or_serve_starts_low(args: dict[str, Any],
                                                                                   tmp_path: Path) -> None:
    if args.get("interactive_encoder"):
        (tmp_path / "keys.toml").write_text('[[keys]]\nname = "a"\nkey = "a-secret"\nlane = "interactive"\n')
        args = {**args, "api_keys_file": str(tmp_path / "keys.toml")}
    _, plan = _plan(**args)
    assert first_wave(plan, cores=1) is None


def _image_deployment(app: Application) -> Any:
    (towers,) = app._bound_deployment.init_args[0].values()
    return towers["image"]._bound_deployment


def test_the_first_wave_is_the_same_deployment_with_fewer_replicas() -> None:
    config, plan = _plan(replicas=2)
    first = _image_deployment(build(config, plan, pin=True, first_wave=first_wave(plan, cores=2)))
    whole = _image_deployment(build(config, plan, pin=True, say=False))
    assert (first.num_replicas, whole.num_replicas) == (1, 2)
    assert first.version == whole.version and first.init_args == whole.init_args


def test_a_second_wave_that_fails_leaves_the_first_serving(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from ray import serve

    from siglip_serve.launcher.runner import second_wave

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("Deploying app 'siglip' failed")

    monkeypatch.setattr(serve, "run", refused)
    config, plan = _plan(replicas=2)
    assert second_wave(config, plan, {}, threading.Event(), time.monotonic()) is False
    assert "the other encoder replicas did not start (RuntimeError: Deploying app 'siglip' failed)" in caplog.text
