"""A bulk embedding job: list, shard, skip what is done, stream the rest through Ray Data, write shards.

    inputs ──► shards (bulk/inputs.py) ──► Ray Data: read+decode tasks ──► embed actors ──► this driver
                                                     (CPU, sized apart)     (one per device)   puts each shard
                                                                                               back in order and
                                                                                               writes it whole

The stages are the service's own code (models/preprocess.py, the backends' encoders, the same
limits from ServiceConfig), so a row here equals what `/v1/embeddings` answers for the same file.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from siglip_serve.bulk.identity import Modality, preprocessing_id, weights_id
from siglip_serve.bulk.inputs import ERRORS_FOLDER, OutputFolder, Shard, list_items, plan_shards
from siglip_serve.bulk.repeats import DEFAULT_MIB, start_record
from siglip_serve.core.backends import backend_record
from siglip_serve.core.errors import UserError
from siglip_serve.measure.load_results import BulkResult, SteadyState
from siglip_serve.measure.results import Machine
from siglip_serve.models.naflex import served_layout
from siglip_serve.serve.http.embedding_output import encode_rows
from siglip_serve.serve.plan import placement
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.planner import image_limits

log = logging.getLogger("siglip_serve.bulk")

# Rows per Ray Data block of the input list: small enough that the first decodes start at once and
# every decode task stays busy, large enough that a block's overhead is nothing beside its decodes.
ROWS_PER_BLOCK = 64
PROGRESS_EVERY_S = 5.0
# Loading a compiled SO400M on a NeuronCore can take minutes; a node added by an autoscaler more.
ACTOR_START_TIMEOUT_S = 1200
SUMMARY_FILE = "_summary.json"


@dataclass(frozen=True)
class JobSpec:
    source: str
    output: str
    modality: Modality = "image"
    column: str = "path"
    shard_size: int = 1000
    encoders: int | None = None  # None: one per device (cpu: one)
    decode_workers: int | None = None  # None: the cores the encoders leave, at least one
    address: str | None = None  # join this Ray cluster instead of starting a local one
    metrics_port: int | None = None  # the local Ray's Prometheus endpoint (the service's metric names)
    encoding: str = "float"  # float32, or the API's int8 / uint8 / binary / ubinary (serve/http/embedding_output.py)
    repeat_cache_mib: float = DEFAULT_MIB  # images: the run's record of embedded files (bulk/repeats.py); 0: off
    served_as: str | None = None  # the service's name of the model (metrics' `model` label); None: its model


class PlanError(UserError, ValueError):
    """The cluster holds no device for the chosen backend."""


@dataclass
class Plan:
    """How many of each worker a job runs and what each encoder asks Ray for."""

    encoders: int
    decode_workers: int
    encoder_options: dict[str, Any]


def plan_workers(config: ServiceConfig, spec: JobSpec, cluster: Mapping[str, float]) -> Plan:
    """One encoder per device the Ray cluster declares (the backend's resource, serve/plan/placement.py: GPUs;
    logical NeuronCores, which Ray pins each actor to through NEURON_RT_VISIBLE_CORES), one where the
    model runs on the host's cores; each asks what a served image replica asks. The decoders take the
    CPUs left."""
    asks = placement.replica_asks(config)
    device = asks.device_resource
    encoders = spec.encoders or (asks.image_replicas_on(cluster.get(device, 0)) if device else 1)
    if encoders < 1:
        raise PlanError(f"the Ray cluster declares no {device} for backend {config.backend}; start Ray with them "
                        f"({placement.declare_hint(device or '')}) or name --encoders")
    decode = spec.decode_workers or max(1, int(cluster.get("CPU", 1)) - encoders)
    return Plan(encoders, decode, asks.image.actor_options())


def local_cpus(config: ServiceConfig, spec: JobSpec, cores: int) -> int:
    """Logical CPUs a local Ray declares: a decoder per core, and where the model runs on the host's
    cores one more for each encoder.

    There the encoder's torch threads share the cores with the decoders on purpose: measured here
    (tiny-siglip, 2 cores, 4,000 640x480 JPEGs, steady part) 1 decoder beside a 1-thread encoder gave
    229 img/s at 5.3 CPU-ms per image, 2 decoders beside a 2-thread encoder 537 at 3.3; a large model
    keeps every core busy with its own threads and the decoders take little."""
    encoders = spec.encoders or 1
    extra = encoders if backend_record(config.backend).host_cores else 0
    return max(cores + extra, (spec.decode_workers or 0) + encoders)


@dataclass
class ShardAssembler:
    """Rows come back in any order; a shard is written once all of its rows are in."""

    output: OutputFolder
    shards: dict[int, Shard]
    columns: dict[str, str]  # model, backend, weights, preprocessing: the same in every row
    encoding: str = "float"
    embed_dim: int = 0
    embedded: int = 0
    errors: int = 0
    written: int = 0
    repeats: int = 0  # rows answered from the run's record of embedded files, never decoded
    _rows: dict[int, dict[int, tuple[np.ndarray | None, str, str]]] = field(default_factory=dict)

    def add(self, batch: dict[str, np.ndarray]) -> int:
        if "cached" in batch:
            self.repeats += int(np.sum(batch["cached"]))
        for i in range(len(batch["shard"])):
            shard, pos = int(batch["shard"][i]), int(batch["pos"][i])
            error = str(batch["error_type"][i])
            row = (None if error else batch["embedding"][i], error, str(batch["message"][i]))
            self._rows.setdefault(shard, {})[pos] = row
            self.embed_dim = self.embed_dim or int(batch["embedding"].shape[1])
            if len(self._rows[shard]) == len(self.shards[shard].items):
                self._write(self.shards[shard], self._rows.pop(shard))
        return len(batch["shard"])

    def _write(self, shard: Shard, rows: dict[int, tuple[np.ndarray | None, str, str]]) -> None:
        ok = [pos for pos in range(len(shard.items)) if rows[pos][0] is not None]
        failed = [pos for pos in range(len(shard.items)) if rows[pos][0] is None]
        if failed:  # before the shard's own file: a file under the final name means all of it is done
            self.output.write(pa.table({
                "path": [shard.items[p] for p in failed],
                "error_type": [rows[p][1] for p in failed],
                "message": [rows[p][2] for p in failed],
            }), shard.name, folder=ERRORS_FOLDER)
        found = [rows[p][0] for p in ok]
        vectors = np.stack([v for v in found if v is not None]) if ok else np.zeros((0, self.embed_dim), np.float32)
        table = pa.table({
            "path": pa.array([shard.items[p] for p in ok], type=pa.string()),
            **embedding_columns(vectors, self.encoding),
            **{name: pa.array([value] * len(ok), type=pa.string()) for name, value in self.columns.items()},
        })
        self.output.write(table, shard.name)
        self.embedded += len(ok)
        self.errors += len(failed)
        self.written += 1


# Parquet types of the API's encodings (docs/http-api.md); base64 is a JSON device, not a column type.
ENCODING_TYPES = {"float": pa.float32(), "int8": pa.int8(), "uint8": pa.uint8(), "binary": pa.int8(),
                  "ubinary": pa.uint8()}


def embedding_columns(vectors: np.ndarray, encoding: str) -> dict[str, pa.Array]:
    """`embedding` as a fixed-size list in the encoding's type, and int8/uint8's per-row `scale`."""
    kind = ENCODING_TYPES[encoding]
    rows: np.ndarray
    if encoding == "float":
        rows, scales = vectors.astype(np.float32, copy=False), None
    else:
        encoded, scales = encode_rows(vectors, encoding)
        if encoded:
            rows = np.stack(encoded)
        else:  # a shard of refused items only: the encoded width still (binary: a bit per dimension)
            rows = np.zeros((0, len(encode_rows(np.ones((1, vectors.shape[1]), np.float32), encoding)[0][0])))
    flat = pa.array(rows.astype(kind.to_pandas_dtype(), copy=False).reshape(-1), type=kind)
    columns: dict[str, pa.Array] = {"embedding": pa.FixedSizeListArray.from_arrays(flat, rows.shape[1])}
    if scales is not None:
        columns["scale"] = pa.array(scales, type=pa.float32())
    return columns


def _input_dataset(ray_data: Any, pending: list[Shard]) -> Any:
    rows = [(shard.index, pos, item) for shard in pending for pos, item in enumerate(shard.items)]
    table = pa.table({"shard": [r[0] for r in rows], "pos": [r[1] for r in rows], "item": [r[2] for r in rows]})
    return ray_data.from_arrow([table.slice(start, ROWS_PER_BLOCK) for start in range(0, len(rows), ROWS_PER_BLOCK)])


def _pipeline(config: ServiceConfig, spec: JobSpec, plan: Plan, pending: list[Shard], weights: str) -> Any:
    import ray.data

    from siglip_serve.bulk.stages import ImageEmbedActor, TextEmbedActor, check_texts, decode_batch
    from siglip_serve.core.backends import extra_backends_env
    from siglip_serve.models.loading import image_geometry

    settings = config.model_settings()
    model = spec.served_as or config.model
    # Nothing is decoded until every encoder has loaded: a model that cannot load fails the job before
    # any work, and decoders do not race ahead of encoders that are still warming up (Ray Data's
    # ActorPoolMapOperator.start blocks on wait_for_min_actors_s; a cluster that cannot place them in
    # that time ends the job with Ray's "Timed out while starting actors").
    ray.data.DataContext.get_current().wait_for_min_actors_s = ACTOR_START_TIMEOUT_S
    ds = _input_dataset(ray.data, pending)
    if spec.modality == "image":
        geometry = image_geometry(config.source)
        size, embed_dim = geometry.size, geometry.embed_dim
        naflex = served_layout(geometry.naflex, settings.patch_budgets, config.model)
        row_bytes = int(np.prod(naflex.array_shape(naflex.default_budget))) if naflex else 3 * size[0] * size[1]
        record = start_record(spec.repeat_cache_mib)
        # A decode task reserves its peak: the largest image the limits let through, decoded, plus the
        # block's output. That also keeps it a stage of its own: Ray Data fuses a map into the next one
        # when their remote args are equal (ray/data/_internal/logical/rules/operator_fusion.py,
        # are_remote_args_compatible), which would decode inside the encoder actors, one image at a time.
        peak = config.max_image_pixels * 8 + ROWS_PER_BLOCK * row_bytes
        ds = ds.map_batches(decode_batch, batch_format="numpy", batch_size=ROWS_PER_BLOCK, num_cpus=1, memory=peak,
                            compute=ray.data.TaskPoolStrategy(size=plan.decode_workers),
                            fn_kwargs={"size": size, "limits": image_limits(config),
                                       "fast_jpeg": config.fast_jpeg_decode, "urls": config.url_fetch,
                                       "resample": geometry.resample, "naflex": naflex,
                                       "record": record, "embed_dim": embed_dim, "model": model})
        actor: type[ImageEmbedActor | TextEmbedActor] = ImageEmbedActor
        buckets = settings.buckets
        constructor: dict[str, Any] = {"settings": settings, "model": model, "record": record,
                                       "keep_env": list(config.env_vars), "weights": weights}
    else:
        ds = ds.map_batches(check_texts, batch_format="numpy",
                            fn_kwargs={"max_chars": config.max_text_chars, "model": model})
        actor, buckets = TextEmbedActor, settings.text_buckets
        constructor = {"settings": settings, "model": model, "keep_env": list(config.env_vars), "weights": weights}
    # Nothing from the model's files: with --address this driver runs on the head. Each actor sets its
    # backend's environment itself, on its node, before it imports torch (serve/towers/replica_start.py).
    env = {**extra_backends_env(), **config.env_vars}
    options = {**plan.encoder_options, **({"runtime_env": {"env_vars": env}} if env else {})}
    # A call carries whole blocks (the encoder splits them into its buckets): a Ray Data task costs
    # about a millisecond of CPU on each side, so one per bucket of 8 would cost more than tiny's model.
    per_call = max(buckets) * max(1, ROWS_PER_BLOCK // max(buckets))
    return ds.map_batches(actor, batch_format="numpy", batch_size=per_call,
                          compute=ray.data.ActorPoolStrategy(size=plan.encoders),
                          fn_constructor_kwargs=constructor, **options)


def _start_ray(spec: JobSpec, cpus: int) -> bool:
    import ray

    if ray.is_initialized():
        return False
    if spec.address:
        ray.init(address=spec.address, log_to_driver=False)
    else:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=cpus, log_to_driver=False,
                 namespace="siglip-bulk", _metrics_export_port=spec.metrics_port)
        if spec.metrics_port:
            log.info("metrics (Prometheus): http://127.0.0.1:%d/metrics", spec.metrics_port)
    return True


def tree_cpu_seconds(pid: int) -> float:
    """CPU a process tree has used: every live process's own time plus what its exited children used
    (Ray Data's workers and actors may be gone before the job's end; their parent reaped them)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def run_job(config: ServiceConfig, spec: JobSpec) -> BulkResult:
    began = time.monotonic()
    items = list_items(spec.source, spec.column)
    if spec.encoding not in ENCODING_TYPES:
        raise PlanError(f"encoding {spec.encoding!r}: one of {', '.join(ENCODING_TYPES)}")
    # The config's weights; an encoder built from a compiled artifact refuses to start unless the artifact
    # holds exactly these (bulk/stages.py check_artifact_weights).
    weights = weights_id(config)
    parts = (spec.modality, config.model, weights, preprocessing_id(config, spec.modality))
    # Another encoding is another output: its shards are named apart (float keeps the names it had).
    fingerprint = "|".join(parts if spec.encoding == "float" else (*parts, spec.encoding))
    shards = plan_shards(items, spec.shard_size, fingerprint)
    output = OutputFolder(spec.output)
    finished, errors_before = output.start({"source": spec.source, "fingerprint": fingerprint, "shards": len(shards),
                                            "started_at": datetime.now(UTC).isoformat()}, (s.name for s in shards))
    pending = [shard for shard in shards if shard.name not in finished]
    done_before = len(shards) - len(pending)
    log.info("%d %s(s) in %d shard(s) of up to %d; %d shard(s) already done in %s, %d to run",
             len(items), spec.modality, len(shards), spec.shard_size, done_before, spec.output, len(pending))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    plan = Plan(0, 0, {})
    columns = {"model": config.model, "backend": config.backend, "weights": weights,
               "preprocessing": preprocessing_id(config, spec.modality), "encoding": spec.encoding}
    assembler = ShardAssembler(output, {shard.index: shard for shard in pending}, columns, spec.encoding)
    cpu_before, timed_from = tree_cpu_seconds(os.getpid()), time.monotonic()
    cpu_after = cpu_before
    steady = None
    if pending:
        started = _start_ray(spec, local_cpus(config, spec, cores))
        try:
            import ray

            plan = plan_workers(config, spec, ray.cluster_resources())
            log.info("%d encoder actor(s) (%s), %d decode worker(s)", plan.encoders, plan.encoder_options,
                     plan.decode_workers)
            stream = _stream(_pipeline(config, spec, plan, pending, weights), assembler,
                             sum(len(s.items) for s in pending))
            cpu_after = tree_cpu_seconds(os.getpid())  # before Ray stops: its processes are counted alive
            steady = stream.steady()
        finally:
            if started:
                import ray

                ray.shutdown()
    seconds = time.monotonic() - timed_from
    if assembler.repeats:
        log.info("%d file(s) repeated one this run had embedded: answered from its record, not decoded or "
                 "embedded again", assembler.repeats)
    done = assembler.embedded + assembler.errors
    result = BulkResult(
        machine=Machine(host=os.uname().nodename, cpus=os.cpu_count()), created_at=datetime.now(UTC).isoformat(),
        source=spec.source, output=spec.output, modality=spec.modality, model=config.model, backend=config.backend,
        weights=columns["weights"], preprocessing=columns["preprocessing"], items=len(items), shards=len(shards),
        shards_done_before=done_before, shards_written=assembler.written, embedded=assembler.embedded,
        errors=assembler.errors, errors_in_output=errors_before + assembler.errors,
        encoders=plan.encoders, decode_workers=plan.decode_workers, seconds=seconds,
        items_per_second=done / seconds if done and seconds > 0 else None,
        cpu_ms_per_item=(cpu_after - cpu_before) * 1e3 / done if done else None,
        wall_seconds=time.monotonic() - began, steady=steady)
    output.write_text(SUMMARY_FILE, result.model_dump_json(indent=2) + "\n")
    return result


