"""Every Prometheus collector of the service, in base units. Ray adds the `ray_` prefix on export.

Collectors are built inside the replica that owns them (ray.serve.metrics needs a running Ray),
and Ray Serve adds `application`, `deployment` and `replica` tags to each series by itself. Ray
also attaches its own global labels (`Component`, `NodeAddress`, `SessionName`, `Version`,
`WorkerId`) to everything it exports, so queries always aggregate with `sum by (...)`. What one served
model did carries its `model` label: the name requests' `model` uses (serve/plan/served_models.py).

The names below are a contract (docs/observability.md, deploy/grafana/siglip-serve.json).

Histogram boundaries come from latencies this service really has (docs/observability.md has the
measurements): tiny-siglip forwards in 1-3 ms on one CPU thread, ViT-B-16-SigLIP in 0.3 s (batch
1) to 2.6 s (batch 8) on one CPU thread, SO400M-384 in ~28 ms per image at batch 1 on one LNC=2
NeuronCore (~70 ms at LNC=1) and in seconds per image on a CPU. Boundaries are dense where the
Neuron path lives (20-300 ms) so p50/p95/p99 there are read to within a few ms.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ray.serve import metrics

from siglip_serve.core.constants import VISIBLE_CORES_ENV
from siglip_serve.serve.http.errors import ErrorType

# Exported names (without Ray's `ray_` prefix). Counters already end in `_total`; Ray's
# OpenTelemetry exporter does not add a second one.
IMAGES_EMBEDDED = "siglip_images_embedded_total"
REQUESTS_REJECTED = "siglip_requests_rejected_total"
PREPROCESS_SECONDS = "siglip_preprocess_seconds"
REQUEST_SECONDS = "siglip_request_seconds"
# The same requests by lane and tenant (core/lanes.py): the tenant's name, never its key.
TENANT_REQUEST_SECONDS = "siglip_tenant_request_seconds"
FORWARD_SECONDS = "siglip_encoder_forward_seconds"
BATCH_FILL_RATIO = "siglip_batch_fill_ratio"
ENCODER_IMAGES = "siglip_encoder_images_total"
TEXTS_EMBEDDED = "siglip_texts_embedded_total"
BATCH_QUEUE_SECONDS = "siglip_batch_queue_seconds"
BATCH_QUEUED_INPUTS = "siglip_batch_queued_inputs"
# The embedding cache's (serve/ingress/embedding_cache.py), per ingress replica (and bulk's repeats skipped, as
# hits); every ingress exports them, at zero while the cache is off.
CACHE_HITS = "siglip_embedding_cache_hits_total"
CACHE_MISSES = "siglip_embedding_cache_misses_total"
CACHE_EVICTIONS = "siglip_embedding_cache_evictions_total"
CACHE_BYTES = "siglip_embedding_cache_bytes"
CACHE_METRIC_NAMES = (CACHE_HITS, CACHE_MISSES, CACHE_EVICTIONS, CACHE_BYTES)
METRIC_NAMES = (
    IMAGES_EMBEDDED, REQUESTS_REJECTED, PREPROCESS_SECONDS, REQUEST_SECONDS, TENANT_REQUEST_SECONDS,
    FORWARD_SECONDS, BATCH_FILL_RATIO, ENCODER_IMAGES, TEXTS_EMBEDDED,
    BATCH_QUEUE_SECONDS, BATCH_QUEUED_INPUTS, *CACHE_METRIC_NAMES,
)

# Decode + validate + resize of one image on one thread: ~3-7 ms for a 512x512 JPEG, ~20 ms for
# 1920x1080, 0.1-0.4 s for a 12 MP photo.
PREPROCESS_BUCKETS_S = [
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25,
    0.5, 1.0, 2.0,
]
# One forward pass of one bucket; see the module docstring for where each range comes from.
FORWARD_BUCKETS_S = [
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06,
    0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0,
    30.0, 60.0,
]
# A whole request in the ingress: forward pass plus preprocessing, batch wait (5 ms by default)
# and queueing, up to the 30 s default deadline and a little past it.
REQUEST_BUCKETS_S = [
    0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3,
    0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0,
]
# Real images / bucket size. With power-of-two buckets the fill of a padded batch is k/8, k/16...;
# `le` is inclusive, so each eighth lands exactly on its boundary.
FILL_BUCKETS = [0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]


# The `tower` label of siglip_encoder_forward_seconds, siglip_batch_fill_ratio and the batch queue's two.
TOWERS = ("image", "text")


def start_at_zero(counter: metrics.Counter, tags: dict[str, str] | None = None) -> None:
    """Export a counter series at 0 before its first event.

    Prometheus's rate() and increase() cannot see the increments a series is born with, so a
    rejection reason that first happens once would never show on the dashboard. Counter.inc
    refuses 0; `_record` is the method inc records through, and a zero delta only creates the series.
    """
    counter._record(0.0, tags=tags)


def replica_core_label() -> str:
    """The logical NeuronCore(s) this process was given, or 'none' off Neuron."""
    return os.environ.get(VISIBLE_CORES_ENV) or "none"


def _images_embedded() -> metrics.Counter:
    return metrics.Counter(IMAGES_EMBEDDED, tag_keys=("endpoint", "model"),  # type: ignore[arg-type]
                           description="Images answered with an embedding (counted once the response is built; "
                                       "endpoint bulk: written by `siglip-serve embed`).")


def _texts_embedded() -> metrics.Counter:
    return metrics.Counter(TEXTS_EMBEDDED, tag_keys=("endpoint", "model"),  # type: ignore[arg-type]
                           description="Texts answered with an embedding, or classify labels scored (counted per "
                                       "request; endpoint bulk: written by `siglip-serve embed`).")


def _rejected() -> metrics.Counter:
    # No `model`: many refusals come before a request's model is known (auth, the body, an unknown name);
    # a model's own errors are in siglip_request_seconds by `status`.
    return metrics.Counter(REQUESTS_REJECTED, tag_keys=("reason",),
                           description="Requests answered with an error (or bulk items refused), by the contract's "
                                       "error type (reason).")


def _preprocess_seconds() -> metrics.Histogram:
    return metrics.Histogram(PREPROCESS_SECONDS, boundaries=PREPROCESS_BUCKETS_S,
                             tag_keys=("model",),
                             description="Decode, validate and resize of one accepted image (ingress or bulk decode).")


class IngressMetrics:
    """`endpoints`: the `endpoint` label values of siglip_images_embedded_total and siglip_request_seconds, from
    the route table (serve/ingress/http_app.py `endpoint_labels`); `text_endpoints`: those of
    siglip_texts_embedded_total (text inputs and classify labels); `models`: the served models' names (their `model`
    label). Each series is exported from zero. A request of texts only is observed in siglip_request_seconds as
    endpoint "text" (serve/ingress/schedule.py)."""

    def __init__(self, endpoints: Sequence[str] = (), text_endpoints: Sequence[str] = (),
                 models: Sequence[str] = ()) -> None:
        self.images_embedded = _images_embedded()
        self.requests_rejected = _rejected()
        self.preprocess_seconds = _preprocess_seconds()
        self.request_seconds = metrics.Histogram(
            REQUEST_SECONDS,
            description="Embedding request past the body, schema and auth checks: image decoding to response.",
            boundaries=REQUEST_BUCKETS_S,
            tag_keys=("endpoint", "status", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.tenant_request_seconds = metrics.Histogram(
            TENANT_REQUEST_SECONDS,
            description="siglip_request_seconds by the request's lane (interactive, default, bulk) and tenant "
                        "(its API key's name in api_keys_file; default without one).",
            boundaries=REQUEST_BUCKETS_S,
            tag_keys=("lane", "tenant", "status"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.texts_embedded = _texts_embedded()

        for reason in ErrorType:
            start_at_zero(self.requests_rejected, {"reason": reason.value})
        for model in models:
            for endpoint in endpoints:
                start_at_zero(self.images_embedded, {"endpoint": endpoint, "model": model})
            for endpoint in text_endpoints:
                start_at_zero(self.texts_embedded, {"endpoint": endpoint, "model": model})

    def rejected(self, reason: str) -> None:
        self.requests_rejected.inc(1, tags={"reason": reason})

    def of(self, model: str) -> ModelMetrics:
        """What one served model's requests record, under its `model` label."""
        return ModelMetrics(self, model)


