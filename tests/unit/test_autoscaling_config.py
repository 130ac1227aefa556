"""The autoscaling surface: validated at start, contradictions refused in one line, Serve's options derived."""

import pytest

from siglip_serve.serve.config import ConfigError, ServiceConfig

BASE = {"model": "tiny-siglip", "random_weights": True, "backend": "cpu"}


def test_autoscaling_passes_serves_options_with_the_derived_target() -> None:
    config = ServiceConfig.from_args({**BASE, "autoscaling": {"min_replicas": 1, "max_replicas": 3}})
    options = config.autoscaling_config()
    assert options is not None
    assert (options["min_replicas"], options["max_replicas"], options["target_ongoing_requests"]) == (1, 3, 1)
    assert config.replica_setting == 3  # admission and the coalescing window are sized for the most
    assert ServiceConfig.from_args(BASE).autoscaling_config() is None


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
