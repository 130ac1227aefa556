"""`siglip-serve bench`: where the time goes, from the bare encoder to the served HTTP API.

Three parts, each printed as a table and written to one JSON file:
- encoder: bare `Encoder.encode` per bucket, warm-up 10 and 50 timed iterations as seed 000 does;
- preprocess: decode + resize of real ~640x480 photos on one thread (one core);
- served: the real application under a local Ray, driven over HTTP at several concurrencies.
Served ÷ bare (best bucket) is the serving efficiency.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.server_cpu import KINDS, ServerCpu
from serve.config import ServiceConfig

log = logging.getLogger("siglip_serve.bench")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the tables


def percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1e3, q))


def machine() -> dict[str, Any]:
    import os

    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}


def bench_encoder(config: ServiceConfig, warmup: int, iterations: int) -> list[dict[str, Any]]:
    from models.encoder import create_encoder

    encoder = create_encoder(config.model_settings())
    height, width = encoder.image_size
    rng = np.random.default_rng(0)
    rows = []
    for bucket in encoder.buckets:
        batch = rng.integers(0, 256, size=(bucket, 3, height, width), dtype=np.uint8)
        for _ in range(warmup):
            encoder.encode(batch)
        times = []
        for _ in range(iterations):
            began = time.perf_counter()
            encoder.encode(batch)
            times.append(time.perf_counter() - began)
        mean = statistics.fmean(times)
        rows.append({
            "bucket": bucket, "images_per_second": bucket / mean, "latency_mean_ms": mean * 1e3,
            "latency_p50_ms": percentile_ms(times, 50), "latency_p99_ms": percentile_ms(times, 99),
            "warmup": warmup, "iterations": iterations,
        })
        log.info("encoder bucket %d: %.1f img/s", bucket, bucket / mean)
    return rows


def sample_photos(size: tuple[int, int] = (640, 480)) -> list[bytes]:
    """Real photographs (scikit-image's data set), resized to about 640x480 and JPEG-encoded."""
    from PIL import Image
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.immunohistochemistry()]
    out = []
    for array in photos:
        buf = io.BytesIO()
        Image.fromarray(array).resize(size, Image.Resampling.BICUBIC).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def bench_preprocess(config: ServiceConfig, iterations: int) -> dict[str, Any]:
    import torch

    from models.loading import model_geometry
    from models.preprocess import preprocess_image

    torch.set_num_threads(1)
    image_size, _ = model_geometry(config.model)
    photos = sample_photos()
    fast = config.fast_jpeg_decode  # what the service does
    for data in photos:
        preprocess_image(data, image_size, fast_jpeg=fast)
    count = max(iterations, len(photos))
    began = time.perf_counter()
    for i in range(count):
        preprocess_image(photos[i % len(photos)], image_size, fast_jpeg=fast)
    elapsed = time.perf_counter() - began
    return {"images": count, "images_per_second": count / elapsed, "image_size_in": [640, 480],
            "image_size_out": list(image_size), "threads": 1, "fast_jpeg_decode": fast}


def request_bodies(photos: list[bytes], images_per_request: int) -> tuple[str, list[tuple[bytes, str]]]:
    """(path, [(body, content type)]): raw bytes for one image a request, multipart for several."""
    if images_per_request == 1:
        return "/v1/embeddings/image", [(p, "image/jpeg") for p in photos]
    boundary = "siglipbenchboundary"
    bodies = []
    for start in range(len(photos)):
        parts = []
        for k in range(images_per_request):
            data = photos[(start + k) % len(photos)]
            parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{k}.jpg\"\r\n"
                         "Content-Type: image/jpeg\r\n\r\n".encode() + data + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        bodies.append((body, f"multipart/form-data; boundary={boundary}"))
    return "/v1/embeddings/image", bodies


async def _drive(url: str, bodies: list[tuple[bytes, str]], concurrency: int, requests: int,
                 images_per_request: int = 1) -> dict[str, Any]:
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
    return {
        "concurrency": concurrency, "requests": requests, "failures": failures,
        "images_per_request": images_per_request,
        "images_per_second": len(latencies) * images_per_request / elapsed,
        "latency_p50_ms": percentile_ms(latencies, 50) if latencies else None,
        "latency_p99_ms": percentile_ms(latencies, 99) if latencies else None,
    }