class ModelMetrics:
    """One served model's share of the ingress's collectors: each observation tagged with its `model`."""

    def __init__(self, metrics: IngressMetrics, model: str) -> None:
        self.model = model
        self._metrics = metrics

    def embedded(self, endpoint: str, images: int, texts: int) -> None:
        tags = {"endpoint": endpoint, "model": self.model}
        if images:
            self._metrics.images_embedded.inc(images, tags=tags)
        if texts:
            self._metrics.texts_embedded.inc(texts, tags=tags)

    def request(self, seconds: float, endpoint: str, status: str) -> None:
        self._metrics.request_seconds.observe(seconds, tags={"endpoint": endpoint, "status": status,
                                                             "model": self.model})

    def preprocessed(self, seconds: float) -> None:
        self._metrics.preprocess_seconds.observe(seconds, tags={"model": self.model})

    def tenant_request(self, seconds: float, lane: str, tenant: str, status: str) -> None:
        """The request's seconds by its lane and tenant (the tenant's name, never its key)."""
        self._metrics.tenant_request_seconds.observe(seconds, tags={"lane": lane, "tenant": tenant, "status": status})


def _cache_hits() -> metrics.Counter:
    return metrics.Counter(CACHE_HITS, tag_keys=("tower",),
                           description="Items answered from the embedding cache or from the same item's computation "
                                       "already running, by tower (bulk: repeated files skipped).")


