"""Whether the Ray cluster can hold the application, and what the builder does when it cannot yet.

Two kinds of cluster reach the application builder:
- one that no node joins later (the Ray `siglip-serve run` starts, one host's `ray start --head`): an
  application it cannot hold would leave replicas pending and /readyz at 503 for ever, so it is refused
  at once, in one line.
- one that grows. KubeRay submits `serveConfigV2` as soon as the head pod is ready, before any worker
  registers, and submits it again only when it changes or no application is left (KubeRay v1.7.0,
  ray-operator/controllers/ray/rayservice_controller.go: reconcileServe, checkIfNeedSubmitServeApplications):
  a refusal there stays DEPLOY_FAILED until someone edits the RayService. So there the application deploys
  with what the cluster has and one warning with the numbers. Serve keeps a replica it cannot place
  pending (PENDING_ALLOCATION: a warning every 30 s, never a failure; ray/serve/_private/deployment_state.py,
  Ray 2.60) and places it when a node with the resources joins.

Which kind: `cluster_grows` where the config sets it, else KubeRay's environment (core/constants.py
KUBERAY_ENV); `siglip-serve run` sets it itself (launcher/runner.py). Ray shows no safe sign of a
cluster that will grow: a local head runs an autoscaler too, over a read-only config of the nodes it has
(ray/autoscaler/_private/monitor.py, _initialize_autoscaler), and the cluster config that Ray Data reads
for the same question (ray._private.state.get_cluster_config) is reported by no Python code of Ray 2.60.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import ray

from siglip_serve.core.constants import KUBERAY_ENV, NEURON_CORES
from siglip_serve.core.poll import poll
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.placement import auto_device, declare_hint
from siglip_serve.serve.plan.service_plan import ServicePlan

log = logging.getLogger("siglip_serve")

# How long the cluster's devices must stay unchanged before `replicas: auto` counts them where the
# cluster grows: KubeRay creates a worker group's pods together, but each node pulls its image and starts
# Ray on its own, so the workers of one group register seconds to tens of seconds apart.
CORES_SETTLE_S = 30.0
# A progress line while waiting for them, at most this often.
WAIT_LOG_EVERY_S = 15.0


@dataclass(frozen=True)
class Growth:
    """Whether nodes may still join the cluster, why the builder thinks so, and what a refusal adds."""

    grows: bool
    why: str
    hint: str = ""


FIXED = Growth(False, "a cluster no node joins")
# `siglip-serve run` decides for itself (launcher/runner.py) unless the config says.
LOCAL_RUN = Growth(False, "the Ray `siglip-serve run` starts is this host's alone",
                   " (siglip-serve run: --neuron-cores N declares its Ray's NeuronCores)")
JOINED = Growth(True, "siglip-serve run --address: a cluster that nodes may join")


def cluster_growth(config: ServiceConfig, environ: Mapping[str, str] | None = None) -> Growth:
    if config.cluster_grows is not None:
        return Growth(config.cluster_grows, f"cluster_grows: {str(config.cluster_grows).lower()}")
    environ = os.environ if environ is None else environ
    for name in KUBERAY_ENV:
        if environ.get(name):
            return Growth(True, f"KubeRay's cluster: {name} is set")
    return Growth(False, "no KubeRay environment and cluster_grows unset",
                  " (if nodes join this cluster later, set cluster_grows: true)")


def check_cluster_fits(plan: ServicePlan, growth: Growth = FIXED, total: Mapping[str, float] | None = None) -> None:
    """Refuse a plan the cluster can never schedule (e.g. 2 encoders + the ingress on 2 CPUs); where the
    cluster grows, warn with the same numbers and let it deploy. Totals, not what is free now: a replica
    waiting for another application's resources is not refused. Autoscaled deployments must fit at their
    floor; what they may add beyond it only warns (Ray's autoscaler may add nodes)."""
    total = ray.cluster_resources() if total is None else total
    image, text, ingress = plan.model.image, plan.model.text, plan.ingress
    if image.min_replicas < image.replicas and any(
            image.replicas * amount > total.get(name, 0) for name, amount in
            {"CPU": image.ask.num_cpus, **image.ask.devices}.items()):
        log.warning("autoscaling: max_replicas %d do not fit the cluster as it is; replicas past what fits stay "
                    "pending until Ray's autoscaler adds a node", image.replicas)
    if ingress.max_replicas > ingress.replicas and (
            ingress.max_replicas * ingress.ask.num_cpus + image.replicas * image.ask.num_cpus > total.get("CPU", 0)):
        log.warning("ingress_autoscaling: max_replicas %d do not fit the cluster as it is beside the encoders; "
                    "ingress replicas past what fits stay pending until Ray's autoscaler adds a node",
                    ingress.max_replicas)
    replicas, texts = image.min_replicas, text.replicas if text is not None else 0
    text_cpus = text.ask.num_cpus if text is not None else 0
    short: list[tuple[str, str]] = []  # (what is missing, with the numbers; what to change)
    for resource, (asked, have) in plan.shortfalls(total).items():
        if resource == "CPU":
            short.append((
                f"this application needs {asked:g} CPUs ({replicas} encoder replica(s) x encoder_num_cpus "
                f"{image.ask.num_cpus:g} + {ingress.replicas} ingress x ingress_num_cpus {ingress.ask.num_cpus:g} + "
                f"{texts} text replica(s) x text_num_cpus {text_cpus:g}) but the Ray cluster has "
                f"{have:g}",
                "lower replicas or encoder_num_cpus (Ray's CPUs are logical, e.g. encoder_num_cpus: 0.5), or start "
                "Ray with more: ray start --head --num-cpus N"))
        else:
            per = image.ask.devices.get(resource, 0)
            per_text = text.ask.devices.get(resource, 0) if text is not None else 0
            short.append((
                f"this application needs {asked:g} {resource} ({replicas} encoder replica(s) x {per:g} + {texts} text "
                f"replica(s) x {per_text:g}) but the Ray cluster declares {have:g}",
                f"lower replicas or text_replicas, or start Ray with {declare_hint(resource)}"))
    if not short:
        return
    if not growth.grows:
        need, change = short[0]
        raise ConfigError(f"{need}; {change}{growth.hint}")
    log.warning("the cluster cannot hold this application yet (%s): %s now; deploying it: Serve keeps the "
                "replicas that do not fit pending and places them as nodes join (/readyz answers 200 once "
                "min_ready_replicas %d are warm)", growth.why, "; ".join(need for need, _ in short), image.min_ready)


def planning_resources(config: ServiceConfig, growth: Growth, stop: Callable[[], bool] = lambda: False,
                       resources: Callable[[], Mapping[str, float]] | None = None) -> dict[str, float]:
    """The cluster's totals the plan counts from: as they are now; where `replicas: auto` counts a device
    and the cluster grows, once that device's count has registered and held (`settled_count`)."""
    resources = resources or ray.cluster_resources
    have = dict(resources())
    device = auto_device(config)
    if device is not None and growth.grows:
        have[device] = settled_count(config.cluster_wait_s, growth, resource=device, resources=resources, stop=stop)
    return have


class _DeviceCount:
    """One device resource of the cluster over time: how long its count has held, and a progress line now
    and then."""

    def __init__(self, resources: Callable[[], Mapping[str, float]], resource: str, why: str,
                 timeout_s: float) -> None:
        self.resources, self.resource, self.why, self.timeout_s = resources, resource, why, timeout_s
        self.began = self.since = self.logged = time.monotonic()
        self.count = -1.0  # nothing seen yet: the first reading is logged

    def attempt(self) -> tuple[float, float]:
        """(the count now, seconds it has held)."""
        count = float(self.resources().get(self.resource, 0))
        now = time.monotonic()
        if count != self.count or now - self.logged >= WAIT_LOG_EVERY_S:
            log.info("replicas: auto: %g %s registered after %.0f s of up to %.0f s (%s)",
                     count, self.resource, now - self.began, self.timeout_s, self.why)
            self.logged = now
        if count != self.count:
            self.count, self.since = count, now
        return count, now - self.since


def settled_count(timeout_s: float, growth: Growth, settle_s: float | None = None, resource: str = NEURON_CORES,
                  resources: Callable[[], Mapping[str, float]] | None = None,
                  stop: Callable[[], bool] = lambda: False) -> float:
    """The cluster's count of `resource` once some has registered and the count has held for `settle_s`
    (default CORES_SETTLE_S), or what registered by `timeout_s`; none by then is refused, naming what to
    declare. Where the cluster grows, `replicas: auto` counts this: its workers may not have registered
    yet. `stop()` true ends the wait at once (a signal to `siglip-serve run`)."""
    settle_s = CORES_SETTLE_S if settle_s is None else settle_s
    counter = _DeviceCount(resources or ray.cluster_resources, resource, growth.why, timeout_s)
    (count, held), settled, waited = poll(counter.attempt,
                                          lambda seen: stop() or (seen[0] > 0 and seen[1] >= settle_s),
                                          timeout_s, interval_s=max(0.01, min(1.0, settle_s / 4)))
    if stop():
        return count
    if count <= 0:
        raise ConfigError(
            f"replicas: auto found no {resource} in the Ray cluster within cluster_wait_s {timeout_s:g} s "
            f"({growth.why}); declare them on the workers (ray start {declare_hint(resource)}, "
            "on KubeRay the worker group's rayStartParams) or name the count: replicas: N")
    if not settled:
        log.warning("replicas: auto: the cluster's %s were still changing after cluster_wait_s %.0f s; "
                    "counting the %g registered now (name replicas: N for a fixed count)", resource, waited, count)
    else:
        log.info("replicas: auto: %g %s, unchanged for %.0f s, after %.0f s", count, resource, held, waited)
    return count
