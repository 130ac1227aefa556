"""Interactive beside bulk, and a small tenant beside a large one (issue 46), against a running service.

Each stream is closed-loop httpx clients in a process of its own (so a backfill's 32 or 64 clients cannot
delay the small stream's own event loop), posting one ~640x480 JPEG per request as a JSON data URI to
/v1/embeddings for a fixed window, with its own key (Authorization: Bearer) and X-Priority header. Windows:

  interactive-alone   2 clients, X-Priority 0
  bulk-alone          32 clients, X-Priority 2
  mixed               both at once
  small-alone         2 clients of tenant B (--key-b), no priority header
  tenants             64 clients of tenant A (--key-a) beside tenant B's 2, same lane

A service without lanes or tenants (an older main) ignores the header and the keys' difference, which is the
baseline. It prints a row per stream and window with the service's CPU per image over the window (its whole process
tree, found from the process listening on --port: measure/server_cpu.py), then the ratios the issue asks about,
and writes them to --json:

    siglip-serve run --model tiny-siglip --random-weights --set api_keys_file=keys.toml &
    python tools/lanes_bench.py --port 8000 --key-a KEY_A --key-b KEY_B --seconds 30 --json lanes.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_cpu  # a sibling script, not a package

from siglip_serve.measure.results import ServerCpuResult
from siglip_serve.measure.server_cpu import ServerCpu


@dataclass
class Stream:
    name: str
    clients: int
    key: str | None
    priority: int | None


@dataclass
class StreamResult:
    name: str
    clients: int
    answered: int
    failures: int
    seconds: float
    requests_per_second: float
    p50_ms: float | None
    p99_ms: float | None


def bodies(count: int = 64, seed: int = 46) -> list[bytes]:
    """`count` JSON bodies of distinct ~640x480 JPEGs, as tools/cache_cpu.py makes them."""
    return [body for body, _ in cache_cpu.bodies(count, seed)]


def summarize(stream: Stream, latencies: list[float], failures: int, seconds: float) -> StreamResult:
    ms = np.array(latencies) * 1e3
    return StreamResult(stream.name, stream.clients, len(latencies), failures, round(seconds, 2),
                        round(len(latencies) / seconds, 2) if seconds > 0 else 0.0,
                        round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
                        round(float(np.percentile(ms, 99)), 1) if len(ms) else None)


async def _run(url: str, stream: Stream, until: float, sent: list[bytes]) -> StreamResult:
    headers = {"Content-Type": "application/json"}
    if stream.key:
        headers["Authorization"] = f"Bearer {stream.key}"
    if stream.priority is not None:
        headers["X-Priority"] = str(stream.priority)
    latencies: list[float] = []
    failures = 0

    async def client_loop(client: httpx.AsyncClient, offset: int) -> None:
        nonlocal failures
        i = offset
        while time.monotonic() < until:
            began = time.perf_counter()
            try:
                response = await client.post(url, content=sent[i % len(sent)], headers=headers)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - began)
            else:
                failures += 1
            i += stream.clients

    limits = httpx.Limits(max_connections=stream.clients, max_keepalive_connections=stream.clients)
    began = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, k) for k in range(stream.clients)))
    return summarize(stream, latencies, failures, time.monotonic() - began)


def _stream_process(url: str, stream: Stream, start_at: float, until: float, out: multiprocessing.Queue) -> None:
    sent = bodies()
    time.sleep(max(0.0, start_at - time.time()))
    out.put(asdict(asyncio.run(_run(url, stream, time.monotonic() + (until - time.time()), sent))))


def window(url: str, streams: list[Stream], seconds: float,
           server: ServerCpu | None = None) -> tuple[list[StreamResult], ServerCpuResult | None]:
    """Every stream at once for `seconds`, each in its own process, started together; with `server`, the
    service's process tree's CPU over the window, per image answered."""
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 3.0  # the processes' start (imports, bodies) before the window
    procs = [context.Process(target=_stream_process, args=(url, s, start_at, start_at + seconds, out))
             for s in streams]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.time()))
    before = server.snapshot() if server is not None else None
    results = [StreamResult(**out.get(timeout=seconds + 180)) for _ in procs]
    cpu = None
    if server is not None and before is not None:
        cpu = ServerCpu.between(before, server.snapshot()).result(sum(r.answered for r in results))
    for proc in procs:
        proc.join()
    order = [s.name for s in streams]
    return sorted(results, key=lambda r: order.index(r.name)), cpu


WINDOWS = ("interactive-alone", "bulk-alone", "mixed", "small-alone", "tenants")


def ratios(rows: dict[str, list[StreamResult]]) -> dict[str, float | None]:
    """The issue's figures: the small stream's p99 beside the large one over its p99 alone, and the large
    stream's throughput beside the small one over its throughput alone minus the small one's share."""
    def get(window_name: str, stream: str) -> StreamResult | None:
        return next((r for r in rows.get(window_name, []) if r.name == stream), None)

    def p99_ratio(beside: StreamResult | None, alone: StreamResult | None) -> float | None:
        if beside is None or alone is None or not beside.p99_ms or not alone.p99_ms:
            return None
        return round(beside.p99_ms / alone.p99_ms, 2)

    interactive, bulk, bulk_alone = get("mixed", "interactive"), get("mixed", "bulk"), get("bulk-alone", "bulk")
    large = get("tenants", "large")
    kept = None
    if interactive is not None and bulk is not None and bulk_alone is not None:
        room = bulk_alone.requests_per_second - interactive.requests_per_second
        kept = round(bulk.requests_per_second / room, 2) if room > 0 else None
    return {"interactive_p99_beside_bulk_over_alone": p99_ratio(interactive, get("interactive-alone", "interactive")),
            "bulk_kept_of_alone_minus_interactive": kept,
            "small_tenant_p99_beside_large_over_alone": p99_ratio(get("tenants", "small"), get("small-alone", "small")),
            "large_tenant_requests_per_second": large.requests_per_second if large is not None else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--key-a", default=None, help="tenant A's key (the backfill and the large tenant)")
    parser.add_argument("--key-b", default=None, help="tenant B's key (the small tenant; default: tenant A's)")
    parser.add_argument("--seconds", type=float, default=30.0, help="each window's length")
    parser.add_argument("--json", default="lanes-bench.json")
    parser.add_argument("--windows", default=",".join(WINDOWS),
                        help=f"the windows to run, in order (default all: {','.join(WINDOWS)}); a ratio whose "
                             "windows did not run is null")
    args = parser.parse_args()
    unknown = set(args.windows.split(",")) - set(WINDOWS)
    if unknown:
        parser.error(f"--windows: unknown {', '.join(sorted(unknown))}; known: {', '.join(WINDOWS)}")
    url = f"http://127.0.0.1:{args.port}/v1/embeddings"
    key_b = args.key_b or args.key_a
    interactive = Stream("interactive", 2, args.key_a, 0)
    bulk = Stream("bulk", 32, args.key_a, 2)
    small = Stream("small", 2, key_b, None)
    large = Stream("large", 64, args.key_a, None)
    every = {"interactive-alone": [interactive], "bulk-alone": [bulk], "mixed": [interactive, bulk],
             "small-alone": [small], "tenants": [large, small]}
    windows = {name: every[name] for name in args.windows.split(",")}
    server = ServerCpu.listening_on(args.port)
    window(url, [Stream("warm-up", 4, args.key_a, None)], 5.0)
    rows: dict[str, list[StreamResult]] = {}
    cpu: dict[str, ServerCpuResult | None] = {}
    print(f"{'window':<18} {'stream':<12} {'clients':>7} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6} "
          f"{'server CPU-ms/img':>17}")
    for name, streams in windows.items():
        rows[name], used = window(url, streams, args.seconds, server)
        cpu[name] = used
        ms = used.ms_per_image if used is not None else None
        for r in rows[name]:
            print(f"{name:<18} {r.name:<12} {r.clients:>7} {r.requests_per_second:>7} {r.p50_ms!s:>7} "
                  f"{r.p99_ms!s:>7} {r.failures:>6} {'' if ms is None else round(ms, 2)!s:>17}", flush=True)
    figures = ratios(rows)
    print(json.dumps(figures, indent=1))
    with open(args.json, "w") as out:
        json.dump({"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": args.seconds,
                   "windows": {k: [asdict(r) for r in v] for k, v in rows.items()},
                   "server_cpu": {k: v.model_dump() if v is not None else None for k, v in cpu.items()},
                   "ratios": figures}, out, indent=1)


if __name__ == "__main__":
    main()
