"""`siglip-serve run`: check what can be checked in seconds, then start a local Ray (or join one) and serve."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from siglip_serve.core.cli import (
    SettingsError,
    add_field_arguments,
    add_log_level,
    environment_values,
    fields_help,
    key_value,
    option_values,
    run_main,
    settings_values,
    setup_logging,
)
from siglip_serve.core.constants import API_KEY_ENV
from siglip_serve.launcher.haproxy_front import DEFAULT_METRICS_PORT, FRONT_ENDS
from siglip_serve.models.cli_args import add_model_arguments, model_values

if TYPE_CHECKING:  # imported where used, as everywhere in this module
    from siglip_serve.launcher.timeline import Timeline
    from siglip_serve.serve.plan.config import ServiceConfig

log = logging.getLogger("siglip_serve")


def add_front_end_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--front-end", choices=FRONT_ENDS, default="haproxy",
                        help="HTTP front end of a Ray started here: haproxy (default: Serve's HAProxy mode, "
                             "header limits and timeouts, about half the host CPU per image) or python "
                             "(Serve's proxy actor)")


# The `run` flags that set a ServiceConfig field (every other field: --set KEY=VALUE).
SERVICE_OPTIONS = ("replicas", "api_key_file", "access_log")
# A key on the command line is in /proc/PID/cmdline, which every user of the host reads (`ps`), for as
# long as the process lives: the relay that runs the service lives as long as the service (and with
# --address it is the service). Only overwriting argv's memory would hide it, from some time after the
# start; so `run` refuses it, before any child starts, and never repeats the value.
KEY_IN_ARGV = (f"no API key on the command line (every user of this host sees it in ps): give "
               f"--api-key-file PATH, or the {API_KEY_ENV} environment variable")


class _RefuseKey(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(KEY_IN_ARGV)


def _run_setting(text: str) -> tuple[str, str]:
    """`--set KEY=VALUE` of `run`: any config field but the key itself."""
    key, value = key_value(text)
    if key.replace("-", "_") == "api_key":
        raise argparse.ArgumentTypeError(KEY_IN_ARGV)
    return key, value


def build_parser() -> argparse.ArgumentParser:
    from siglip_serve.serve.plan.config import ServiceConfig

    run = argparse.ArgumentParser(prog="siglip-serve run", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="--set KEY=VALUE takes every config field (the Serve YAML args:) "
                                         "but api_key:\n" + fields_help(ServiceConfig))
    # No default here: $SIGLIP_LOG_LEVEL may name one (run_settings), else the config's own.
    add_log_level(run, default=None)
    add_model_arguments(run)
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8000)
    run.add_argument("--metrics-port", type=int, default=8080, help="Ray's Prometheus export port")
    run.add_argument("--metrics-host", default="127.0.0.1",
                     help="where Prometheus scrapes from: 127.0.0.1 (default) keeps Ray's metrics port on "
                          "loopback; any other value makes Ray listen on every interface")
    run.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    add_front_end_option(run)
    run.add_argument("--haproxy-metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                     help="HAProxy's Prometheus exporter (--front-end haproxy): what it answered and refused, "
                          "connections, queue time; on --metrics-host's interfaces (0: any free port)")
    run.add_argument("--neuron-cores", type=int,
                     help="declare this many logical NeuronCores to the local Ray (auto-detection is unreliable)")
    run.add_argument("--dashboard", action="store_true",
                     help="start Ray's dashboard with the local Ray (what `serve status` and `serve deploy` talk to; "
                          "its processes cost CPU while the service starts); a joined cluster (--address) keeps "
                          "its own")
    run.add_argument("--timings", action="store_true",
                     help="once every replica is warm, print the start's timeline on stderr: each phase of this "
                          "command (checks, ray.init, serve.start, the deployment) and of each tower replica (imports, "
                          "model build, warm-up per bucket, registration), in seconds")
    run.add_argument("--print-plan", action="store_true",
                     help="print the plan this config gives (every deployment's replicas, Ray resources, threads "
                          "and limits: serve/plan/service_plan.py) as JSON on stdout, and exit without starting "
                          "anything; with --address, planned against that cluster's resources")
    service = run.add_argument_group("service")
    add_field_arguments(service, ServiceConfig, SERVICE_OPTIONS)
    # Declared so that argparse cannot read it as an abbreviation of --api-key-file (and log the key as
    # a file that cannot be read).
    service.add_argument("--api-key", action=_RefuseKey, metavar="KEY",
                         help=f"refused: give --api-key-file PATH or {API_KEY_ENV} (a key here shows in ps)")
    run.add_argument("--set", action="append", default=[], type=_run_setting, metavar="KEY=VALUE",
                     help="any config field but api_key, as in the Serve YAML args (repeatable)")
    run.add_argument("--config", metavar="FILE",
                     help="a YAML mapping of config fields (the Serve YAML args:), under SIGLIP_<KEY> variables and "
                          "every flag; read again on SIGHUP: a live setting changes in place, models: entries are "
                          "added or removed, a change that needs a restart is refused, naming it "
                          "(docs/guides/configuration.md)")
    return run


def config_file_values(path: str) -> dict[str, Any]:
    """`--config FILE`'s mapping of config fields; ConfigError naming the file when it cannot be read or is no
    mapping (its values are checked with the rest, by ServiceConfig)."""
    import yaml

    from siglip_serve.serve.plan.config import ConfigError

    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {path} is not YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"--config: {path} holds a {type(document).__name__}, not a mapping of config fields")
    return {str(key).replace("-", "_"): value for key, value in document.items()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    entered = time.time()
    parser = build_parser()
    args = parser.parse_args(argv)
    from siglip_serve.serve.plan.config import ServiceConfig

    try:  # a bad SIGLIP_<KEY> is a usage error, as a bad flag is
        environment, _ = environment_values(ServiceConfig, os.environ, exclude={"api_key"})
    except SettingsError as exc:
        parser.error(str(exc))
    setup_logging(args.log_level or environment.get("log_level", "INFO"))
    if args.print_plan:
        return run_main(lambda: print_plan(args), log)
    own_session = False
    if not args.address:
        from siglip_serve.launcher import session

        own_session = session.is_child()
        if not own_session:
            # A signal to our whole process group must not reach the Ray this command starts.
            return session.run_in_own_session(argv)
    from siglip_serve.launcher.timeline import INTERPRETER, Timeline

    timeline = Timeline.of_command(relayed=own_session)
    timeline.mark(INTERPRETER, at=entered)
    return run_main(lambda: _start(args, timeline, own_session), log)


def _start(args: argparse.Namespace, timeline: Timeline, own_session: bool = False) -> int:
    from siglip_serve.launcher.preflight import (
        METRICS_CHECK_HOST,
        check_ports,
        disable_port_sharing,
        ray_visible_cores,
    )
    from siglip_serve.launcher.startup import Placeholder

    placeholder = None
    # Until the service takes SIGHUP (launcher/runner.py), one would end this process: noted, the settings are
    # being read now.
    signal.signal(signal.SIGHUP, lambda *_: log.info("SIGHUP while starting: the settings are being read now"))
    try:
        if not args.address:
            # Before the Ray this command starts (and its raylet) reads the variable: ranges become comma lists.
            ray_visible_cores(args.neuron_cores)
            # First, before the heavy imports: a taken port is one line now, not a second instance
            # sharing it or a Ray traceback later; then probes get a quick 503 until Serve is up.
            check_ports(args.host, args.port, METRICS_CHECK_HOST, args.metrics_port,
                        args.haproxy_metrics_port if args.front_end == "haproxy" else None, args.front_end)
            disable_port_sharing()
            placeholder = Placeholder(args.host, args.port, reuse_address=args.front_end == "haproxy")
        from siglip_serve.launcher.timeline import ARGUMENTS

        timeline.mark(ARGUMENTS)
        return _command(args, timeline, placeholder, own_session)
    finally:
        if placeholder is not None:
            placeholder.release()


def run_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The config `run` asks for: --config FILE's fields, then SIGLIP_<KEY> variables in `environ`
    (core/constants.py), then the model flags, --set, --log-level and the service flags, each over what comes
    before it. $SIGLIP_API_KEY keeps its own path (service_config): a key never travels in the settings from
    the environment."""
    from siglip_serve.serve.plan.config import ServiceConfig

    environment, strays = environment_values(ServiceConfig, environ or {}, exclude={"api_key"})
    for name in strays:
        log.warning("%s is neither a config key nor a variable siglip-serve reads: ignored", name)
    from_file = config_file_values(args.config) if getattr(args, "config", None) else {}
    settings = {**from_file, **environment, **model_values(args), **settings_values(args.set),
                **option_values(args, SERVICE_OPTIONS)}
    if args.log_level is not None:
        settings["log_level"] = args.log_level
    if settings.get("api_key_file"):  # the replicas' working directory is not ours
        settings["api_key_file"] = os.path.abspath(settings["api_key_file"])
    if settings.get("api_keys_file"):
        settings["api_keys_file"] = os.path.abspath(settings["api_keys_file"])
    return settings