def bench_served(config: ServiceConfig, levels: list[int], requests: int,
                 images_per_request: int = 1, front_end: str = "haproxy") -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from serve.app import build
    from serve.haproxy_front import use_front_end
    from serve.runner import free_port, ray_resources

    use_front_end(front_end, local_only=True)
    port = free_port()
    replicas = config.replicas if isinstance(config.replicas, int) else None
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, namespace="siglip-bench",
             log_to_driver=False, **ray_resources(config, replicas))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        log.info("deploying %s for the served benchmark...", config.model)
        serve.run(build(config), name="bench", route_prefix="/")
        path, bodies = request_bodies(sample_photos(), images_per_request)
        url = f"http://127.0.0.1:{port}{path}"
        asyncio.run(_drive(url, bodies, max(levels), 2 * max(levels), images_per_request))  # warm the path
        # Ray's processes are this process's children; this process is the client and is left out.
        server = ServerCpu.of_children()
        rows = []
        for level in levels:
            before = server.snapshot()
            row = asyncio.run(_drive(url, bodies, level, max(requests, level), images_per_request))
            window = ServerCpu.between(before, server.snapshot())
            served = (row["requests"] - row["failures"]) * images_per_request
            per_image = window.per_image_ms(served)
            row["server_cpu_ms_per_image"] = per_image.pop("total")
            row["server_cpu_ms_per_image_by_kind"] = per_image
            log.info("served at concurrency %d: %.1f img/s, %.1f server CPU-ms per image", level,
                     row["images_per_second"], row["server_cpu_ms_per_image"] or float("nan"))
            rows.append(row)
        return rows
    finally:
        serve.shutdown()
        ray.shutdown()


def run_bench(config: ServiceConfig, args: argparse.Namespace) -> int:
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    result: dict[str, Any] = {
        "machine": machine(), "model": config.model, "backend": config.backend,
        "weights": config.weights_source, "buckets": list(config.buckets),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if "encoder" not in skip:
        result["encoder"] = bench_encoder(config, args.warmup, args.iterations)
        print_table(f"bare encoder: {config.model} on {config.backend}", result["encoder"],
                    ["bucket", "images_per_second", "latency_p50_ms", "latency_p99_ms"])
    if "preprocess" not in skip:
        result["preprocess"] = bench_preprocess(config, max(args.iterations, 100))
        print_table("preprocessing, one thread, ~640x480 JPEG photos", [result["preprocess"]],
                    ["images", "images_per_second", "threads", "fast_jpeg_decode"])
    if "served" not in skip:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        result["front_end"] = args.front_end
        result["served"] = bench_served(config, levels, args.requests, args.images_per_request,
                                       args.front_end)
        print_table(f"served over HTTP: {config.model}, {config.replicas} encoder replica(s), "
                    f"{args.images_per_request} image(s) per request",
                    result["served"], ["concurrency", "images_per_second", "server_cpu_ms_per_image",
                                       "latency_p50_ms", "latency_p99_ms", "failures"])
        print_table("server CPU-ms per image by process kind (the whole service process tree)",
                    [{"concurrency": row["concurrency"], **row["server_cpu_ms_per_image_by_kind"]}
                     for row in result["served"]], ["concurrency", *KINDS])
    if args.multicore:
        from models.multicore_bench import format_comparison, format_workers, run_multicore

        result["multicore"] = run_multicore(config.model_settings(), args.multicore, args.multicore_bucket,
                                            args.warmup, args.iterations)
        print(f"\nmulti-core: {args.multicore} pinned workers, batch {args.multicore_bucket}")
        print(format_workers(result["multicore"]))
        print(format_comparison(result["multicore"]))
    if result.get("encoder") and result.get("served"):
        bare = max(row["images_per_second"] for row in result["encoder"])
        served = max(row["images_per_second"] for row in result["served"])
        result["served_over_bare"] = served / bare
        print(f"\nserved / bare (saturation): {served:.1f} / {bare:.1f} = {served / bare:.3f}")
    Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json_out}")
    return 0


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{c:>18}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            cells.append(f"{value:>18.2f}" if isinstance(value, float) else f"{str(value):>18}")
        print("  ".join(cells))
