"""Host-bound or device-bound (measure/bound.py): the lower ceiling is the limit, served is judged against it."""

from __future__ import annotations

import pytest

from siglip_serve.measure.bound import judge


def test_a_host_that_cannot_carry_the_devices_rate_is_the_limit() -> None:
    bound = judge(host_ceiling=120.0, device=3200.0, served=110.0)
    assert bound.verdict == "host-bound"
    assert bound.served_over_limit == pytest.approx(110 / 120)
    assert "120.0 img/s" in bound.explanation and "92%" in bound.explanation


def test_a_slow_model_behind_a_fast_host_is_device_bound() -> None:
    bound = judge(host_ceiling=250.0, device=3.4, served=3.2)
    assert bound.verdict == "device-bound" and bound.served_over_limit == pytest.approx(3.2 / 3.4)


def test_without_a_served_figure_only_the_verdict_is_given_and_nonsense_is_refused() -> None:
    assert judge(10.0, 20.0, None).served_over_limit is None
    with pytest.raises(ValueError):
        judge(0.0, 20.0, None)


def test_a_client_that_used_a_whole_core_at_the_top_level_is_the_limit_whatever_the_ceilings() -> None:
    # The figures of a host whose one client process topped out: the ceiling looks host-bound, and is not.
    bound = judge(host_ceiling=195.0, device=1328.0, served=190.0, client_busiest=0.97)
    assert bound.verdict == "client-bound" and bound.served_over_limit is None
    assert bound.explanation.startswith("raise --client-processes") and "0.97 of a core" in bound.explanation
    assert bound.client_busiest_core_fraction == 0.97
    assert judge(250.0, 3.4, 3.2, client_busiest=0.85).verdict == "client-bound"  # the threshold counts
    # Below it, or not measured, the ceilings decide as before.
    assert judge(195.0, 1328.0, 190.0, client_busiest=0.84).verdict == "host-bound"
    assert judge(250.0, 3.4, 3.2, client_busiest=0.3).verdict == "device-bound"
    assert judge(195.0, 1328.0, 190.0).client_busiest_core_fraction is None