def service_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ServiceConfig:
    """The config `run` serves, its keys checked: an unreadable key file or a bad keys file stops us here, not
    in a replica.

    The Ray started here hands this process's environment, $SIGLIP_API_KEY included, to every replica.
    A joined cluster's (--address) does not: there a key from our environment travels in the config, as
    the ingress's constructor argument (pickled by Serve), which no process's command line shows."""
    from pydantic import SecretStr

    from siglip_serve.serve.plan.config import ConfigError, ServiceConfig

    config = ServiceConfig.from_args(run_settings(args, environ))
    # `run` deploys one application and is restarted whole to change it: `model_apps` (for `serve deploy`'s
    # YAML, where models change in place) would leave the front application's towers undeployed.
    config = config.model_copy(update={"model_apps": False})
    if config.interactive_ingress and args.front_end == "python" and not args.address:
        raise ConfigError("interactive_ingress keeps an ingress replica apart in HAProxy's configuration; Serve's "
                          "proxy (--front-end python) spreads requests over every replica: use --front-end haproxy")
    if config.api_keys_file is not None:
        # Read here, where `run` runs, never in the config's validation: a Serve YAML's builder validates on
        # the head, which may not mount the file; there the ingress replica that reads it refuses instead.
        from siglip_serve.serve.shared.tenants import load_keys

        try:
            load_keys(config.api_keys_file)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    key = config.key_to_send(config.api_keys_file, environ)
    if args.address and key is not None and config.api_key is None and config.api_key_file is None:
        config = config.model_copy(update={"api_key": SecretStr(key)})
    return config


