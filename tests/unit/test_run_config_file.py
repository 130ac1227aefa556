"""`siglip-serve run --config FILE` and its SIGHUP (launcher/reload.py): the file under the variables and flags, read
again on SIGHUP, a live change handed on, one that needs a restart refused naming its keys; the systemd unit's
ExecReload= and the session relay that carries it."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from siglip_serve.launcher import cli, session
from siglip_serve.launcher.reload import Reload
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from tests.helpers import read_unit


def _settings(path: Path, *argv: str, environ: dict[str, str] | None = None) -> ServiceConfig:
    args = cli.build_parser().parse_args(["--config", str(path), *argv])
    return ServiceConfig.from_args(cli.run_settings(args, environ or {}))


def test_the_file_is_under_the_variables_and_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model: tiny-siglip\nretry_after_s: 3\nrequest-timeout-s: 12\ndecode_threads: 2\n")
    config = _settings(path)
    assert (config.model, config.retry_after_s, config.request_timeout_s, config.decode_threads) == (
        "tiny-siglip", 3, 12.0, 2)
    config = _settings(path, "--set", "retry_after_s=5", environ={"SIGLIP_RETRY_AFTER_S": "4",
                                                                  "SIGLIP_DECODE_THREADS": "6"})
    assert (config.retry_after_s, config.decode_threads) == (5, 6)


@pytest.mark.parametrize(("text", "error"), [("- a\n- b\n", "holds a list, not a mapping"),
                                             ("a: [\n", "is not YAML")])
def test_a_file_that_is_no_mapping_is_refused_naming_it(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        _settings(path)
    with pytest.raises(ConfigError, match="cannot read"):
        _settings(tmp_path / "gone.yaml")


def test_sighup_hands_on_a_live_change_and_refuses_one_that_needs_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model: tiny-siglip\n")
    args = cli.build_parser().parse_args(["--config", str(path)])
    reload = Reload(lambda: cli.service_config(args, {}), cli.service_config(args, {}))
    caplog.set_level(logging.INFO, "siglip_serve")
    assert reload.changed() is None and "no setting changed" in caplog.text

    path.write_text("model: tiny-siglip\nretry_after_s: 9\n")
    change = reload.changed()
    assert change is not None and change.live["retry_after_s"] == 9 and "retry_after_s 1 -> 9" in caplog.text
    assert not change.replan  # the plan stays
    reload.applied(change)
    assert reload.changed() is None

    path.write_text("model: tiny-siglip\nretry_after_s: 2\ndecode_threads: 2\nmax_images_per_request: 4\n")
    assert reload.changed() is None
    assert "decode_threads, max_images_per_request cannot change without a restart" in caplog.text
    path.write_text("model: tiny-siglip\nretry_after_s: 0\n")
    assert reload.changed() is None and "reload refused: invalid siglip-serve config" in caplog.text
    assert reload.in_force["retry_after_s"] == 9


def test_sighup_changes_the_models_of_a_config_that_lists_them_checked_as_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With `models:`, the entries (and default_model) may change on SIGHUP: the new settings go through `run`'s
    checks again, and a model that fails them refuses the whole reload; one model without `models:` cannot
    become several, which is a restart."""
    path = tmp_path / "config.yaml"
    one = "models:\n  - {name: a, model: tiny-siglip, replicas: 1}\n"
    two = one + "  - {name: b, model: tiny-siglip2, replicas: 1}\n"
    path.write_text(one)
    args = cli.build_parser().parse_args(["--config", str(path)])
    checked: list[list[str]] = []

    def check(config: ServiceConfig) -> str | None:
        names = [entry.name for entry in config.models]
        if "bad" in names:
            raise ConfigError("model bad: no weights")
        checked.append(names)
        return "what the checks found"

    reload = Reload(lambda: cli.service_config(args, {}), cli.service_config(args, {}), check)
    caplog.set_level(logging.INFO, "siglip_serve")
    path.write_text(two)
    change = reload.changed()
    assert change is not None and change.replan and checked == [["a", "b"]]
    assert change.asked == cli.service_config(args, {}) and change.text_off == "what the checks found"
    assert "reload: models a (default) -> a (default), b" in caplog.text
    reload.applied(change)
    assert reload.changed() is None  # in force now

    path.write_text(two + "  - {name: bad, model: tiny-siglip, replicas: 1}\n")
    assert reload.changed() is None and "reload refused: model bad: no weights; nothing changed" in caplog.text
    path.write_text(two + "decode_threads: 2\n")
    assert reload.changed() is None and "decode_threads cannot change without a restart" in caplog.text

    single = Reload(lambda: ServiceConfig.from_args({"model": "tiny-siglip2"}),
                    ServiceConfig.from_args({"model": "tiny-siglip"}), check)
    assert single.changed() is None and "model cannot change without a restart" in caplog.text


def test_without_a_file_sighup_touches_the_keys_file_only(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[keys]]\nname = "a"\nkey = "a"\n')
    before = keys.stat().st_mtime_ns
    reload = Reload(None, ServiceConfig.from_args({"model": "tiny-siglip", "api_keys_file": str(keys)}))
    os.utime(keys, ns=(before - 10**9, before - 10**9))
    assert reload.changed() is None
    assert keys.stat().st_mtime_ns > before - 10**9


def test_the_unit_reloads_by_sighup_to_the_main_process_which_relays_it() -> None:
    assert read_unit()["Service"]["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert signal.SIGHUP in session.RELAYED


def test_serves_logging_is_quiet_unless_asked_and_the_same_for_run_and_the_benchmark() -> None:
    """launcher/runner.py serve_logging: what `run` and the served benchmark (measure/served.py) hand Serve."""
    from siglip_serve.launcher.runner import serve_logging

    replicas, system = serve_logging(ServiceConfig.from_args({}))
    assert replicas == {"enable_access_log": False, "log_level": "INFO"}
    assert system == {"enable_access_log": False, "log_level": "WARNING"}
    replicas, system = serve_logging(ServiceConfig.from_args({"access_log": True}))
    assert replicas["enable_access_log"] and system == {"enable_access_log": True, "log_level": "INFO"}
    assert serve_logging(ServiceConfig.from_args({"log_level": "DEBUG"}))[1]["log_level"] == "DEBUG"
