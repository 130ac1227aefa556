"""The served part of `siglip-serve bench`: the real application under a local Ray, driven over HTTP.

A closed-loop asyncio driver (httpx), in one or several client processes (siglip_serve.measure.client_pool),
posts prebuilt bodies (siglip_serve.measure.corpus) at each concurrency level; the service's process tree's CPU
per image (siglip_serve.measure.server_cpu) and the client's own are measured over each level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from siglip_serve.measure.client_pool import ClientPool
from siglip_serve.measure.corpus import Image, build_bodies, sample_corpus
from siglip_serve.measure.results import HostCeiling, ProfileFile, ServedRow
from siglip_serve.measure.server_cpu import ServerCpu
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.service_plan import ServicePlan

log = logging.getLogger("siglip_serve.bench")

# Real ~640x480 photographs: colour ones, as a camera sends them.
BENCH_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry")
BENCH_PHOTO_SIZE = (640, 480)


def sample_photos() -> list[Image]:
    return sample_corpus(BENCH_PHOTOS, size=BENCH_PHOTO_SIZE)


def percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1e3, q))


def drive(pool: ClientPool, url: str, concurrency: int, requests: int, images_per_request: int = 1) -> ServedRow:
    """`concurrency` clients post `requests` bodies in all, each the next as soon as its answer is in,
    over the pool's client processes: img/s over the level's whole wall time, p50/p99 over every request."""
    level = pool.level(url, concurrency, requests)
    latencies = level.driven.latencies
    return ServedRow(
        concurrency=concurrency, requests=requests, failures=level.driven.failures,
        images_per_request=images_per_request,
        images_per_second=len(latencies) * images_per_request / level.seconds,
        latency_p50_ms=percentile_ms(latencies, 50) if latencies else None,
        latency_p99_ms=percentile_ms(latencies, 99) if latencies else None,
        client_cpu=level.client_cpu,
    )


HOST_CEILING_ROUTE = "/host-ceiling"


def host_ceiling_config(config: ServiceConfig, plan: ServicePlan) -> ServiceConfig:
    """The same deployment with the model taken out: zero vectors, no text tower, the same replica and
    ingress counts as `plan` (auto would count cores differently without the model's threads)."""
    from siglip_serve.core.backends import NO_MODEL_BACKEND

    return ServiceConfig.model_validate({
        **config.model_dump(exclude_unset=True), "backend": NO_MODEL_BACKEND, "replicas": plan.model.image.replicas,
        "ingress_replicas": plan.ingress.replicas, "ingress_autoscaling": None, "text_replicas": 0,
        "neuron_cores_per_replica": 0, "env_vars": {}, "artifact_dir": None, "torch_threads": None,
        "device_jpeg_decode": False,
    })


def measure_level(pool: ClientPool, url: str, level: int, requests: int, images_per_request: int,
                  server: ServerCpu) -> ServedRow:
    before = server.snapshot()
    row = drive(pool, url, level, max(requests, level), images_per_request)
    window = ServerCpu.between(before, server.snapshot())
    row.server_cpu = cpu = window.result((row.requests - row.failures) * images_per_request)
    client = row.client_cpu
    log.info("served at concurrency %d: %.1f img/s, %.1f server CPU-ms per image, busiest of %d client "
             "process(es) %.2f of a core", level, row.images_per_second, cpu.ms_per_image or float("nan"),
             pool.processes, client.busiest_process_core_fraction if client else float("nan"))
    return row


def record_profiles(pool: ClientPool, url: str, level: int, requests_per_second: float,
                    server: ServerCpu, out_dir: Path, seconds: float) -> list[ProfileFile]:
    """Drive the service for about `seconds` at `level` while py-spy records each of its processes."""
    from siglip_serve.measure.profile import Profiles

    profiles = Profiles(server, out_dir, seconds)
    # Enough requests to outlast the recordings at the rate just measured.
    drive(pool, url, level, max(level, int(requests_per_second * (seconds + 1))))
    files = profiles.finish(timeout_s=seconds + 30)
    for file in files:
        log.info("profile of %s (pid %d): %s", file.kind, file.pid, file.path or f"none: {file.error}")
    return files


def served_text_off(config: ServiceConfig) -> str | None:
    """Why the served benchmark plans no text tower unless `text_replicas` asks for one (the planner's
    `text_off`): it posts images only, and a text replica would take CPU."""
    return None if config.text_replicas is not None else "the served benchmark posts images only"


def bench_served(config: ServiceConfig, levels: list[int], requests: int, images_per_request: int = 1,
                 front_end: str = "haproxy", endpoint: str = "raw", host_ceiling: bool = False,
                 profile: tuple[Path, float] | None = None, on_plan: Callable[[ServicePlan], None] = lambda _: None,
                 client_processes: int = 1) -> tuple[list[ServedRow], HostCeiling | None, list[ProfileFile] | None]:
    """The served rows at each concurrency; with `host_ceiling` the same deployment with the model
    taken out (a second application on the same Ray), at the highest concurrency; with `profile`
    (directory, seconds) a flame graph of each of the service's processes under the highest
    concurrency, recorded after the measured rows (measure/profile.py). `on_plan` gets the plan deployed
    (serve/plan/planner.py), once made: before its Ray starts, or where `replicas: auto` counts a device the
    Ray detects, once it runs. `client_processes` drive each level together (measure/client_pool.py)."""
    import ray
    from ray import serve

    from siglip_serve.launcher.haproxy_front import use_front_end
    from siglip_serve.launcher.preflight import free_port
    from siglip_serve.launcher.runner import ray_resources, serve_logging
    from siglip_serve.serve.app import build
    from siglip_serve.serve.plan.placement import auto_device
    from siglip_serve.serve.plan.planner import plan_service

    use_front_end(front_end, local_only=True)
    port = free_port()
    text_off = served_text_off(config)
    plan = None if auto_device(config) else plan_service(config, text_off=text_off)
    ray_options: dict[str, Any] = {}
    if plan is not None:
        ray_options = ray_resources(plan)
        if host_ceiling:  # the ceiling's replicas and ingress beside the model's
            ray_options["num_cpus"] *= 2
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, namespace="siglip-bench",
             log_to_driver=False, **ray_options)
    pool: ClientPool | None = None
    try:
        plan = plan or plan_service(config, ray.cluster_resources(), text_off=text_off)
        on_plan(plan)
        # Logging as `siglip-serve run` deploys it: Serve's access log costs each request a line in every replica.
        replica_logging, system_logging = serve_logging(config)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=system_logging)
        log.info("deploying %s for the served benchmark...", config.model)
        serve.run(build(config, plan), name="bench", route_prefix="/", logging_config=replica_logging)
        request_bodies = build_bodies(sample_photos(), endpoint, images_per_request)
        bodies = [(body.data, body.content_type) for body in request_bodies]
        url = f"http://127.0.0.1:{port}{request_bodies[0].path}"
        pool = ClientPool(bodies, client_processes)
        drive(pool, url, max(levels), 2 * max(levels), images_per_request)  # warm the path
        # Ray's processes are this process's children; this process and the client pool's are the client.
        server = ServerCpu.of_children(client=pool.pids)
        rows = [measure_level(pool, url, level, requests, images_per_request, server) for level in levels]
        profiles = None
        if profile is not None:
            profiles = record_profiles(pool, url, max(levels), rows[-1].images_per_second / images_per_request,
                                       server, *profile)
        ceiling = None
        if host_ceiling:
            count = plan.model.image.replicas
            no_model = host_ceiling_config(config, plan)
            log.info("deploying the host ceiling: %s with no model (%d replica(s))", config.model, count)
            serve.run(build(no_model, plan_service(no_model)), name="host-ceiling", route_prefix=HOST_CEILING_ROUTE,
                      logging_config=replica_logging)
            ceiling_url = f"http://127.0.0.1:{port}{HOST_CEILING_ROUTE}{request_bodies[0].path}"
            level = max(levels)
            drive(pool, ceiling_url, level, 2 * level, images_per_request)
            row = measure_level(pool, ceiling_url, level, requests, images_per_request, server)
            ms = row.server_cpu.ms_per_image if row.server_cpu else None
            ceiling = HostCeiling(concurrency=level, replicas=count,
                                  ingress_replicas=plan.ingress.replicas,
                                  images_per_second=row.images_per_second,
                                  images_per_second_per_core=1000.0 / ms if ms else None, server_cpu=row.server_cpu,
                                  client_cpu=row.client_cpu)
        return rows, ceiling, profiles
    finally:
        # Not serve.shutdown(): it stops each replica gracefully, and a direct-ingress replica (the
        # HAProxy front end) drains for at least 30 s (RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S,
        # ray/serve/_private/constants.py). Nothing is in flight here; Serve's actors die with this Ray.
        if pool is not None:
            pool.close()
        ray.shutdown()
