"""The served part of `siglip-serve bench`: the real application under a local Ray, driven over HTTP.

A closed-loop asyncio driver (httpx) posts prebuilt bodies (siglip_serve.measure.corpus) at each concurrency
level; the service's process tree's CPU per image is measured over each level (siglip_serve.measure.server_cpu).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from siglip_serve.measure.corpus import Image, build_bodies, skimage_corpus
from siglip_serve.measure.results import ServedRow
from siglip_serve.measure.server_cpu import ServerCpu
from siglip_serve.serve.config import ServiceConfig

log = logging.getLogger("siglip_serve.bench")

# Real ~640x480 photographs: colour ones, as a camera sends them.
BENCH_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry")
BENCH_PHOTO_SIZE = (640, 480)


def sample_photos() -> list[Image]:
    return skimage_corpus(BENCH_PHOTOS, size=BENCH_PHOTO_SIZE)


def percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1e3, q))


async def drive(url: str, bodies: list[tuple[bytes, str]], concurrency: int, requests: int,
                images_per_request: int = 1) -> ServedRow:
    """`concurrency` clients post `requests` bodies in all, each the next as soon as its answer is in."""
    import httpx

    latencies: list[float] = []
    failures = 0
    next_index = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index, failures
        while next_index < requests:
            body, content_type = bodies[next_index % len(bodies)]
            next_index += 1
            began = time.perf_counter()
            response = await client.post(url, content=body, headers={"Content-Type": content_type})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - began)
            else:
                failures += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return ServedRow(
        concurrency=concurrency, requests=requests, failures=failures, images_per_request=images_per_request,
        images_per_second=len(latencies) * images_per_request / elapsed,
        latency_p50_ms=percentile_ms(latencies, 50) if latencies else None,
        latency_p99_ms=percentile_ms(latencies, 99) if latencies else None,
    )


def bench_served(config: ServiceConfig, levels: list[int], requests: int,
                 images_per_request: int = 1, front_end: str = "haproxy") -> list[ServedRow]:
    import ray
    from ray import serve

    from siglip_serve.serve.app import build, pin_replicas
    from siglip_serve.serve.haproxy_front import use_front_end
    from siglip_serve.serve.runner import free_port, ray_resources

    use_front_end(front_end, local_only=True)
    port = free_port()
    config = pin_replicas(config)
    replicas = config.replicas if isinstance(config.replicas, int) else None
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, namespace="siglip-bench",
             log_to_driver=False, **ray_resources(config, replicas))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        log.info("deploying %s for the served benchmark...", config.model)
        serve.run(build(config), name="bench", route_prefix="/")
        # One image a request: its raw bytes; several: multipart file parts.
        endpoint = "raw" if images_per_request == 1 else "multipart"
        request_bodies = build_bodies(sample_photos(), endpoint, images_per_request)
        bodies = [(body.data, body.content_type) for body in request_bodies]
        url = f"http://127.0.0.1:{port}{request_bodies[0].path}"
        asyncio.run(drive(url, bodies, max(levels), 2 * max(levels), images_per_request))  # warm the path
        # Ray's processes are this process's children; this process is the client and is left out.
        server = ServerCpu.of_children()
        rows = []
        for level in levels:
            before = server.snapshot()
            row = asyncio.run(drive(url, bodies, level, max(requests, level), images_per_request))
            window = ServerCpu.between(before, server.snapshot())
            row.server_cpu = cpu = window.result((row.requests - row.failures) * images_per_request)
            log.info("served at concurrency %d: %.1f img/s, %.1f server CPU-ms per image", level,
                     row.images_per_second, cpu.ms_per_image or float("nan"))
            rows.append(row)
        return rows
    finally:
        # Not serve.shutdown(): it stops each replica gracefully, and a direct-ingress replica (the
        # HAProxy front end) drains for at least 30 s (RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S,
        # ray/serve/_private/constants.py). Nothing is in flight here; Serve's actors die with this Ray.
        ray.shutdown()
