"""The load-test options are declared once (loadtest/options.py): what `siglip-serve loadtest` parses is
what Locust's side parses from the command line it is handed, and each flag means one thing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from siglip_serve.loadtest import cli
from siglip_serve.loadtest.options import OPTIONS, add_options, locust_arguments, parse_duration


def locust_side(argv: list[str]) -> argparse.Namespace:
    """Locust's parser as locustfile.py extends it (argparse stands in for Locust's configargparse)."""
    parser = argparse.ArgumentParser()
    add_options(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("argv", [
    [],
    ["--endpoint", "json", "--images-per-request", "4", "--encoding-format", "base64", "--expect-dim", "768"],
    ["--step-users", "2", "--step-time", "1m30s", "--max-users", "8", "--p99-target-ms", "250",
     "--step-max-fail-ratio", "0.05", "--progress-every", "2"],
])
def test_locust_reads_what_the_cli_parsed(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    handed = locust_side(locust_arguments(args))
    for option in OPTIONS:
        assert getattr(handed, option.dest) == getattr(args, option.dest), option.flag


def test_each_flag_means_one_thing() -> None:
    # The run's pass/fail threshold stays on the CLI; the step shape's own limit has its own name.
    args = cli.build_parser().parse_args(["--max-fail-ratio", "0.2", "--step-max-fail-ratio", "0.03"])
    handed = locust_arguments(args)
    assert "--max-fail-ratio" not in handed and handed[handed.index("--step-max-fail-ratio") + 1] == "0.03"
    assert parse_duration("90") == parse_duration("1m30s") == 90.0 and parse_duration("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")


def test_a_load_test_is_a_backfill_and_the_mixed_scenario_adds_interactive_users(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args([])
    assert args.priority == 2  # the bulk lane (core/lanes.py)
    assert locust_side(locust_arguments(args)).priority == 2
    command = cli.locust_command(args, tmp_path)
    assert command[-1] == "SiglipUser" and "InteractiveUser" not in command
    # The request in flight at the end is finished and counted, as the server counts it (the cross-check).
    assert command[command.index("--stop-timeout") + 1] == "60"
    mixed = cli.build_parser().parse_args(["--users", "32", "--interactive-users", "2"])
    command = cli.locust_command(mixed, tmp_path)
    assert command[-2:] == ["SiglipUser", "InteractiveUser"]
    assert command[command.index("--users") + 1] == "34"
    table = cli.format_lanes({"interactive": {"users": 2, "requests_per_second": 50.0, "images_per_second": 50.0,
                                              "p50_ms": 20, "p99_ms": 40, "failures": 0}})
    assert "interactive" in table and "40" in table