def print_plan(args: argparse.Namespace) -> int:
    """`--print-plan`: the plan `run` would deploy, as JSON, with nothing started or checked on disk. The
    text tower is on or off as the config's shape says (a Serve deploy's rule, serve/app.py text_by_shape):
    `run` itself also looks for the tokenizer, which may reach the hub; name text_replicas to settle it."""
    from siglip_serve.launcher.runner import local_resources
    from siglip_serve.serve.app import text_by_shape
    from siglip_serve.serve.plan.planner import plan_service

    config = service_config(args, os.environ)
    text_off = text_by_shape(config)
    if args.address:
        import ray

        ray.init(address=args.address, log_to_driver=False)
        try:
            plan = plan_service(config, ray.cluster_resources(), text_off=text_off)
        finally:
            ray.shutdown()
    else:
        plan = plan_service(config, local_resources(args.neuron_cores), text_off=text_off)
    print(plan.model_dump_json(indent=2))
    return 0


def checked(config: ServiceConfig, args: argparse.Namespace, placeholder: Any = None) -> str | None:
    """`config` checked for every model it serves before Ray starts (and again for changed models on SIGHUP): a
    missing SDK/GPU/artifact or unreachable weights is one line now, not a replica's refusal later; the text
    tower's default decided by looking for the tokenizer: returns why the default model's text tower is off, for
    the planner (serve/plan/planner.py plan_service's `text_off`), or None. Here, not in the app's builder: this Ray
    runs on this machine, while a Serve YAML's builder runs on a head that may see none of the model's files
    (serve/app.py)."""
    from siglip_serve.core.backends import TEXT
    from siglip_serve.models.backends.implementation import check_backend_available, check_tower
    from siglip_serve.serve.plan.model_checks import preflight_tokenizer, preflight_weights
    from siglip_serve.serve.plan.policy import policy_of
    from siglip_serve.serve.plan.served_models import served_models

    served = served_models(config)
    for model in served:
        env = None if args.address else {**os.environ, **model.config.env_vars}
        check_backend_available(model.config.model_settings(), env)
    if placeholder is not None:
        placeholder.set_stage("checking the model weights")
    for model in served:
        preflight_weights(model.config)
    text_off = preflight_tokenizer(config)
    for index, model in enumerate(served):
        # As the planner counts them: the default model (the first) without text where the check turned it off.
        if policy_of(model.config, text_off if index == 0 else None).text_replicas:
            # The replicas run on this machine (a Ray of our own) or were checked here by the user: refused
            # now, in one line, not as text replicas refusing after Ray started.
            check_tower(model.config.model_settings(), TEXT)
    return text_off


def _command(args: argparse.Namespace, timeline: Timeline, placeholder: Any, own_session: bool = False) -> int:
    """Checks that need the config, then the service; exits the process when it stops."""
    config = service_config(args, os.environ)
    from siglip_serve.launcher.reload import Reload

    # What SIGHUP reads again: the settings as asked, checked again where the models change.
    reload = Reload((lambda: service_config(args, os.environ)) if args.config else None, config,
                    lambda asked: checked(asked, args))
    from siglip_serve.launcher.runner import run_service

    if config.tracing:
        from siglip_serve.serve.shared.tracing import check_available

        check_available()
    text_off = checked(config, args, placeholder)
    if own_session:
        log.info("service: pid %d, in a session of its own (to stop it at once: kill -KILL -- -%d)",
                 os.getpid(), os.getpid())
    code = run_service(config, args.host, args.port, args.metrics_port, args.address, args.neuron_cores,
                       args.metrics_host, placeholder, timeline, args.front_end, args.haproxy_metrics_port or None,
                       timings=args.timings, dashboard=args.dashboard, reload=reload, text_off=text_off)
    if own_session:
        from siglip_serve.launcher.session import end_leftovers

        # Here too, not only in the parent: a parent that was killed cannot do it.
        end_leftovers(os.getpid())
    # Ray is stopped and every log flushed; the interpreter's own teardown would then wait
    # ~7-10 s in Ray's native threads before the process ends (measured on SIGTERM).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
