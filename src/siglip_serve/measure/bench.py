"""`siglip-serve bench`: where the time goes, from the bare encoder to the served HTTP API.

Three parts, each printed as a table and written into one BenchResult JSON (measure/results.py):
- encoder: bare `Encoder.encode` per bucket, warm-up 10 and 50 timed iterations as seed 000 does;
- preprocess: decode + resize of real ~640x480 photos on one thread (one core);
- served: the real application under a local Ray, driven over HTTP at several concurrencies
  (measure/served.py).
Served ÷ bare (best bucket) is the serving efficiency. With a price (--price-per-hour or --instance,
measure/prices.py) each served row gets its dollars per million images, and the bare encoder's best bucket its
own for the whole instance (times --accelerators, capped at the host ceiling where one was measured).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from siglip_serve.core.backends import NO_MODEL_BACKEND, backend_record
from siglip_serve.measure.bound import judge
from siglip_serve.measure.client_pool import auto_client_processes
from siglip_serve.measure.prices import BarePrice, Price, bare_price, dollars, usd_per_million
from siglip_serve.measure.results import BenchResult, ClientCpu, EncoderRow, Machine, PreprocessResult
from siglip_serve.measure.served import BENCH_PHOTO_SIZE, bench_served, percentile_ms, sample_photos
from siglip_serve.measure.server_cpu import KINDS
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.service_plan import ServicePlan

log = logging.getLogger("siglip_serve.bench")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the tables


def machine() -> Machine:
    return Machine(host=platform.node(), cpu=platform.processor() or platform.machine(), cpus=os.cpu_count())


def bench_encoder(config: ServiceConfig, warmup: int, iterations: int) -> list[EncoderRow]:
    from siglip_serve.models.backends.implementation import create_encoder

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
        rows.append(EncoderRow(bucket=bucket, images_per_second=bucket / mean, latency_mean_ms=mean * 1e3,
                               latency_p50_ms=percentile_ms(times, 50), latency_p99_ms=percentile_ms(times, 99),
                               warmup=warmup, iterations=iterations))
        log.info("encoder bucket %d: %.1f img/s", bucket, bucket / mean)
    return rows


def bench_preprocess(config: ServiceConfig, iterations: int) -> PreprocessResult:
    import torch

    from siglip_serve.models.loading import model_geometry
    from siglip_serve.models.preprocess import preprocess_image

    torch.set_num_threads(1)
    image_size, _ = model_geometry(config.source)
    photos = [photo.data for photo in sample_photos()]
    fast = config.fast_jpeg_decode  # what the service does
    for data in photos:
        preprocess_image(data, image_size, fast_jpeg=fast)
    count = max(iterations, len(photos))
    began = time.perf_counter()
    for i in range(count):
        preprocess_image(photos[i % len(photos)], image_size, fast_jpeg=fast)
    elapsed = time.perf_counter() - began
    return PreprocessResult(images=count, images_per_second=count / elapsed, image_size_in=list(BENCH_PHOTO_SIZE),
                            image_size_out=list(image_size), threads=1, fast_jpeg_decode=fast)


def run_bench(config: ServiceConfig, args: argparse.Namespace) -> int:
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    price: Price | None = args.price
    result = BenchResult(machine=machine(), model=config.model, backend=config.backend,
                         weights=config.weights_source, buckets=list(config.buckets),
                         created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), price=price)
    priced = ["usd_per_million_images"] if price is not None else []
    if "encoder" not in skip:
        result.encoder = bench_encoder(config, args.warmup, args.iterations)
        print_table(f"bare encoder: {config.model} on {config.backend}", result.encoder,
                    ["bucket", "images_per_second", "latency_p50_ms", "latency_p99_ms"])
    if "preprocess" not in skip:
        result.preprocess = bench_preprocess(config, max(args.iterations, 100))
        print_table("preprocessing, one thread, ~640x480 JPEG photos", [result.preprocess],
                    ["images", "images_per_second", "threads", "fast_jpeg_decode"])
    if "served" not in skip:
        from siglip_serve.core.host import usable_cpus

        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        result.front_end = args.front_end
        endpoint = args.endpoint or ("raw" if args.images_per_request == 1 else "multipart")
        result.endpoint = endpoint
        shape = ""

        def planned(plan: ServicePlan) -> None:
            nonlocal shape
            image = plan.model.image
            result.replicas, result.ingress_replicas = image.replicas, plan.ingress.replicas
            shape = f"{image.replicas} encoder replica(s)"
            if backend_record(config.backend).host_cores:
                result.torch_threads = image.torch_threads or usable_cpus()
                shape += f" x {result.torch_threads} torch thread(s)"
            shape += f", {result.ingress_replicas} ingress replica(s)"

        profile = (Path(args.profile), args.profile_seconds) if args.profile else None
        clients = args.client_processes or auto_client_processes(usable_cpus())
        result.served, result.host_ceiling, result.profiles = bench_served(
            config, levels, args.requests, args.images_per_request, args.front_end, endpoint,
            host_ceiling="host-ceiling" not in skip, profile=profile, on_plan=planned, client_processes=clients)
        if price is not None:
            for row in result.served:
                row.usd_per_million_images = usd_per_million(row.images_per_second, price.usd_per_hour)
        print_table(f"served over HTTP: {config.model}, {shape}, "
                    f"{args.images_per_request} image(s) per request ({endpoint}), {clients} client process(es)"
                    + (f", priced at {price.label()}" if price is not None else ""),
                    [{**row.model_dump(), "server_cpu_ms_per_image": row.server_cpu and row.server_cpu.ms_per_image,
                      **client_columns(row.client_cpu), "usd_per_million_images": dollars(row.usd_per_million_images)}
                     for row in result.served],
                    ["concurrency", "images_per_second", "server_cpu_ms_per_image", "latency_p50_ms",
                     "latency_p99_ms", "failures", *CLIENT_COLUMNS, *priced])
        print_table("server CPU-ms per image by process kind (the whole service process tree)",
                    [{"concurrency": row.concurrency, **row.server_cpu.ms_per_image_by_kind.model_dump()}
                     for row in result.served if row.server_cpu], ["concurrency", *KINDS])
        if result.profiles:
            print_table(f"flame graphs under concurrency {max(levels)} (py-spy, {args.profile_seconds:g} s each)",
                        [p.model_dump() for p in result.profiles], ["kind", "pid", "path", "error"])
        if result.host_ceiling is not None:
            print_table(f"host ceiling: the same deployment with no model ({NO_MODEL_BACKEND}), same client",
                        [{**result.host_ceiling.model_dump(),
                          "server_cpu_ms_per_image": result.host_ceiling.server_cpu
                          and result.host_ceiling.server_cpu.ms_per_image,
                          **client_columns(result.host_ceiling.client_cpu)}],
                        ["concurrency", "images_per_second", "server_cpu_ms_per_image", "images_per_second_per_core",
                         *CLIENT_COLUMNS])
    if args.multicore:
        from siglip_serve.measure.multicore import format_comparison, format_workers, run_multicore

        result.multicore = run_multicore(config.model_settings(), args.multicore, args.multicore_bucket,
                                         args.warmup, args.iterations)
        print(f"\nmulti-core: {args.multicore} pinned workers, batch {args.multicore_bucket}")
        print(format_workers(result.multicore))
        print(format_comparison(result.multicore))
    if result.encoder and result.served:
        bare = max(row.images_per_second for row in result.encoder)
        served = max(row.images_per_second for row in result.served)
        result.served_over_bare = served / bare
        print(f"\nserved / bare (saturation): {served:.1f} / {bare:.1f} = {served / bare:.3f}")
        if result.host_ceiling is not None:
            # Each replica has a device of its own on an accelerator; on cpu they share the one host.
            device = bare * (result.replicas or 1 if not backend_record(config.backend).host_cores else 1)
            top = max(result.served, key=lambda row: row.concurrency)
            result.bound = judge(result.host_ceiling.images_per_second, device, served,
                                 busiest_client(top.client_cpu, result.host_ceiling.client_cpu))
            print(f"{result.bound.verdict}: {result.bound.explanation}")
    if price is not None and result.encoder:
        best = max(result.encoder, key=lambda row: row.images_per_second)
        ceiling = result.host_ceiling.images_per_second if result.host_ceiling is not None else None
        result.bare_price = bare_price(price, best.bucket, best.images_per_second, ceiling)
        print(bare_price_line(result.bare_price, price))
    result.write(args.json_out)
    print(f"wrote {args.json_out}")
    return 0


def bare_price_line(bare: BarePrice, price: Price) -> str:
    """The bare encoder's best bucket priced for the instance, saying how its images a second were counted."""
    count = (f"{bare.per_accelerator_images_per_second:.1f} img/s per accelerator x {price.accelerators}"
             + (f", capped at the host ceiling's {bare.images_per_second:.1f}" if bare.capped_by_host_ceiling else ""))
    return (f"bare encoder, bucket {bare.bucket}, for the instance: {count}: "
            f"{dollars(bare.usd_per_million_images, 'n/a')} per 1M images at {price.label()}")


# The client's own CPU in the served tables: its processes, their CPU seconds, the busiest one's share of a core.
CLIENT_COLUMNS = ["client_processes", "client_cpu_s", "client_busiest_core"]


def client_columns(cpu: ClientCpu | None) -> dict[str, Any]:
    if cpu is None:
        return {}
    return {"client_processes": cpu.client_processes, "client_cpu_s": cpu.seconds,
            "client_busiest_core": cpu.busiest_process_core_fraction}


def busiest_client(*cpus: ClientCpu | None) -> float | None:
    """The busiest client process's share of a core over the given levels; None where none was measured."""
    fractions = [cpu.busiest_process_core_fraction for cpu in cpus if cpu is not None]
    return max(fractions) if fractions else None


def print_table(title: str, rows: list[Any], columns: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{c:>18}" for c in columns))
    for row in rows:
        values = row if isinstance(row, dict) else row.model_dump()
        cells = []
        for c in columns:
            value = values.get(c)
            cells.append(f"{value:>18.2f}" if isinstance(value, float) else f"{str(value):>18}")
        print("  ".join(cells))
