"""Server CPU per image for a new image against a repeated one (the embedding cache, docs/http-api.md).

Against a running `siglip-serve run ... --set embedding_cache_mib=64`: closed-loop httpx clients
(measure/served.py `drive`) post one ~640x480 JPEG per request as a JSON data URI to /v1/embeddings, in
alternating windows of new images (each a bench photo with its own 8x8 corner, never sent before: a miss)
and of one repeated image (sent once before the windows: every request a hit). The CPU is psutil's over
the whole process tree of the `run` process (--pid; measure/server_cpu.py), the client left out.

    siglip-serve run --model tiny-siglip --random-weights --set embedding_cache_mib=64 &
    python tools/cache_cpu.py --pid $! --port 8000 --json cache-cpu.json

It prints a row per window and writes every row, and the cache's counts at the end, to --json.
"""

from __future__ import annotations

import argparse
import json
import time

import httpx

from siglip_serve.measure.client_pool import ClientPool
from siglip_serve.measure.corpus import build_bodies, distinct_copies
from siglip_serve.measure.served import drive, sample_photos
from siglip_serve.measure.server_cpu import ServerCpu


def bodies(count: int, seed: int) -> list[tuple[bytes, str]]:
    """`count` JSON bodies of distinct ~640x480 JPEGs: the bench photos, each copy with its own corner."""
    return [(body.data, body.content_type)
            for body in build_bodies(distinct_copies(sample_photos(), count, seed), "json", 1)]


def window(url: str, sent: list[tuple[bytes, str]], server: ServerCpu, concurrency: int) -> dict[str, object]:
    before = server.snapshot()
    row = drive(ClientPool(sent, 1), url, concurrency, len(sent))
    cpu = ServerCpu.between(before, server.snapshot()).result(row.requests - row.failures)
    return {"img_s": round(row.images_per_second, 1), "failures": row.failures,
            "cpu_ms_per_image": round(cpu.ms_per_image or float("nan"), 3),
            "ingress_ms": round(cpu.ms_per_image_by_kind.ingress or float("nan"), 3),
            "encoder_ms": round(cpu.ms_per_image_by_kind.encoder or float("nan"), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the `siglip-serve run` process")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=600, help="requests per window")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", default="cache-cpu.json", help="where the rows go")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/v1/embeddings"
    fresh = bodies(args.rounds * args.requests + 128, seed=int(time.time()))
    warm, fresh = fresh[:128], fresh[128:]
    repeated = [warm[0]] * args.requests
    server = ServerCpu(roots=[args.pid])
    drive(ClientPool(warm, 1), url, args.concurrency, len(warm))  # warm-up; puts the repeated image in the cache
    rows = []
    print(f"{'round':>5} {'images':>9} {'img/s':>7} {'CPU-ms/img':>10} {'ingress':>8} {'encoder':>8}")
    for i in range(args.rounds):
        for kind, sent in (("new", fresh[i * args.requests:(i + 1) * args.requests]), ("repeated", repeated)):
            row = {"round": i + 1, "images": kind, "time_utc": time.strftime("%H:%M:%S", time.gmtime()),
                   **window(url, sent, server, args.concurrency)}
            rows.append(row)
            print(f"{i + 1:>5} {kind:>9} {row['img_s']:>7} {row['cpu_ms_per_image']:>10} {row['ingress_ms']:>8} "
                  f"{row['encoder_ms']:>8}", flush=True)
    stats = httpx.get(f"http://127.0.0.1:{args.port}/v1/models", timeout=30).json()["data"][0]["cache"]
    print(json.dumps({"cache": stats}))
    with open(args.json, "w") as out:
        json.dump({"rows": rows, "cache": stats, "concurrency": args.concurrency,
                   "requests_per_window": args.requests}, out, indent=1)

if __name__ == "__main__":
    main()
