"""Interactive beside bulk, and a small tenant beside a large one (issue 46), against a running service.

Each stream is closed-loop httpx clients in spawned processes of their own (a heavy stream's clients split over
--client-processes, so that neither one process's core nor another stream's event loop sets its rate), posting
one ~640x480 JPEG per request (each a distinct copy: no embedding cache answers it) for a fixed window, as a JSON
data URI to /v1/embeddings (--endpoint json) or as raw bytes to /v1/embeddings/image (--endpoint raw, as
`siglip-serve bench`'s served part posts), with its own key (Authorization: Bearer) and X-Priority header. Windows:

  interactive-alone   2 clients, X-Priority 0
  bulk-alone          --bulk-clients (32), X-Priority 2
  mixed               both at once
  small-alone         2 clients of tenant B (--key-b), no priority header
  tenants             --large-clients (64) of tenant A (--key-a) beside tenant B's 2, same lane

A service without lanes or tenants ignores the header and the keys' difference, which is the baseline. It prints a
row per stream and window with the service's CPU per image over the window (its whole process tree, found from the
process listening on --port: measure/server_cpu.py), then the ratios the issue asks about, and writes them to
--json:

    siglip-serve run --model tiny-siglip --random-weights --set api_keys_file=keys.toml &
    python tools/lanes_bench.py --port 8000 --key-a KEY_A --key-b KEY_B --seconds 30 --json lanes.json

measure/lanes_service.py starts the service itself, with a keys file of two tenants (the device check's lanes
steps). A spawned stream process imports this module: it imports nothing of Ray, torch or pydantic at the top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from siglip_serve.measure.client_pool import split

if TYPE_CHECKING:
    from siglip_serve.measure.results import ServerCpuResult
    from siglip_serve.measure.server_cpu import ServerCpu

Bodies = list[tuple[bytes, str]]
WINDOWS = ("interactive-alone", "bulk-alone", "mixed", "small-alone", "tenants")
# After every stream process said it is ready, the window starts this much later for all of them at once.
START_S = 0.5


@dataclass
class Stream:
    name: str
    clients: int
    key: str | None
    priority: int | None
    processes: int = 1


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


def summarize(stream: Stream, latencies: list[float], failures: int, seconds: float) -> StreamResult:
    ms = np.array(latencies) * 1e3
    return StreamResult(stream.name, stream.clients, len(latencies), failures, round(seconds, 2),
                        round(len(latencies) / seconds, 2) if seconds > 0 else 0.0,
                        round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
                        round(float(np.percentile(ms, 99)), 1) if len(ms) else None)


async def _drive(link: Connection, url: str, stream: Stream, bodies: Bodies,
                 seconds: float) -> tuple[list[float], int, float]:
    """`stream.clients` closed-loop clients for `seconds` from the window's start: every answered request's latency,
    the failures, the seconds it took. The client is built and "ready" said first, so that nothing of the set-up
    (httpx's import, its SSL context), which a loaded machine can stretch past a short window, is in the window."""
    import httpx

    headers = {}
    if stream.key:
        headers["Authorization"] = f"Bearer {stream.key}"
    if stream.priority is not None:
        headers["X-Priority"] = str(stream.priority)
    latencies: list[float] = []
    failures = 0
    limits = httpx.Limits(max_connections=stream.clients, max_keepalive_connections=stream.clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        link.send("ready")
        start_at = link.recv()  # nothing else runs on this loop yet: a blocking wait is fine
        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.monotonic()
        until = began + seconds

        async def client_loop(offset: int) -> None:
            nonlocal failures
            i = offset
            while time.monotonic() < until:
                body, content_type = bodies[i % len(bodies)]
                sent = time.perf_counter()
                try:
                    response = await client.post(url, content=body, headers={**headers, "Content-Type": content_type})
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    failures += 1
                i += stream.clients

        await asyncio.gather(*(client_loop(k) for k in range(stream.clients)))
        took = time.monotonic() - began
    return latencies, failures, took


def _stream_process(link: Connection, url: str, stream: Stream, bodies: Bodies, seconds: float) -> None:
    """One process of a stream: build its client, say "ready", take the window's start (wall clock), drive,
    answer (or say what failed, which the parent raises naming the stream)."""
    try:
        link.send(asyncio.run(_drive(link, url, stream, bodies, seconds)))
    except Exception as exc:
        link.send(f"{type(exc).__name__}: {exc}")


def window(url: str, streams: list[Stream], seconds: float, bodies: Bodies,
           server: ServerCpu | None = None) -> tuple[list[StreamResult], ServerCpuResult | None]:
    """Every stream at once for `seconds`, each in its own processes, started together once every one is ready;
    with `server`, the service's process tree's CPU over the window, per image answered."""
    from siglip_serve.measure.server_cpu import ServerCpu

    context = multiprocessing.get_context("spawn")
    parts = [replace(stream, clients=clients) for stream in streams
             for clients in split(stream.clients, max(1, min(stream.processes, stream.clients)))]
    links, procs = [], []
    for part in parts:
        mine, theirs = context.Pipe()
        proc = context.Process(target=_stream_process, args=(theirs, url, part, bodies, seconds), daemon=True,
                               name=f"lanes-{part.name}")
        proc.start()
        theirs.close()
        links.append(mine)
        procs.append(proc)
    try:
        for link, part in zip(links, parts, strict=True):
            said = link.recv()  # "ready": its client built and waiting for the start
            if said != "ready":
                raise RuntimeError(f"stream {part.name}: {said}")
        start_at = time.time() + START_S
        for link in links:
            link.send(start_at)
        time.sleep(max(0.0, start_at - time.time()))
        before = server.snapshot() if server is not None else None
        gathered: dict[str, tuple[list[float], int, float]] = {}
        errors = []
        for link, part in zip(links, parts, strict=True):
            answer = link.recv() if link.poll(seconds + 180) else "no answer within the window and 180 s"
            if isinstance(answer, str):
                errors.append(f"stream {part.name}: {answer}")
                continue
            latencies, failures, took = gathered.get(part.name, ([], 0, 0.0))
            gathered[part.name] = (latencies + answer[0], failures + answer[1], max(took, answer[2]))
        if errors:
            raise RuntimeError("; ".join(errors))
        cpu = None
        if server is not None and before is not None:
            answered = sum(len(latencies) for latencies, _, _ in gathered.values())
            cpu = ServerCpu.between(before, server.snapshot()).result(answered)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for link in links:
            link.close()
    return [summarize(stream, *gathered[stream.name]) for stream in streams], cpu


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


def streams_of(key_a: str | None, key_b: str | None, bulk_clients: int, large_clients: int,
               processes: int) -> dict[str, list[Stream]]:
    """Each window's streams: the two heavy ones (the backfill, the large tenant) over `processes` each."""
    interactive = Stream("interactive", 2, key_a, 0)
    bulk = Stream("bulk", bulk_clients, key_a, 2, processes)
    small = Stream("small", 2, key_b or key_a, None)
    large = Stream("large", large_clients, key_a, None, processes)
    return {"interactive-alone": [interactive], "bulk-alone": [bulk], "mixed": [interactive, bulk],
            "small-alone": [small], "tenants": [large, small]}


def bench_bodies(endpoint: str, count: int = 64, seed: int = 46) -> tuple[str, Bodies]:
    """The path and `count` bodies of distinct ~640x480 JPEGs (the served bench's photos) for `endpoint`."""
    from siglip_serve.measure.corpus import build_bodies, distinct_copies
    from siglip_serve.measure.served import sample_photos

    built = build_bodies(distinct_copies(sample_photos(), count, seed), endpoint, 1)
    return built[0].path, [(body.data, body.content_type) for body in built]


def run_windows(port: int, windows: list[str], streams: dict[str, list[Stream]], seconds: float, endpoint: str,
                warmup_s: float = 5.0, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Each window in turn against the service on `port`, after a short warm-up: every stream's row, the
    service's CPU per image in each window, the ratios."""
    from siglip_serve.measure.server_cpu import ServerCpu

    path, bodies = bench_bodies(endpoint)
    url = f"http://127.0.0.1:{port}{path}"
    server = ServerCpu.listening_on(port)
    key = next(iter(streams["bulk-alone"])).key
    window(url, [Stream("warm-up", 4, key, None)], warmup_s, bodies)
    rows: dict[str, list[StreamResult]] = {}
    cpu: dict[str, ServerCpuResult | None] = {}
    echo(f"{'window':<18} {'stream':<12} {'clients':>7} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6} "
         f"{'server CPU-ms/img':>17}")
    for name in windows:
        rows[name], used = window(url, streams[name], seconds, bodies, server)
        cpu[name] = used
        ms = used.ms_per_image if used is not None else None
        for r in rows[name]:
            echo(f"{name:<18} {r.name:<12} {r.clients:>7} {r.requests_per_second:>7} {r.p50_ms!s:>7} "
                 f"{r.p99_ms!s:>7} {r.failures:>6} {'' if ms is None else round(ms, 2)!s:>17}")
    figures = ratios(rows)
    echo(json.dumps(figures, indent=1))
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": seconds, "endpoint": endpoint,
            "windows": {k: [asdict(r) for r in v] for k, v in rows.items()},
            "server_cpu": {k: v.model_dump() if v is not None else None for k, v in cpu.items()}, "ratios": figures}


def windows_option(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(WINDOWS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; known: {', '.join(WINDOWS)}")
    return names


def client_processes(text: str) -> int:
    """A count, or `auto`: measure/client_pool.py's rule for this machine's usable cores."""
    from siglip_serve.core.host import usable_cpus
    from siglip_serve.measure.client_pool import auto_client_processes, parse_client_processes

    try:
        count = parse_client_processes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return count if count is not None else auto_client_processes(usable_cpus())


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The windows' options, shared with measure/lanes_service.py."""
    parser.add_argument("--seconds", type=float, default=30.0, help="each window's length")
    parser.add_argument("--windows", type=windows_option, default=list(WINDOWS),
                        help=f"the windows to run, in order (default all: {','.join(WINDOWS)}); a ratio whose "
                             "windows did not run is null")
    parser.add_argument("--endpoint", choices=("json", "raw"), default="json",
                        help="JSON data URIs to /v1/embeddings (default) or raw bytes to /v1/embeddings/image")
    parser.add_argument("--bulk-clients", type=int, default=32, help="the backfill's clients (X-Priority 2)")
    parser.add_argument("--large-clients", type=int, default=64, help="the large tenant's clients")
    parser.add_argument("--client-processes", type=client_processes, default=1,
                        help="processes each of the two heavy streams is split over (one asyncio client process "
                             "serves a few hundred requests a second; auto: siglip-serve bench's rule)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tools/lanes_bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--key-a", default=None, help="tenant A's key (the backfill and the large tenant)")
    parser.add_argument("--key-b", default=None, help="tenant B's key (the small tenant; default: tenant A's)")
    parser.add_argument("--json", default="lanes-bench.json")
    add_load_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    streams = streams_of(args.key_a, args.key_b, args.bulk_clients, args.large_clients, args.client_processes)
    record = run_windows(args.port, args.windows, streams, args.seconds, args.endpoint,
                         echo=lambda line: print(line, flush=True))
    with open(args.json, "w") as out:
        json.dump(record, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