class EmbeddingCacheMetrics:
    """The embedding cache's events (serve/ingress/embedding_cache.py CacheEvents) as collectors; every series
    starts at zero, so a rate() sees the first hit."""

    def __init__(self) -> None:
        self.hits_total = _cache_hits()
        self.misses_total = metrics.Counter(CACHE_MISSES, tag_keys=("tower",),
                                            description="Distinct items the embedding cache did not hold and "
                                                        "computed, by tower.")
        self.evictions_total = metrics.Counter(CACHE_EVICTIONS, tag_keys=("tower",),
                                               description="Embeddings dropped from the cache to stay within "
                                                           "embedding_cache_mib, least recently used first.")
        self.bytes = metrics.Gauge(CACHE_BYTES, description="Bytes the embedding cache holds (vectors and their "
                                                            "bookkeeping), per ingress replica.")
        for tower in TOWERS:
            for counter in (self.hits_total, self.misses_total, self.evictions_total):
                start_at_zero(counter, {"tower": tower})
        self.bytes.set(0)

    def hits(self, tower: str, count: int) -> None:
        self.hits_total.inc(count, tags={"tower": tower})

    def misses(self, tower: str, count: int) -> None:
        self.misses_total.inc(count, tags={"tower": tower})

    def evictions(self, tower: str, count: int) -> None:
        self.evictions_total.inc(count, tags={"tower": tower})

    def size(self, total_bytes: int) -> None:
        self.bytes.set(total_bytes)


class BulkMetrics:
    """`siglip-serve embed`'s share of the service's names (docs/batch.md): items embedded and refused and
    each decode, tagged endpoint "bulk" and `model` (the served model's name it embeds as); its tower
    actors' forward passes use TowerMetrics."""

    ENDPOINT = "bulk"

    def __init__(self, model: str) -> None:
        self.model = model
        self.images_embedded = _images_embedded()
        self.texts_embedded = _texts_embedded()
        self.rejected = _rejected()
        self.preprocess_seconds = _preprocess_seconds()
        self.cache_hits = _cache_hits()

    def repeats_skipped(self, count: int) -> None:
        """Files whose bytes this run already embedded: neither decoded nor embedded again."""
        self.cache_hits.inc(count, tags={"tower": "image"})

    def embedded(self, modality: str, count: int) -> None:
        counter = self.texts_embedded if modality == "text" else self.images_embedded
        counter.inc(count, tags={"endpoint": self.ENDPOINT, "model": self.model})

    def decoded(self, seconds: float) -> None:
        self.preprocess_seconds.observe(seconds, tags={"model": self.model})


class TowerMetrics:
    """A replica's forward passes; `tower` is "image" (the Encoder) or "text" (the TextEncoder), `model` the
    served model's name."""

    def __init__(self, model: str, tower: str = "image") -> None:
        core = replica_core_label()
        self.tower = tower
        self.forward_seconds = metrics.Histogram(
            FORWARD_SECONDS,
            description="One forward pass, by tower (image or text); bucket = the batch size run.",
            boundaries=FORWARD_BUCKETS_S,
            tag_keys=("bucket", "neuron_core", "tower", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.batch_fill = metrics.Histogram(
            BATCH_FILL_RATIO,
            description="Real inputs (images or texts) divided by the batch size of each forward pass.",
            boundaries=FILL_BUCKETS,
            tag_keys=("neuron_core", "tower", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.queue_seconds = metrics.Histogram(
            BATCH_QUEUE_SECONDS,
            description="How long a call's inputs waited in the replica's batch queue before their forward pass began.",
            boundaries=REQUEST_BUCKETS_S,
            tag_keys=("neuron_core", "tower", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.queued_inputs = metrics.Gauge(
            BATCH_QUEUED_INPUTS,
            description="Inputs (images or texts) left waiting in the replica's batch queue as a batch starts.",
            tag_keys=("neuron_core", "tower", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        self.images = metrics.Counter(
            ENCODER_IMAGES,
            description="Images run through this replica's model (per-replica throughput).",
            tag_keys=("neuron_core", "model"),  # type: ignore[arg-type]  # Ray: tuple[str]
        )
        own = {"neuron_core": core, "tower": tower, "model": model}
        for collector in (self.forward_seconds, self.batch_fill, self.queue_seconds, self.queued_inputs):
            # A copy each: in a replica, Serve adds its own tags to the mapping it is given, in place
            # (ray/serve/metrics.py, _add_serve_metric_default_tags), and refuses them given back.
            collector.set_default_tags(dict(own))
        self.queued_inputs.set(0)
        self.images.set_default_tags({"neuron_core": core, "model": model})
        if tower == "image":
            start_at_zero(self.images)

    def forward(self, bucket: int, items: int, seconds: float) -> None:
        """The tower's forward hook (models/tower.py `ForwardHook`): called after every forward pass of a
        served batch; warm-up is not one."""
        self.forward_seconds.observe(seconds, tags={"bucket": str(bucket)})
        self.batch_fill.observe(items / bucket)
        if self.tower == "image":
            self.images.inc(items)

    def batch_started(self, waited_seconds: list[float], still_queued: int) -> None:
        """The Batcher's `on_batch`: each call's queue wait, and what is left waiting."""
        for seconds in waited_seconds:
            self.queue_seconds.observe(seconds)
        self.queued_inputs.set(still_queued)
