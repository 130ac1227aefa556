"""Seed 000's multi-core benchmark: one worker process per logical core, all at once, summed.

Each worker is pinned to device <i> by its backend's visible-devices variable (NEURON_RT_VISIBLE_CORES,
CUDA_VISIBLE_DEVICES: serve/plan/placement.py) and, for a compiled artifact, NEURON_LOGICAL_NC_CONFIG = its
LNC; it loads the bare encoder for one bucket, warms up, waits until every worker is ready, then
times `iterations` calls of `Encoder.encode` on one batch. Instance throughput is the sum of the
workers' img/s (the seed's method); the wall-clock figure (all images over the span from the first
start to the last end) is reported beside it. Where the model runs on the host's cores (cpu) each
worker runs torch with one thread, so N workers use N cores.

Writes a MulticoreResult (measure/results.py) with the seed's rows (measure/seed.py) beside it.

    python -m siglip_serve.measure.multicore --backend neuron --artifact-dir artifacts/so400m-lnc2 --cores 4 --bucket 1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from siglip_serve.core.cli import SettingsError, add_log_level, run_main, setup_logging
from siglip_serve.core.constants import LNC_ENV, MULTICORE_WORKER_ENV
from siglip_serve.core.errors import UserError
from siglip_serve.measure.results import Machine, MulticoreResult, MulticoreWorker
from siglip_serve.measure.seed import SEED_INSTANCE_METHOD, SEED_REFERENCE, measured_like_the_seed, seed_rows_for
from siglip_serve.models.cli_args import add_model_arguments, model_settings_of, settings_from_args, validate_settings
from siglip_serve.models.settings import ModelSettings

if TYPE_CHECKING:  # the workers never plan
    from siglip_serve.serve.plan.placement import ReplicaAsks

log = logging.getLogger("siglip_serve.multicore")

WORKER_SPEC_ENV = MULTICORE_WORKER_ENV
_TAG = "@@siglip-multicore"
READY_TIMEOUT_S = 1800.0  # loading a compiled SO400M artifact takes a while per core


def _emit(kind: str, payload: dict[str, Any]) -> None:
    print(f"{_TAG} {kind} {json.dumps(payload)}", flush=True)


def _worker() -> int:
    """One pinned worker: load, warm up, report READY, wait for GO, time, report RESULT."""
    from siglip_serve.core.backends import backend_record
    from siglip_serve.models.backends.implementation import create_encoder

    spec = json.loads(os.environ[WORKER_SPEC_ENV])
    settings = ModelSettings.model_validate(spec["settings"])
    # The device it was pinned to; where the backend names none, its index among the workers.
    variable = backend_record(settings.backend).visible_devices_env
    bucket, core = int(spec["bucket"]), os.environ.get(variable) if variable else str(spec["index"])
    encoder = create_encoder(settings)
    encoder.warmup(iterations=int(spec["warmup"]))
    height, width = encoder.image_size
    batch = np.random.default_rng(int(spec["index"])).integers(0, 256, (bucket, 3, height, width), dtype=np.uint8)
    _emit("READY", {"core": core, "pid": os.getpid()})
    if sys.stdin.readline().strip() != "GO":
        return 1
    latencies = []
    start = time.time()
    began = time.perf_counter()
    for _ in range(int(spec["iterations"])):
        t = time.perf_counter()
        encoder.encode(batch)
        latencies.append(time.perf_counter() - t)
    seconds = time.perf_counter() - began
    ms = np.array(latencies) * 1e3
    images = bucket * len(latencies)
    _emit("RESULT", MulticoreWorker(
        core=core, pid=os.getpid(), images=images, seconds=seconds, images_per_second=images / seconds,
        latency_mean_ms=float(ms.mean()), latency_p50_ms=float(np.percentile(ms, 50)),
        latency_p99_ms=float(np.percentile(ms, 99)), start=start, end=start + seconds,
        lnc_env=os.environ.get(LNC_ENV),
    ).model_dump())
    return 0


class _Worker:
    def __init__(self, index: int, env: dict[str, str], messages: queue.Queue[tuple[int, str, Any]]) -> None:
        self.index = index
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "siglip_serve.measure.multicore", "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, text=True)
        threading.Thread(target=self._read, args=(messages,), daemon=True).start()

    def _read(self, messages: queue.Queue[tuple[int, str, Any]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_TAG):
                _, kind, payload = line.rstrip("\n").split(" ", 2)
                messages.put((self.index, kind, json.loads(payload)))
        messages.put((self.index, "EXIT", None))

    def stderr_tail(self, lines: int = 15) -> str:
        self.stderr.seek(0)
        return "\n".join(self.stderr.read().decode(errors="replace").splitlines()[-lines:])


class BenchFailed(UserError, RuntimeError):
    """A worker died or went silent; the message carries its stderr's tail."""


