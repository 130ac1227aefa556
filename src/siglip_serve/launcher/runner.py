"""`siglip-serve run`: start a local Ray, deploy the application, wait for a signal, tear down.

SIGTERM or Ctrl-C drains first (/readyz and new requests 503, accepted requests finish within
`drain_timeout_s`), then shuts Serve and the Ray processes this command started down, so nothing
is left behind. With `--address` it joins an existing cluster instead and leaves that cluster up.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from siglip_serve.core.constants import NEURON_CORES
from siglip_serve.core.errors import UserError
from siglip_serve.core.front_door import FRONT_END_TIMEOUT_MARGIN_S
from siglip_serve.core.host import usable_cpus
from siglip_serve.launcher import timeline as phases
from siglip_serve.launcher.preflight import RAY_HOST
from siglip_serve.launcher.reload import Reload
from siglip_serve.launcher.startup import Placeholder, replica_progress, wait_with_progress
from siglip_serve.launcher.timeline import Timeline
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.policy import policy_of

if TYPE_CHECKING:
    from siglip_serve.serve.plan.cluster_fit import Growth
    from siglip_serve.serve.plan.service_plan import ServicePlan

log = logging.getLogger("siglip_serve")

APP_NAME = "siglip"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Ray 2.60 rewrites a loopback `_node_ip_address` to the machine's address (resolve_ip_for_localhost
# in ray/_private/worker.py), and its metrics agent listens on every interface unless the node IP
# is loopback (reporter_agent.py). With this variable false, Ray takes 127.0.0.1 as the node IP, so
# the metrics port, GCS and raylet listen on loopback only. Read when `ray` is imported.
RAY_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_resources(plan: ServicePlan) -> dict[str, Any]:
    """CPUs to declare so every replica the plan may run fits, even on a 2-core machine (Ray's CPUs are
    logical): an autoscaled deployment may grow to its ceiling on this one node."""
    return {"num_cpus": max(os.cpu_count() or 1, math.ceil(plan.needs(most=True).get("CPU", 0) - 1e-9))}


def local_resources(neuron_cores: int | None) -> dict[str, float] | None:
    """What the plan of a Ray this command starts counts from: the NeuronCores it declares (--neuron-cores),
    the one device a local Ray declares by hand; its CPUs are sized from the plan (`ray_resources`)."""
    return {NEURON_CORES: float(neuron_cores)} if neuron_cores else None


def run_growth(config: ServiceConfig, address: str | None) -> Growth:
    """Whether nodes may join the cluster, where the config leaves `cluster_grows` open: the Ray this
    command starts is this host's alone (its node address is 127.0.0.1), so what it cannot hold is refused
    at once; a joined cluster (`--address`) may gain nodes, so what does not fit yet deploys with a warning
    (serve/plan/cluster_fit.py)."""
    # Not at import: it imports ray, which must see RAY_LOCAL_ONLY_ENV first (run_service).
    from siglip_serve.serve.plan.cluster_fit import JOINED, LOCAL_RUN, cluster_growth

    if config.cluster_grows is not None:
        return cluster_growth(config)
    return LOCAL_RUN if address is None else JOINED


def print_timeline(timeline: Timeline) -> None:
    """The start's timeline on stderr, with every live tower replica's own phases (from the registry)."""
    from siglip_serve.serve.shared import registry

    try:
        records = registry.live_replicas(APP_NAME)
    except Exception as exc:  # broad on purpose: the timeline is a report; the service serves without it
        log.warning("start timeline without the replicas' phases: %s", type(exc).__name__)
        records = []
    print(timeline.report(records), file=sys.stderr, flush=True)


def drain(app_name: str, timeout_s: float, poll_s: float = 0.25) -> bool:
    """Mark the application draining and wait until its ingress replicas hold no accepted request.

    True when every request finished, False when `timeout_s` ran out first.
    """
    from siglip_serve.serve.shared import registry

    began = time.time()
    registry.set_draining(app_name)
    log.info("draining: /readyz answers 503; waiting up to %.0f s for accepted requests", timeout_s)
    time.sleep(min(4 * poll_s, timeout_s))  # every ingress replica polls the mark within poll_s
    while True:
        states = registry.in_flight(app_name)
        fresh = [state for state in states if state["at"] >= began]
        busy = sum(int(state["requests"]) for state in fresh)
        if len(fresh) == len(states) and busy == 0:
            return True
        if time.time() - began >= timeout_s:
            log.warning("drain timeout: %d request(s) still in flight after %.0f s", busy, timeout_s)
            return False
        time.sleep(poll_s)


def reconfigure(reload: Reload, deployed: tuple[ServiceConfig, ServicePlan], growth: Growth,
                quiet: dict[str, Any]) -> tuple[ServiceConfig, ServicePlan]:
    """SIGHUP: the settings read again (launcher/reload.py); the application run again with every deployment pinned
    to its own slice of the plan (serve/app.py `pinned`): a change of live settings alone reconfigures the ingress
    in place, a change of models plans again and starts and stops only the towers of the models that changed.
    Returns the config and plan in force."""
    from ray import serve

    from siglip_serve.serve.app import build, plan_on_cluster

    change = reload.changed()
    if change is None:
        return deployed
    config, plan = deployed
    try:
        if change.replan:
            config = change.asked
            plan = plan_on_cluster(config, growth, text_off=change.text_off)
        serve.run(build(config, plan, live=change.live, pin=True), name=APP_NAME, route_prefix="/",
                  blocking=False, logging_config=quiet)
    except UserError as exc:
        log.error("reload refused: %s; the settings in force stay", exc)
        return deployed
    except Exception as exc:  # broad on purpose: whatever Serve raised, the service serves on as it was
        log.error("reload failed: %s: %s; the settings in force stay", type(exc).__name__, exc)
        return deployed
    reload.applied(change)
    log.info("reload: %s in force", "the models and live settings" if change.replan else "live settings")
    return config, plan


def second_wave(config: ServiceConfig, plan: ServicePlan, quiet: dict[str, Any], stop: threading.Event,
                began: float) -> bool:
    """Once the first wave is warm and the service ready: the application run again with the plan's full counts
    (serve/plan/start_order.py), Serve adding the replicas the first wave left out, the others kept. True once every
    replica is warm; False when `stop` was set first, or where they failed (the first wave serves on)."""
    from ray import serve

    from siglip_serve.serve.app import build

    replicas = sum(model.image.replicas for model in plan.models)
    log.info("starting the other encoder replicas (%d in all)", replicas)
    whole = build(config, plan, pin=True, say=False)
    try:
        if not wait_with_progress(lambda: serve.run(whole, name=APP_NAME, route_prefix="/", blocking=False,
                                                    logging_config=quiet), APP_NAME, replicas, stop, began):
            return False
    except Exception as exc:  # broad on purpose: whatever Serve raised, the replicas already warm keep serving
        log.error("the other encoder replicas did not start (%s: %s); the replicas already warm serve on",
                  type(exc).__name__, exc)
        return False
    log.info("every replica warm at %.1f s: %s", time.monotonic() - began, replica_progress(APP_NAME, replicas))
    return True


def serve_logging(config: ServiceConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serve's `logging_config` of the application's replicas, and of its controller and proxy. Serve's access log
    (a line per request in every replica) is on only where `access_log` asks for it."""
    replicas = {"enable_access_log": config.access_log, "log_level": config.log_level}
    # Serve's controller and proxy log every replica change and every client that goes away
    # at INFO; our progress lines say what matters, so they speak at WARNING unless asked.
    system_level = "WARNING" if config.log_level == "INFO" and not config.access_log else config.log_level
    return replicas, {**replicas, "log_level": system_level}


