"""The shared command-line plumbing (models/cli_args.py): options from the settings models, one
KEY=VALUE parser, one error path. In-process and quick: nothing here starts Ray or loads a model."""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from siglip_serve.core.backends import BACKENDS
from siglip_serve.core.cli import SettingsError, key_value, run_main, settings_values
from siglip_serve.core.errors import UserError
from siglip_serve.launcher import cli
from siglip_serve.measure import bench_cli, multicore
from siglip_serve.models.cli_args import BACKEND_OPTIONS, MODEL_OPTIONS
from siglip_serve.models.neuron import cli as compile_cli
from siglip_serve.models.neuron import trace as neuron_compile
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.config import ServiceConfig


def model_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of the parser's 'model' group (a subcommand's parser for siglip-serve)."""
    (group,) = (g for g in parser._action_groups if g.title == "model")
    return {s for action in group._group_actions for s in action.option_strings}


def subcommand(name: str) -> argparse.ArgumentParser:
    return {"run": cli.build_parser, "bench": bench_cli.build_parser}[name]()


def flags(names: tuple[str, ...]) -> set[str]:
    return {"--" + n.replace("_", "-") for n in names}


def test_every_model_command_takes_the_same_model_flags() -> None:
    with_backend = flags(MODEL_OPTIONS + BACKEND_OPTIONS)
    assert {"--seed", "--cuda-dtype"} <= with_backend
    for parser in (subcommand("run"), subcommand("bench"), multicore.build_parser()):
        assert model_flags(parser) == with_backend
    # The compile commands pick their own --backend (a Neuron line); the rest is the same list, and both
    # Neuron lines build the text tower from the same --text-buckets.
    for compiler in (neuron_compile.build_parser(), compile_cli.build_native_parser()):
        assert model_flags(compiler) == flags(MODEL_OPTIONS) | {"--text-buckets"}


def test_flags_read_their_help_and_choices_from_the_settings_fields() -> None:
    run = subcommand("run")
    actions = {a.dest: a for a in run._actions}
    assert actions["backend"].choices == list(BACKENDS)
    assert actions["cuda_dtype"].choices == ["bf16", "fp16", "fp32"]
    assert actions["seed"].type is int and actions["seed"].default is None
    for name in MODEL_OPTIONS + BACKEND_OPTIONS + cli.SERVICE_OPTIONS:
        description = ServiceConfig.model_fields[name].description
        assert description and actions[name].help.startswith(description.replace("%", "%%")), name
    # Two weights sources at once is a usage error before any settings are built.
    with pytest.raises(SystemExit):
        run.parse_args(["--checkpoint", "model.pt", "--random-weights"])


def test_every_settings_field_is_described() -> None:
    missing = [name for name, field in ServiceConfig.model_fields.items() if not field.description]
    assert missing == []
    assert set(ModelSettings.model_fields) <= set(ServiceConfig.model_fields)


def test_backend_registry_reads_the_one_list() -> None:
    from siglip_serve.core.backends import BUILTIN, names

    assert tuple(record.name for record in BUILTIN) == BACKENDS and set(BACKENDS) <= set(names())


def test_run_flags_reach_the_service_config(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("secret\n")
    args = cli.build_parser().parse_args(
        ["--log-level", "DEBUG", "--model", "tiny-siglip", "--seed", "3", "--cuda-dtype", "fp16",
         "--replicas", "2", "--access-log", "--api-key-file", str(key_file), "--set", "max-queued-requests=8",
         "--set", "buckets=[1, 2]", "--set", "replicas=5"])
    config = ServiceConfig.from_args(cli.run_settings(args))
    assert (config.model, config.seed, config.cuda_dtype, config.buckets) == ("tiny-siglip", 3, "fp16", (1, 2))
    assert config.replicas == 2  # the flag wins over --set, as before
    assert config.max_queued_requests == 8 and config.access_log and config.log_level == "DEBUG"
    assert config.key_to_send(config.api_keys_file, {}) == "secret"
    auto = cli.build_parser().parse_args(["--backend", "neuron", "--replicas", "auto"])
    assert ServiceConfig.from_args(cli.run_settings(auto)).replicas == "auto"


def test_every_config_key_is_also_an_environment_variable_below_the_flags(caplog) -> None:
    """SIGLIP_<KEY> in any case; a list as JSON; a flag or --set over the variable, the variable over the
    default; a SIGLIP_ name that is no key is named in a warning; $SIGLIP_API_KEY is never a setting."""
    environ = {"SIGLIP_REPLICAS": "3", "siglip_buckets": "[1, 4]", "SIGLIP_MAX_QUEUED_REQUESTS": "8",
               "SIGLIP_LOG_LEVEL": "WARNING", "SIGLIP_API_KEY": "from-env", "SIGLIP_REPLCIAS": "9", "PATH": "/bin",
               # Variables of ours that are no keys: the HAProxy front end's, the systemd unit's.
               "SIGLIP_HAPROXY_LIMITS_DIR": "/tmp/x", "SIGLIP_SERVE_MODEL": "--model tiny-siglip"}
    plain = cli.build_parser().parse_args(["--model", "tiny-siglip"])
    with caplog.at_level(logging.WARNING, logger="siglip_serve"):
        config = ServiceConfig.from_args(cli.run_settings(plain, environ))
    assert (config.replicas, config.buckets, config.max_queued_requests) == (3, (1, 4), 8)
    assert config.log_level == "WARNING" and config.api_key is None
    assert [r.getMessage() for r in caplog.records] == [
        "SIGLIP_REPLCIAS is neither a config key nor a variable siglip-serve reads: ignored"]
    flags = cli.build_parser().parse_args(["--model", "tiny-siglip", "--replicas", "1", "--set", "buckets=[2]",
                                           "--log-level", "DEBUG"])
    config = ServiceConfig.from_args(cli.run_settings(flags, environ))
    assert (config.replicas, config.buckets, config.log_level, config.max_queued_requests) == (1, (2,), "DEBUG", 8)
    assert ServiceConfig.from_args(cli.run_settings(plain, {})).replicas == ServiceConfig().replicas


def test_models_from_the_environment_are_typed_entries_each_setting_what_it_names() -> None:
    environ = {"SIGLIP_SEED": "5", "SIGLIP_MODELS": '[{"name": "a", "model": "tiny-siglip", "seed": 0}, '
                                                    '{"name": "b", "model": "tiny-siglip2"}]'}
    config = ServiceConfig.from_args(cli.run_settings(cli.build_parser().parse_args([]), environ))
    assert [(entry.name, entry.own()) for entry in config.models] == [("a", {"model": "tiny-siglip", "seed": 0}),
                                                                       ("b", {"model": "tiny-siglip2"})]
    with pytest.raises(SettingsError, match="port belong to the service, not one model"):
        cli.run_settings(cli.build_parser().parse_args([]), {"SIGLIP_MODELS": '[{"name": "a", "port": 1}]'})


def test_a_bad_environment_value_is_a_usage_error_naming_the_key(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SIGLIP_REPLICAS", "three")
    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", "tiny-siglip", "--print-plan"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "a SIGLIP_<KEY> variable is invalid: replicas" in err and "Traceback" not in err


def test_the_environment_gives_run_its_replicas(monkeypatch, capsys) -> None:
    """What the plan (--print-plan: nothing started) deploys for SIGLIP_REPLICAS=3."""
    monkeypatch.setenv("SIGLIP_REPLICAS", "3")
    assert cli.main(["--model", "tiny-siglip", "--random-weights", "--print-plan"]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    assert (model["image"]["replicas"], model["image"]["deployment"]["num_replicas"]) == (3, 3)


KEY = "s3cret-on-the-command-line"


@pytest.mark.parametrize("given", [["--api-key", KEY], [f"--api-key={KEY}"], ["--set", f"api_key={KEY}"],
                                   ["--set", f"api-key={KEY}"]])
def test_run_refuses_a_key_on_its_command_line_before_any_child_starts(
        given: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from siglip_serve.launcher import session

    started: list[list[str]] = []
    # Stands in for the relayed service (it would start Ray): records that one was asked for.
    monkeypatch.setattr(session, "run_in_own_session", lambda argv, *_: started.append(argv) or 0)
    monkeypatch.delenv(session.CHILD_ENV, raising=False)
    # Before: the relay and its child both ran with the key in their command lines (ps).
    with pytest.raises(SystemExit) as refused:
        cli.main(["--model", "tiny-siglip", *given])
    said = capsys.readouterr().err
    assert refused.value.code == 2 and started == []
    assert "--api-key-file" in said and "SIGLIP_API_KEY" in said and KEY not in said, said


def test_a_key_from_the_environment_reaches_a_joined_cluster_in_the_config_only() -> None:
    from siglip_serve.core.constants import API_KEY_ENV

    environ = {API_KEY_ENV: KEY}
    joined = cli.service_config(cli.build_parser().parse_args(["--address", "127.0.0.1:6379"]), environ)
    # The joined cluster's ingress does not see our environment; the Ray we start inherits it.
    assert joined.key_to_send(joined.api_keys_file, {}) == KEY
    local = cli.service_config(cli.build_parser().parse_args([]), environ)
    assert local.api_key is None and local.key_to_send(local.api_keys_file, environ) == KEY


def test_one_key_value_parser() -> None:
    assert key_value("application=siglip") == ("application", "siglip")
    assert key_value(" a =b=c") == ("a", "b=c")  # the value as written, '=' and all
    for bad in ("novalue", "=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            key_value(bad)
    assert settings_values([("max-queued-requests", "8"), ("buckets", "1,2"), ("access_log", "true")]) == {
        "max_queued_requests": 8, "buckets": "1,2", "access_log": True}
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--set", "novalue"])
    # A YAML value is typed: one bucket reads as an int, and still means one bucket.
    assert ServiceConfig.from_args(settings_values([("buckets", "4")])).buckets == (4,)


def test_run_main_turns_user_errors_into_one_line_and_keeps_bugs(capsys: pytest.CaptureFixture[str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    class Refused(UserError):
        exit_code = 5

    def refuse() -> int:
        raise Refused("the thing is missing; install it")

    assert run_main(refuse) == 5
    assert capsys.readouterr().err == "error: the thing is missing; install it\n"

    def invalid() -> int:
        ModelSettings(seed="x")  # type: ignore[arg-type]
        return 0

    log = logging.getLogger("siglip_serve.test")
    with caplog.at_level(logging.ERROR, logger=log.name):
        assert run_main(invalid, log) == 2
    (record,) = (r for r in caplog.records if r.name == log.name)
    assert "seed" in record.getMessage() and "\n" not in record.getMessage()

    def bug() -> int:
        raise KeyError("a real bug")

    with pytest.raises(KeyError):
        run_main(bug)
    assert issubclass(SettingsError, ValueError) and issubclass(SettingsError, UserError)
