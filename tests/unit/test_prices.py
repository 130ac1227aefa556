"""Dollars per million images (measure/prices.py): the arithmetic, the price table and its options, and what
`siglip-serve bench` and `loadtest` print and write with a price and without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from siglip_serve.loadtest import cli as loadtest_cli
from siglip_serve.loadtest.summary import build_summary, format_summary
from siglip_serve.measure import bench_cli, prices
from siglip_serve.measure.bench import bare_price_line
from siglip_serve.measure.load_results import LatencyMs, RunResults, Step
from siglip_serve.measure.prices import Price, PriceError, bare_price, price_of, read_table, usd_per_million
from siglip_serve.measure.results import Machine

ENTRY = """
[[instances]]
instance = "example.8xgpu"
usd_per_hour = 72.0
accelerators = 8
region = "nowhere-1"
date = "2026-12-05"
source = "a test's made-up entry"
"""


def test_a_million_images_cost_the_hours_they_take() -> None:
    # 1,000 images a second: a million in 1,000 s, 0.2778 of an hour.
    assert usd_per_million(1000.0, 3.6) == pytest.approx(1.0)
    assert usd_per_million(250.0, 3.6) == pytest.approx(4.0)
    assert usd_per_million(0.0, 3.6) is None and usd_per_million(None, 3.6) is None


def test_a_bare_figure_counts_the_instances_accelerators_up_to_the_host_ceiling() -> None:
    price = Price(usd_per_hour=7.2, accelerators=4)
    free = bare_price(price, 32, per_accelerator=500.0, host_ceiling=None)
    assert free.images_per_second == 2000.0 and not free.capped_by_host_ceiling
    assert free.usd_per_million_images == pytest.approx(1.0)
    above = bare_price(price, 32, per_accelerator=500.0, host_ceiling=3000.0)  # the host carries more: no cap
    assert above.images_per_second == 2000.0 and not above.capped_by_host_ceiling
    host_bound = bare_price(price, 32, per_accelerator=500.0, host_ceiling=1000.0)
    assert host_bound.images_per_second == 1000.0 and host_bound.capped_by_host_ceiling
    assert host_bound.usd_per_million_images == pytest.approx(2.0)
    assert "x 4, capped at the host ceiling's 1000.0: $2.00 per 1M images" in bare_price_line(host_bound, price)
    assert (prices.dollars(12.345), prices.dollars(0.0012345), prices.dollars(None)) == ("$12.35", "$0.00123", "-")


def test_the_shipped_table_is_empty_and_says_what_fills_it() -> None:
    assert read_table() == {}
    text = prices.TABLE.read_text()
    assert "EMPTY" in text and "shared/seeds/" in text and "aws.amazon.com/ec2/pricing/on-demand" in text
    with pytest.raises(PriceError, match="is empty: fill it from AWS's EC2 on-demand pricing page.*shared/seeds/"):
        price_of(None, None, "trn2.3xlarge")


def test_an_instance_from_a_table_and_the_options_over_it(tmp_path: Path) -> None:
    table = tmp_path / "prices.toml"
    table.write_text(ENTRY)
    listed = price_of(None, None, "example.8xgpu", table)
    assert listed == Price(72.0, 8, "example.8xgpu", "nowhere-1", "2026-12-05", "a test's made-up entry")
    assert "$72/h (example.8xgpu, 8 accelerators; nowhere-1, 2026-12-05" in listed.label()
    over = price_of(60.0, 4, "example.8xgpu", table)
    assert over is not None and (over.usd_per_hour, over.accelerators) == (60.0, 4)
    assert over.source == "--price-per-hour over a test's made-up entry"
    with pytest.raises(PriceError, match="lists only example.8xgpu"):
        price_of(None, None, "other", table)
    table.write_text(ENTRY.replace('region = "nowhere-1"\n', ""))
    with pytest.raises(PriceError, match="entry 1 needs instance, usd_per_hour"):
        read_table(table)
    table.write_text("instances = [")
    with pytest.raises(PriceError, match="is not TOML"):
        read_table(table)


def test_without_a_price_nothing_is_priced_and_a_bad_one_is_refused() -> None:
    assert price_of(None, None, None) is None
    assert price_of(2.5, None, None) == Price(2.5, 1)
    with pytest.raises(PriceError, match="--accelerators prices a bare figure"):
        price_of(None, 8, None)
    with pytest.raises(PriceError, match="positive number of dollars"):
        price_of(-1.0, None, None)
    with pytest.raises(PriceError, match="at least 1"):
        price_of(1.0, 0, None)


def test_bench_takes_the_price_and_refuses_an_unknown_instance_before_it_measures(
        caplog: pytest.LogCaptureFixture) -> None:
    args = bench_cli.build_parser().parse_args(["--price-per-hour", "2.5", "--accelerators", "8"])
    assert prices.price_from_args(args) == Price(2.5, 8)
    assert prices.price_from_args(bench_cli.build_parser().parse_args([])) is None
    assert bench_cli.main(["--model", "tiny-siglip", "--instance", "trn2.3xlarge"]) == 2
    assert "--instance trn2.3xlarge: the price table" in caplog.text


def run_results(steps: list[tuple[int, float]]) -> RunResults:
    windows = [Step(users=users, t_start=0.0, t_end=10.0, seconds=10.0, requests=int(ips * 10), failures=0,
                    images=int(ips * 10), fail_ratio=0.0, images_per_second=ips, requests_per_second=ips,
                    latency_ms=LatencyMs(p50=10.0, p95=20.0, p99=30.0)) for users, ips in steps]
    return RunResults(started_at=0.0, request_name="raw", images_per_request=1, requests=1000, failures=0,
                      images=1000, duration_s=20.0, images_per_second=50.0, requests_per_second=50.0,
                      latency_ms=LatencyMs(p50=10.0, p95=20.0, p99=30.0), failure_reasons={}, windows=windows,
                      timeline=[], server=None, client=Machine(host="h"), notes=[])


def test_loadtest_prices_the_run_each_step_and_the_saturation_point() -> None:
    results = run_results([(8, 40.0), (16, 60.0)])
    plain = build_summary(results, {}, {}, None, 0.01, None, 500.0, 0.01)
    assert plain.price is None and plain.usd_per_million_images is None
    assert "$" not in format_summary(plain)
    summary = build_summary(results, {}, {}, None, 0.01, None, 500.0, 0.01, price=Price(3.6, 1))
    assert summary.usd_per_million_images == pytest.approx(20.0)  # $3.60 an hour at 50 img/s
    assert [s.usd_per_million_images for s in summary.steps] == pytest.approx([25.0, 1e6 / 60 / 1000])
    assert summary.saturation is not None and summary.saturation.usd_per_million_images == pytest.approx(
        summary.steps[1].usd_per_million_images)
    assert results.windows[0].usd_per_million_images is None  # the recorder's rows stay as recorded
    text = format_summary(summary)
    assert "$20.00 per 1M images at $3.6/h (1 accelerator)" in text and "$/1M img" in text
    assert "$25.00" in text and "per 1M images" in text.splitlines()[-1]
    dumped = summary.model_dump(mode="json")
    assert dumped["price"]["usd_per_hour"] == 3.6 and dumped["steps"][0]["usd_per_million_images"] == 25.0


def test_loadtest_refuses_an_unknown_instance_before_locust_starts() -> None:
    args = loadtest_cli.build_parser().parse_args(["--instance", "trn2.48xlarge"])
    with pytest.raises(PriceError, match="--instance trn2.48xlarge"):
        loadtest_cli.check_args(args)
    args = loadtest_cli.build_parser().parse_args(["--price-per-hour", "1.5"])
    loadtest_cli.check_args(args)
    assert args.price == Price(1.5, 1) and "price" not in loadtest_cli.settings_of(args)
