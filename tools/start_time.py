"""How long a start takes, against the hour's bare Ray + Serve start: alternating rounds of each, on loopback.

    .venv/bin/python tools/start_time.py --rounds 3 --json start.json [--busy-core] [--src A=PATH/src ...] \
        [-- RUN ARGS...]

A round starts (1) a bare `ray.init()` + `serve.start()` in a fresh interpreter, imports included, until it prints
that Serve is up, then (2) `siglip-serve run --model tiny-siglip --timings` (or the RUN ARGS given) until `/readyz`
first answers 200 (asked every 0.25 s from before the command starts), and stops it with SIGINT; with `--src`,
`python -m siglip_serve run` from each source tree in turn (its PYTHONPATH), the order turned each round. Each start is
timed from its command's launch. `run`'s own timeline (launcher/timeline.py: its phases, then each replica's) is
kept with each round. With --busy-core, a shell loop keeps one core busy throughout (as tools/busy_core.sh does).
Prints a table; writes the rounds as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from siglip_serve.core.poll import poll
from siglip_serve.measure.burst import busy_core
from siglip_serve.measure.service_process import ServiceFailed, stop, wait_ready

BIN = Path(sys.executable).parent
BARE = """
import sys
import ray
from ray import serve
ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
print("serve up", flush=True)
ray.shutdown()
"""


def free_port() -> int:
    from siglip_serve.launcher.preflight import free_port as free

    return free()


def bare_start(timeout_s: float) -> float:
    """Seconds from launch to "serve up" of a bare Ray + Serve start in a fresh interpreter."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", BARE, str(free_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("serve up"):
            seconds = time.monotonic() - began
            break
    else:
        raise RuntimeError(f"the bare start exited {proc.wait()} before Serve was up")
    proc.wait(timeout=timeout_s)
    return seconds


def run_start(run_args: list[str], timeout_s: float, src: str | None = None) -> tuple[float, list[str]]:
    """Seconds from launch to the first /readyz 200 of `siglip-serve run` (from the source tree `src`, first on
    PYTHONPATH, where given), and its start timeline's lines."""
    port = free_port()
    command = [str(BIN / "siglip-serve"), "run"] if src is None else [sys.executable, "-m", "siglip_serve", "run"]
    command += [*run_args, "--port", str(port), "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0",
                "--timings"]
    env = dict(os.environ)
    if src is not None:  # Ray's workers inherit it from the raylet this command starts
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}/readyz", timeout_s, interval_s=0.25)
        except ServiceFailed as exc:
            raise ServiceFailed(f"{exc}: " + "".join(lines)[-2000:]) from None
        seconds = time.monotonic() - began
        # The timeline is printed once every replica is warm, which /readyz's first 200 may precede.
        poll(lambda: any("until every replica is warm" in line for line in lines) or proc.poll() is not None, bool,
             timeout_s, interval_s=0.25)
    finally:
        stop(proc)
        reader.join(timeout=10)
    text = "".join(lines)
    timeline = text.split("start timeline", 1)[1].splitlines()[1:] if "start timeline" in text else []
    return seconds, [line.rstrip() for line in timeline if line.startswith("  ")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--busy-core", action="store_true", help="keep one core busy throughout")
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=PATH of a source tree to start `run` from (repeat for an A/B; default: this venv's)")
    parser.add_argument("run_args", nargs="*", help="after --: `siglip-serve run` arguments")
    args = parser.parse_args()
    run_args = args.run_args or ["--model", "tiny-siglip"]
    trees: list[tuple[str, str | None]] = [tuple(item.split("=", 1)) for item in args.src] or [("run", None)]
    rounds: list[dict[str, Any]] = []
    with busy_core(args.busy_core):
        for index in range(args.rounds):
            bare = bare_start(args.timeout_s)
            # Each round in the other order, so that no tree always starts right after the bare start.
            for name, src in trees if index % 2 == 0 else trees[::-1]:
                run, timeline = run_start(run_args, args.timeout_s, src)
                rounds.append({"round": index + 1, "tree": name, "bare_ray_serve_s": round(bare, 2),
                               "run_ready_s": round(run, 2), "run_over_bare": round(run / bare, 2),
                               "timeline": timeline})
                print(f"round {index + 1} {name}: bare Ray + Serve {bare:.1f} s, run ready {run:.1f} s "
                      f"({run / bare:.2f}x)", flush=True)
    result = {"run_args": run_args, "busy_core": args.busy_core, "cpus": os.cpu_count(), "trees": dict(trees),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": rounds,
              "median_bare_s": statistics.median(r["bare_ray_serve_s"] for r in rounds),
              "median_run_s": {name: statistics.median(r["run_ready_s"] for r in rounds if r["tree"] == name)
                               for name, _ in trees}}
    args.json.write_text(json.dumps(result, indent=2))
    print("\n| round | tree | bare Ray + Serve (s) | run ready (s) | run / bare |\n|---|---|---|---|---|")
    for r in rounds:
        print(f"| {r['round']} | {r['tree']} | {r['bare_ray_serve_s']} | {r['run_ready_s']} | {r['run_over_bare']} |")
    for name, median in result["median_run_s"].items():
        print(f"| median | {name} | {result['median_bare_s']} | {median} | |")
    for r in rounds[-len(trees):]:
        print(f"\nthe last round's timeline ({r['tree']}):\n" + "\n".join(r["timeline"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
