"""How a service splits the host's cores: encoder replicas on cpu, and ingress replicas everywhere.

Measured on a 2-core VM (docs/dev/benchmark-log.md; A/B in one sitting): for small models one torch thread
per replica, a replica per core, serves more images per second at fewer CPU-ms per image than one
replica with a thread per core (ViT-B-16: 3.7-3.9 vs 2.9-3.0 img/s; tiny-siglip: 105-138 vs 78-128):
intra-op threads at these sizes wait on each other. SO400M went the other way (0.14 vs 0.16 img/s, and
a one-thread replica's batch of 4 takes ~45 s, past the 30 s request timeout), so a large image tower
keeps one replica with every core, as before.
"""

from __future__ import annotations

import logging
import math

import psutil

from siglip_serve.core.backends import backend_record
from siglip_serve.core.host import usable_cpus
from siglip_serve.models import parameter_cache
from siglip_serve.models.parameter_cache import ParameterCounts
from siglip_serve.models.source import ModelSource
from siglip_serve.serve.plan.config import ServiceConfig

log = logging.getLogger("siglip_serve")

# Between the largest measured winner of the split (ViT-B-16's image tower, 93 M parameters) and the
# smallest measured loser (SO400M's, 428 M); unmeasured sizes between stay on the old default.
SPLIT_MAX_IMAGE_PARAMETERS = 150_000_000
# A replica's own process (torch, Ray's worker) before it loads any weights: ~0.4 GiB RSS measured.
REPLICA_BASE_BYTES = 512 * 1024 * 1024
# What of the memory available at start the loading replicas may take together.
MEMORY_SHARE = 0.8


def parameter_counts(source: ModelSource) -> ParameterCounts:
    """The model's parameter counts: kept from an earlier count (models/parameter_cache.py), else counted
    (models/model_towers.py, which imports torch and open_clip: only where `auto` on cpu needs them) and kept."""
    found = parameter_cache.cached(source.name)
    if found is not None:
        return found
    from siglip_serve.models.model_towers import parameter_counts as counted

    counts = counted(source)
    parameter_cache.keep(source.name, counts)
    return counts


def replica_load_bytes(total_parameters: int) -> int:
    """Peak bytes of one replica while it loads: the float32 model (both towers) and the checkpoint or
    pretrained state dict it is filled from, side by side, plus the process itself."""
    return 2 * 4 * total_parameters + REPLICA_BASE_BYTES


def auto_cpu_replicas(config: ServiceConfig, text_replicas: int, cluster_cpus: float | None = None) -> int:
    """`replicas: auto` on cpu: one replica per `torch_threads` cores this process may use (default
    threads: 1 for an image tower up to SPLIT_MAX_IMAGE_PARAMETERS, else every core), capped by what
    fits in MEMORY_SHARE of the available memory while all of them load at once (Serve starts them
    together) and, given a running cluster's `cluster_cpus`, by the encoders that fit beside the
    ingress and the model's `text_replicas` (the planner's count; Ray's CPUs are logical; `siglip-serve run`
    decides first and starts its Ray with enough). It counts this machine: on a multi-node CPU cluster name the
    count."""
    counts = parameter_counts(config.source)
    cores = usable_cpus()
    threads = config.torch_threads or (1 if counts.image <= SPLIT_MAX_IMAGE_PARAMETERS else cores)
    by_cores = max(1, cores // threads)
    need = replica_load_bytes(counts.total)
    available = psutil.virtual_memory().available
    by_memory = max(1, int(available * MEMORY_SHARE) // need)
    replicas = min(by_cores, by_memory)
    if cluster_cpus is not None and config.encoder_num_cpus > 0:
        others = (ingress_replicas_for(config, 1) * config.ingress_num_cpus
                  + text_replicas * config.text_num_cpus)
        replicas = max(1, min(replicas, int((cluster_cpus - others + 1e-9) // config.encoder_num_cpus)))
    log.info("replicas: auto on cpu -> %d: %d usable core(s) / %d torch thread(s) each (image tower %.0f M "
             "parameters); memory holds %d loading at ~%.1f GiB each (%.1f GiB available); Ray's CPUs: %s",
             replicas, cores, threads, counts.image / 1e6, by_memory, need / 2**30, available / 2**30,
             "not counted" if cluster_cpus is None else f"{cluster_cpus:g}")
    return replicas


def image_torch_threads(config: ServiceConfig, replicas: int) -> int | None:
    """Torch threads of each CPU encoder replica: as configured, else this machine's usable cores split
    across the replicas (two replicas on two cores: one each, not two each fighting over both).
    None for one replica: it takes every core of the machine it runs on (models/backends/cpu.py)."""
    if not backend_record(config.backend).host_cores or config.torch_threads is not None or replicas <= 1:
        return config.torch_threads
    return max(1, usable_cpus() // replicas)


def text_torch_threads(config: ServiceConfig) -> int | None:
    """Torch threads of each CPU text replica: as configured, else its Ray CPUs rounded up (one by
    default). Not every core: the image encoders are planned to take those, and a text replica that
    also took them all would fight them (torch's default, and what it did before this plan)."""
    if not backend_record(config.backend).host_cores or config.torch_threads is not None:
        return config.torch_threads
    return max(1, math.ceil(config.text_num_cpus))


# One ingress process saturates at about two cores: its event loop holds the GIL for HTTP, JSON and
# Ray's calls while `decode_threads` decode beside it. Measured on the H100 host (16 cores, README):
# one ingress served 118 img/s of ViT-B-16 at 16.3 ingress CPU-ms per image, 1.9 cores, as the limit.
INGRESS_CORES = 2
# HAProxy, Ray's GCS, raylet and dashboard agent, and Serve's controller.
RESERVED_CORES = 2


def image_host_cores(config: ServiceConfig, replicas: int) -> int:
    """Host cores the encoder replicas keep busy: their torch threads on cpu, one each elsewhere (the
    Python that feeds a GPU or NeuronCore)."""
    if not backend_record(config.backend).host_cores:
        return replicas
    return replicas * (image_torch_threads(config, replicas) or usable_cpus())


def ingress_replicas_for(config: ServiceConfig, image_replicas: int) -> int:
    """`ingress_replicas` as a count: as given, or for 'auto' one per INGRESS_CORES of this host's
    usable cores left by the encoders and RESERVED_CORES, at least one. On a CPU host the encoders
    take the cores, so auto stays at 1; on an accelerator host it grows with the host (16 cores, one
    GPU: 6; trn2.3xlarge at LNC=2, 12 vCPUs, 4 encoders: 3). It counts the machine that builds the
    application: on a multi-node cluster name the count. With ingress_autoscaling: its floor."""
    if config.ingress_autoscaling is not None:
        return config.ingress_autoscaling.min_replicas
    if config.ingress_replicas != "auto":
        return config.ingress_replicas
    spare = usable_cpus() - image_host_cores(config, image_replicas) - RESERVED_CORES
    return max(1, spare // INGRESS_CORES)