def _collect(workers: list[_Worker], messages: queue.Queue[tuple[int, str, Any]], kind: str,
             timeout_s: float) -> dict[int, Any]:
    deadline = time.monotonic() + timeout_s
    got: dict[int, Any] = {}
    while len(got) < len(workers):
        try:
            index, what, payload = messages.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise BenchFailed(f"{len(workers) - len(got)} worker(s) sent no {kind} within {timeout_s:.0f} s") from None
        if what == kind:
            got[index] = payload
        elif what == "EXIT" and index not in got:
            worker = workers[index]
            raise BenchFailed(f"worker {index} exited (code {worker.proc.wait()}) before {kind}:\n"
                              f"{worker.stderr_tail()}")
    return got


def _worker_env(index: int, spec: dict[str, Any], asks: ReplicaAsks, lnc: int | None) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    env.update(asks.pin(index))
    if lnc is not None:
        env[LNC_ENV] = str(lnc)
    if asks.host_cores:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    env[WORKER_SPEC_ENV] = json.dumps({**spec, "index": index})
    return env


def run_multicore(settings: ModelSettings | dict[str, Any], cores: int, bucket: int, warmup: int = 10,
                  iterations: int = 50, ready_timeout_s: float = READY_TIMEOUT_S) -> MulticoreResult:
    """Run `cores` pinned workers in parallel on one bucket; per-worker and instance figures.

    Each worker holds one device, pinned as the placement plan says (serve/plan/placement.py); where the model
    runs on the host's cores, one torch thread. `settings` may be a plain mapping of ModelSettings fields
    (e.g. parsed from YAML)."""
    from siglip_serve.models.backends.implementation import backend_replica_env, compiled_for
    from siglip_serve.serve.plan.placement import replica_asks

    if cores < 1 or iterations < 1 or warmup < 0:
        raise SettingsError("cores and iterations must be >= 1, warmup >= 0")
    if not isinstance(settings, ModelSettings):
        settings = validate_settings(dict(settings))
    asks = replica_asks(settings)
    overrides: dict[str, Any] = {"buckets": (bucket,), **({"torch_threads": 1} if asks.host_cores else {})}
    plain = model_settings_of(settings).model_copy(update=overrides)
    compiled = compiled_for(plain)  # what a compiled artifact was built for: its LNC, the seed's auto-cast
    lnc, auto_cast = compiled.get("lnc"), compiled.get("auto_cast")
    spec = {"settings": plain.model_dump(mode="json"), "bucket": bucket, "warmup": warmup, "iterations": iterations}
    messages: queue.Queue[tuple[int, str, Any]] = queue.Queue()
    log.info("starting %d %s workers (bucket %d, warm-up %d, iterations %d)", cores, plain.backend, bucket,
             warmup, iterations)
    # neuron-native: the artifact's recipe, in each worker's environment before it imports torch.
    backend_env = backend_replica_env(plain)
    workers = [_Worker(i, {**_worker_env(i, spec, asks, lnc), **backend_env}, messages) for i in range(cores)]
    try:
        _collect(workers, messages, "READY", ready_timeout_s)
        log.info("all %d workers ready; measuring", cores)
        for worker in workers:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write("GO\n")
            worker.proc.stdin.close()
        results = _collect(workers, messages, "RESULT", ready_timeout_s)
        for worker in workers:
            worker.proc.wait(timeout=60)
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
    per_worker = [MulticoreWorker.model_validate(results[i]) for i in range(cores)]
    images = sum(w.images for w in per_worker)
    span = max(w.end for w in per_worker) - min(w.start for w in per_worker)
    return MulticoreResult(
        backend=plain.backend, model=plain.model, lnc=lnc, auto_cast=auto_cast, bucket=bucket, cores=cores,
        warmup=warmup, iterations=iterations, workers=per_worker,
        per_core_images_per_second=float(np.mean([w.images_per_second for w in per_worker])),
        latency_mean_ms=float(np.mean([w.latency_mean_ms for w in per_worker])),
        instance_images_per_second=float(sum(w.images_per_second for w in per_worker)),
        wall_images_per_second=images / span if span > 0 else float("nan"),
        method="each worker times `iterations` Encoder.encode calls on one uint8 batch after warm-up; "
               "instance = sum of workers' img/s (seed 000); wall = all images / (last end - first start)",
        machine=Machine(host=socket.gethostname(), platform=platform.platform(), cpus=os.cpu_count()),
        seed_reference=list(SEED_REFERENCE),
    )


