"""Does the deadline hold under a burst on a busy host? A/B of two source trees, alternating, on loopback.

    .venv/bin/python tools/deadline_burst.py --src A=/path/a/src --src B=/path/b/src --rounds 2 --json out.json \
        [--busy-core] [--requests 400] [--deadline-s 0.5]

Each round, for each source tree in turn: `python -m siglip_serve run --model tiny-siglip` from that tree
(PYTHONPATH), with `request_timeout_s` set to the deadline; once /readyz answers 200, `--requests` single-image
requests are written at once on as many connections (each opened first), and each answer's status and seconds
from its write are kept; then the service is stopped. The contract (docs/http-api.md, Deadline): no client waits
longer than the deadline plus about 1 s. Prints a table; writes every round as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from siglip_serve.measure.burst import burst, busy_core, status_of
from siglip_serve.measure.service_process import stop, wait_ready

MARGIN_S = 1.0


def free_port() -> int:
    from siglip_serve.launcher.preflight import free_port as free

    return free()


def jpeg() -> bytes:
    import io

    from PIL import Image

    from siglip_serve.core.sample_photos import photo_array

    out = io.BytesIO()
    Image.fromarray(photo_array("chelsea")).save(out, format="JPEG", quality=90)
    return out.getvalue()


def one_run(src: str, requests: int, deadline_s: float, image: bytes) -> dict[str, object]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "siglip_serve", "run", "--model", "tiny-siglip", "--port", str(port),
               "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0", "--set",
               f"request_timeout_s={deadline_s}", "--set", "text_replicas=0"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/readyz", 300)
        request = (f"POST /v1/embeddings/image HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                   f"Content-Length: {len(image)}\r\nConnection: close\r\n\r\n").encode() + image
        replies = asyncio.run(burst(port, request, requests))
    finally:
        stop(proc)
    seconds = sorted(s for _, s in replies)
    late = [s for s in seconds if s > deadline_s + MARGIN_S]
    return {"statuses": dict(Counter(str(status_of(reply)) for reply, _ in replies)), "late": len(late),
            "max_s": round(seconds[-1], 3), "p50_s": round(seconds[len(seconds) // 2], 3),
            "late_seconds": [round(s, 3) for s in late[-10:]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", required=True, help="NAME=PATH of a source tree (repeat)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--deadline-s", type=float, default=0.5)
    parser.add_argument("--busy-core", action="store_true", help="keep one core busy throughout")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    trees = [tuple(item.split("=", 1)) for item in args.src]
    image = jpeg()
    runs = []
    with busy_core(args.busy_core):
        for index in range(args.rounds):
            for name, path in trees:
                run = {"round": index + 1, "tree": name, **one_run(path, args.requests, args.deadline_s, image)}
                runs.append(run)
                print(f"round {index + 1} {name}: {run['statuses']}, {run['late']} late, max {run['max_s']} s",
                      flush=True)
    args.json.write_text(json.dumps({"deadline_s": args.deadline_s, "requests": args.requests,
                                     "busy_core": args.busy_core, "cpus": os.cpu_count(),
                                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs},
                                    indent=2))
    print(f"\n| round | tree | answers by status | after deadline + {MARGIN_S:g} s | p50 (s) | max (s) |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        statuses = ", ".join(f"{k} x{v}" for k, v in sorted(run["statuses"].items()))  # type: ignore[attr-defined]
        print(f"| {run['round']} | {run['tree']} | {statuses} | {run['late']} | {run['p50_s']} | {run['max_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
