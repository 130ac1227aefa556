"""Every Prometheus collector of the service, in base units. Ray adds the `ray_` prefix on export.

Collectors are built inside the replica that owns them (ray.serve.metrics needs a running Ray),
and Ray Serve adds `deployment`, `replica` and `application` tags to each series by itself.
"""

from __future__ import annotations

import os

from ray.serve import metrics

# Ingress-side stages are CPU work of a few ms; whole requests add queueing and the forward pass.
PREPROCESS_BUCKETS_S = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]
# One forward pass: ~1 ms (tiny model, CPU) to ~30 ms (SO400M, one logical NeuronCore, batch 1)
# to seconds (SO400M on a CPU), so the boundaries span both.
FORWARD_BUCKETS_S = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
]
REQUEST_BUCKETS_S = [
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0,
]
FILL_BUCKETS = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]


def replica_core_label() -> str:
    """The logical NeuronCore(s) this process was given, or 'none' off Neuron."""
    return os.environ.get("NEURON_RT_VISIBLE_CORES") or "none"


class IngressMetrics:
    def __init__(self) -> None:
        self.images_embedded = metrics.Counter(
            "siglip_images_embedded_total",
            description="Images that were answered with an embedding.",
            tag_keys=("endpoint",),
        )
        self.requests_rejected = metrics.Counter(
            "siglip_requests_rejected_total",
            description="Requests answered with an error, by the contract's error type.",
            tag_keys=("reason",),
        )
        self.preprocess_seconds = metrics.Histogram(
            "siglip_preprocess_seconds",
            description="Decode, validate and resize of one image in the ingress.",
            boundaries=PREPROCESS_BUCKETS_S,
        )
        self.request_seconds = metrics.Histogram(
            "siglip_request_seconds",
            description="Whole embedding request in the ingress, from body read to response.",
            boundaries=REQUEST_BUCKETS_S,
            tag_keys=("endpoint", "status"),
        )

    def rejected(self, reason: str) -> None:
        self.requests_rejected.inc(1, tags={"reason": reason})


class EncoderMetrics:
    def __init__(self) -> None:
        core = replica_core_label()
        self.forward_seconds = metrics.Histogram(
            "siglip_encoder_forward_seconds",
            description="One forward pass of a compiled batch bucket.",
            boundaries=FORWARD_BUCKETS_S,
            tag_keys=("bucket", "neuron_core"),
        )
        self.batch_fill = metrics.Histogram(
            "siglip_batch_fill_ratio",
            description="Real images divided by the bucket size of each forward pass.",
            boundaries=FILL_BUCKETS,
            tag_keys=("neuron_core",),
        )
        self.images = metrics.Counter(
            "siglip_encoder_images_total",
            description="Images run through this replica's model (per-replica throughput).",
            tag_keys=("neuron_core",),
        )
        self.forward_seconds.set_default_tags({"neuron_core": core})
        self.batch_fill.set_default_tags({"neuron_core": core})
        self.images.set_default_tags({"neuron_core": core})

    def forward(self, bucket: int, images: int, seconds: float) -> None:
        self.forward_seconds.observe(seconds, tags={"bucket": str(bucket)})
        self.batch_fill.observe(images / bucket)
        self.images.inc(images)