def format_comparison(result: MulticoreResult) -> str:
    """Our run as a row beside the seed's rows it is comparable with."""
    header = f"{'':40} {'cores':>5} {'batch':>5} {'per-core img/s':>14} {'latency ms':>10} {'instance img/s':>14}"
    lines = [header, "-" * len(header)]
    for row in seed_rows_for(result.lnc, result.cores):
        instance = row.instance_images_per_second
        shown = f"{instance:.1f}" if instance is not None else "-"
        lines.append(f"{row.label:40} {row.cores:>5} {row.batch:>5} {row.per_core_images_per_second:>14.2f} "
                     f"{row.latency_mean_ms:>10.2f} {shown:>14}")
    lnc = f" LNC={result.lnc}" if result.lnc else ""
    label = f"ours: {result.backend}{lnc} {result.model}"[:40]
    lines.append(f"{label:40} {result.cores:>5} {result.bucket:>5} {result.per_core_images_per_second:>14.2f} "
                 f"{result.latency_mean_ms:>10.2f} {result.instance_images_per_second:>14.1f}")
    if not measured_like_the_seed(result.backend):
        lines.append(f"(ours ran on the {result.backend} backend on {result.machine.host}: a different "
                     "machine and possibly model than the seed's trn2.3xlarge SO400M; not comparable)")
    lines.append("latency = one encode call of the batch (batch 1: per image); seed instance = "
                 f"{SEED_INSTANCE_METHOD}; ours = all workers measured at once, summed")
    return "\n".join(lines)


def format_workers(result: MulticoreResult) -> str:
    lines = [f"{'core':>6} {'pid':>8} {'img/s':>9} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9}"]
    for w in result.workers:
        lines.append(f"{str(w.core):>6} {w.pid:>8} {w.images_per_second:>9.2f} {w.latency_mean_ms:>9.2f} "
                     f"{w.latency_p50_ms:>9.2f} {w.latency_p99_ms:>9.2f}")
    lines.append(f"instance (sum) {result.instance_images_per_second:.1f} img/s; "
                 f"wall-clock {result.wall_images_per_second:.1f} img/s")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m siglip_serve.measure.multicore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, backend=True)
    parser.add_argument("--cores", type=int, default=1,
                        help="workers, one per logical core (trn2.3xlarge: 4 at LNC=2, 8 at LNC=1)")
    parser.add_argument("--bucket", type=int, default=1, help="batch size each worker runs (seed 000: 1)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", dest="json_out", type=Path, default=Path("multicore.json"))
    add_log_level(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.worker:
        return _worker()
    return run_main(lambda: _bench(args), log)


def _bench(args: argparse.Namespace) -> int:
    result = run_multicore(settings_from_args(args), args.cores, args.bucket, args.warmup, args.iterations)
    print(format_workers(result))
    print()
    print(format_comparison(result))
    result.write(args.json_out)
    log.info("wrote %s", args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