def run_service(config: ServiceConfig, host: str, port: int, metrics_port: int | None,
                address: str | None, neuron_cores: int | None, metrics_host: str = "127.0.0.1",
                placeholder: Placeholder | None = None, timeline: Timeline | None = None,
                front_end: str = "haproxy", haproxy_metrics_port: int | None = None, timings: bool = False,
                dashboard: bool = False, reload: Reload | None = None, text_off: str | None = None) -> int:
    """`front_end`: "haproxy" (Serve's HAProxy mode with our limits, launcher/haproxy_front.py) or
    "python" (Serve's proxy actor); a joined cluster (`address`) keeps its own. `haproxy_metrics_port`:
    HAProxy's Prometheus exporter (None: a free port).
    `placeholder` holds the HTTP port, answering 503, until Serve's proxy takes it over;
    `timeline` holds the command's phases so far (launcher/timeline.py), from its start, which the "ready in"
    line counts from; `timings`: print it, with each tower replica's, once ready; `dashboard`: start Ray's
    dashboard with the Ray started here (off: its head process and modules are CPU the replicas' start
    would share); `reload`: what SIGHUP reads again (default: nothing, the keys file touched); `text_off`: why
    the default model's text tower is off, as `run`'s checks found (launcher/cli.py `checked`), for the plan."""
    timeline = Timeline(time.time()) if timeline is None else timeline
    timeline.mark(phases.CHECKS)
    began = time.monotonic() - timeline.elapsed()  # the command's start, on the clock progress lines use
    if placeholder is not None:
        placeholder.set_stage("starting Ray")
    if address is None:
        if metrics_host in LOOPBACK:
            os.environ[RAY_LOCAL_ONLY_ENV] = "0"
        else:
            log.warning("metrics host %s: Ray 2.60 binds its metrics port on every interface, not one address; "
                        "restrict it with a firewall or network policy", metrics_host)
        from siglip_serve.launcher.haproxy_front import use_front_end

        use_front_end(front_end, local_only=metrics_host in LOOPBACK, metrics_port=haproxy_metrics_port)
        # The Ray we start runs Serve's mode everywhere, as Ray's guide sets it on the whole cluster (the
        # replicas get it from their runtime_env either way); an operator's own value wins.
        for name, value in policy_of(config).ingress_mode_env().items():
            os.environ.setdefault(name, value)
    import ray
    from ray import serve

    from siglip_serve.serve.app import build, plan_on_cluster
    from siglip_serve.serve.plan.cluster_fit import check_cluster_fits
    from siglip_serve.serve.plan.placement import auto_device
    from siglip_serve.serve.plan.planner import plan_service
    from siglip_serve.serve.plan.start_order import first_wave

    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            # A supervisor that repeats its signal, or a second Ctrl-C, must not drop the requests the
            # drain waits for; the drain has its own bound (README, Running: how to stop at once).
            log.info("received %s again: already stopping (drain_timeout_s=%.0f s)", name, config.drain_timeout_s)
            return
        log.info("received %s; shutting down", name)
        stop.set()

    started_ray = address is None
    init_args: dict[str, Any] = {"namespace": "siglip-serve", "log_to_driver": True}
    plan: ServicePlan | None = None
    if started_ray:
        # Made once, before its Ray: the Ray is sized from it, and on cpu the count `auto` gives must not
        # move between the two (the available memory moves as Ray starts). Except where `auto` counts a
        # device nobody declared: Ray detects the host's own (its Neuron and GPU managers), so that plan
        # is made against the Ray once it runs, as on a joined cluster.
        if neuron_cores or auto_device(config) is None:
            plan = plan_service(config, local_resources(neuron_cores), text_off=text_off)
            init_args.update(ray_resources(plan))
        init_args["_node_ip_address"] = RAY_HOST
        init_args["include_dashboard"] = dashboard
        if neuron_cores:
            init_args["resources"] = {"neuron_cores": neuron_cores}
        if metrics_port:
            init_args["_metrics_export_port"] = metrics_port
    else:
        init_args["address"] = address
    log.info("starting Ray (%s)", "local" if started_ray else address)
    hup = threading.Event()  # SIGHUP: read the settings again (launcher/reload.py), from the loop below
    signal.signal(signal.SIGTERM, request_stop)  # a signal while Ray starts stops it after, cleanly
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, lambda *_: hup.set())
    timeline.mark(phases.RAY_IMPORTS)
    context = ray.init(**init_args)
    timeline.mark(phases.RAY_INIT)
    # After ray.init: Ray's core worker installs a SIGTERM handler that aborts the process.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, lambda *_: hup.set())
    reload = reload if reload is not None else Reload(None, config)
    try:
        from siglip_serve.serve.shared import registry

        registry.clear_draining(APP_NAME)  # a joined cluster may keep the mark of an earlier run
        log.info("Ray started in %.0f s", timeline.elapsed())
        if started_ray and context.dashboard_url:
            # Ray's own CLI defaults to localhost:8265, which may be another cluster on a shared host.
            log.info("Ray's CLI for this cluster: RAY_AUTH_MODE=token serve status --address http://%s",
                     context.dashboard_url)
        elif started_ray:
            log.info("Ray's dashboard is off (`run --dashboard` starts it, for `serve status`)")
        growth = run_growth(config, address)
        if plan is None:
            plan = plan_on_cluster(config, growth, stop.is_set, text_off=text_off)
            if stop.is_set():  # a signal while waiting for a joined cluster's devices
                return 0
        else:
            check_cluster_fits(plan, growth)
        quiet, system = serve_logging(config)
        # Where this host's cores are fewer than the replicas starting, those the first answer needs go first.
        first = first_wave(plan, usable_cpus()) if started_ray and not config.model_apps else None
        app = build(config, plan, pin=True, first_wave=first)
        timeline.mark(phases.PLAN)
        if placeholder is not None:
            placeholder.release()
        serve.start(http_options={"host": host, "port": port,
                                  "request_timeout_s": config.request_timeout_s + FRONT_END_TIMEOUT_MARGIN_S},
                    logging_config=system)
        timeline.mark(phases.SERVE_START)
        log.info("deploying %s on %s: loading and warming up the model in every replica...",
                 config.model, config.backend)
        replicas = sum(model.image.replicas for model in plan.models)
        deployed = wait_with_progress(
            lambda: serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config=quiet),
            APP_NAME, replicas, stop, began)
        if deployed:
            timeline.mark(phases.DEPLOY if first is None else phases.FIRST_WAVE)
            log.info("ready in %.1f s (%s): http://%s:%d (POST /v1/embeddings, /v1/embeddings/image)",
                     timeline.elapsed(), replica_progress(APP_NAME, replicas), host, port)
            every_one_warm = first is None or second_wave(config, plan, quiet, stop, began)
            if first is not None and every_one_warm:
                timeline.mark(phases.SECOND_WAVE)
            if timings and every_one_warm:
                print_timeline(timeline)
        while not stop.wait(0.5):
            if hup.is_set():
                hup.clear()
                config, plan = reconfigure(reload, (config, plan), growth, quiet)
        drain(APP_NAME, config.drain_timeout_s)
        return 0
    finally:
        stopping = time.monotonic()
        if placeholder is not None:
            placeholder.release()
        try:
            log.info("stopping Serve and Ray")
            if not started_ray:
                serve.shutdown()
            # Else drained: nothing is in flight and every Serve actor dies with this Ray; Serve's
            # own shutdown would first stop each replica gracefully, seconds per deployment.
        finally:
            ray.shutdown()
            log.info("stopped in %.1f s", time.monotonic() - stopping)