# The steady state is timed between these fractions of the run's items: by the first, the encoders are
# warm and the decoders' head start (they run while the actors load) is used up; the last leaves out the
# tail, where the pipeline drains and workers go idle.
STEADY_FROM, STEADY_TO = 0.2, 0.9


@dataclass
class Stream:
    """Items done, time and CPU at the start and end of the steady window."""

    marks: list[tuple[int, float, float]] = field(default_factory=list)

    def steady(self) -> SteadyState | None:
        if len(self.marks) < 2:
            return None
        (items0, t0, cpu0), (items1, t1, cpu1) = self.marks[0], self.marks[-1]
        if items1 <= items0 or t1 <= t0:
            return None
        return SteadyState(items=items1 - items0, seconds=t1 - t0, items_per_second=(items1 - items0) / (t1 - t0),
                           cpu_ms_per_item=(cpu1 - cpu0) * 1e3 / (items1 - items0))


def _stream(ds: Any, assembler: ShardAssembler, total: int) -> Stream:
    began = last = time.monotonic()
    done = 0
    stream = Stream()
    # No prefetch: with Ray Data's default (one batch ahead, ray/data/iterator.py) a finished batch is handed
    # over only once the next one is ready too, so a row that stalls (a slow URL) would hold back the shards
    # of a batch already embedded: unwritten, they would be lost to a crash and absent from the progress.
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None, prefetch_batches=0):
        done += assembler.add(batch)
        now = time.monotonic()
        if len(stream.marks) < 2 and done >= total * (STEADY_TO if stream.marks else STEADY_FROM):
            stream.marks.append((done, now, tree_cpu_seconds(os.getpid())))
        if now - last >= PROGRESS_EVERY_S or done == total:
            rate = done / max(now - began, 1e-9)
            eta = (total - done) / rate if rate > 0 else float("inf")
            log.info("%d/%d items (%.0f%%), %.1f items/s, %d shard(s) written, %d error(s), ETA %.0f s",
                     done, total, 100 * done / max(total, 1), rate, assembler.written, assembler.errors, eta)
            last = now
    return stream


def summary_path(output: str) -> Path:
    return Path(output) / SUMMARY_FILE
