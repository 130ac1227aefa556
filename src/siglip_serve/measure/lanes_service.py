"""`python -m siglip_serve.measure.lanes_service --json lanes.json ...`: measure/lanes_bench.py's windows against
a `siglip-serve run` this command starts, and stops, itself (the device check's `lanes` steps).

Beside the --json file it writes a keys file (`api_keys_file`, serve/shared/tenants.py) of two tenants, both in
the interactive lane, as the benchmark log's lanes runs had them: the interactive and the backfill streams are
tenant A's requests at X-Priority 0 and 2, the large tenant is tenant A's, the small one tenant B's. The service
runs on free loopback ports with the text tower off (the windows post images only, and a text replica would hold
a device of its own); with --interactive-encoder it runs two image replicas, one kept for the interactive lane,
and /readyz waits for both. Once the windows ran it writes their rows and ratios with what it served, and stops
the service (SIGTERM; nothing is in flight by then).
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from siglip_serve.core.cli import key_value, run_main
from siglip_serve.measure.lanes_bench import add_load_arguments, run_windows, streams_of
from siglip_serve.measure.service_process import stop as stop_service
from siglip_serve.measure.service_process import wait_ready

# The two tenants of the keys file.
TENANTS = ("tenant-a", "tenant-b")


def keys_file(path: Path) -> tuple[str, str]:
    """Write a keys file of the two tenants, both in the interactive lane; their two keys."""
    keys = (secrets.token_urlsafe(24), secrets.token_urlsafe(24))
    path.write_text("".join(f'[[keys]]\nname = "{name}"\nkey = "{key}"\nlane = "interactive"\n\n'
                            for name, key in zip(TENANTS, keys, strict=True)))
    path.chmod(0o600)
    return keys


def run_command(args: argparse.Namespace, keys: Path, port: int, metrics_port: int) -> list[str]:
    """`siglip-serve run` for the windows: the keys file, text off, and the kept replica where asked."""
    command = [sys.executable, "-m", "siglip_serve", "run", "--model", args.model, "--backend", args.backend,
               *(["--random-weights"] if args.random_weights else []), "--port", str(port),
               "--metrics-port", str(metrics_port), "--haproxy-metrics-port", "0",
               "--set", f"api_keys_file={keys}", "--set", "text_replicas=0"]
    if args.interactive_encoder:
        command += ["--set", "interactive_encoder=true", "--set", "replicas=2", "--set", "min_ready_replicas=2"]
    for key, value in args.set:
        command += ["--set", f"{key}={value}"]
    return command


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from siglip_serve.launcher.preflight import free_port

    out = Path(args.json).resolve()
    keys = out.with_name(out.stem + "-keys.toml")
    key_a, key_b = keys_file(keys)
    port = free_port()
    command = run_command(args, keys, port, free_port())
    print("starting:", " ".join(command[2:]), flush=True)
    proc = subprocess.Popen(command)
    try:
        ready_s = wait_ready(proc, f"http://127.0.0.1:{port}/readyz", args.ready_timeout)
        print(f"ready in {ready_s:.1f} s", flush=True)
        streams = streams_of(key_a, key_b, args.bulk_clients, args.large_clients, args.client_processes)
        record = run_windows(port, args.windows, streams, args.seconds, args.endpoint, min(5.0, args.seconds),
                             echo=lambda line: print(line, flush=True))
    finally:
        stop_service(proc, 60.0, signal.SIGTERM)
    record |= {"interactive_encoder": args.interactive_encoder, "bulk_clients": args.bulk_clients,
               "large_clients": args.large_clients, "client_processes": args.client_processes,
               "ready_seconds": round(ready_s, 1), "service": command[2:]}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return record


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m siglip_serve.measure.lanes_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the windows' rows and ratios go")
    parser.add_argument("--model", default="tiny-siglip")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--interactive-encoder", action="store_true",
                        help="keep one of two image replicas for the interactive lane (`interactive_encoder`)")
    parser.add_argument("--set", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help="more of `siglip-serve run`'s settings (repeatable)")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /readyz")
    add_load_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        measure(args)
        return 0

    return run_main(command)


if __name__ == "__main__":
    raise SystemExit(main())
