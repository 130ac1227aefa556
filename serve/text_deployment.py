"""The text encoder deployment: SigLIP's text tower in replicas of its own, with a batcher of its own.

Texts are cheap next to images, and a separate deployment gives them a separate Serve queue: a burst
of images never delays a text, and a burst of texts never delays an image. The ingress checks every
text (empty, too long, too many) before it gets here; tokenizing happens here, per batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from ray import serve

from siglip_serve.models.text import create_text_encoder
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.encoder_deployment import DeadlineExceeded
from siglip_serve.serve.metrics import EncoderMetrics
from siglip_serve.serve.replica_logging import configure_replica_logging

log = logging.getLogger("siglip_serve.text")

WARMUP_ITERATIONS = 2


def count_texts(chunks: list[list[str]]) -> int:
    return sum(len(chunk) for chunk in chunks)


class TextEncoderReplica:
    """Loads and warms the text tower and tokenizer in the constructor (RUNNING only once warm)."""

    def __init__(self, config: ServiceConfig) -> None:
        configure_replica_logging(config.log_level)
        self.encoder = create_text_encoder(config.model_settings())
        self.metrics = EncoderMetrics(tower="text")
        self.encoder.forward_observer = self.metrics.forward
        warm = self.encoder.warmup(iterations=WARMUP_ITERATIONS)
        self._embed_batch.set_max_batch_size(self.encoder.max_batch_size)
        self._embed_batch.set_batch_wait_timeout_s(config.batch_wait_timeout_s)
        self.info: dict[str, Any] = {
            **self.encoder.describe(),
            "warmup_seconds": {str(b): round(s, 6) for b, s in warm.items()},
        }
        log.info("text encoder replica ready: %s", self.info)

    def describe(self) -> dict[str, Any]:
        """Context length, buckets, tokenizer, and the zero-shot logit scale (exponentiated) and bias."""
        return self.info

    async def embed(self, texts: list[str], deadline: float) -> np.ndarray:
        """At most the largest text bucket's texts -> float32 [n, D]."""
        result = await self._embed_batch(texts, deadline)
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=count_texts)
    async def _embed_batch(self, chunks: list[list[str]], deadlines: list[float]) -> list[Any]:
        results: list[Any] = [None] * len(chunks)
        now = time.time()
        runnable = []
        for i, deadline in enumerate(deadlines):
            if deadline < now:
                results[i] = DeadlineExceeded("deadline passed while queued")
            else:
                runnable.append(i)
        if runnable:
            texts = [text for i in runnable for text in chunks[i]]
            # Off the event loop: tokenizing and the forward pass; the batcher keeps gathering.
            embeddings = await asyncio.to_thread(self.encoder.encode, texts)
            offset = 0
            for i in runnable:
                results[i] = embeddings[offset: offset + len(chunks[i])]
                offset += len(chunks[i])
        return results


def text_max_ongoing(config: ServiceConfig) -> int:
    return 2 * config.text_buckets[-1]


def text_neuron_cores(config: ServiceConfig) -> int:
    """NeuronCores one text replica holds: only the neuron backend runs text on a core."""
    return config.cores_per_replica if config.backend == "neuron" else 0


def text_deployment(config: ServiceConfig) -> serve.Deployment:
    actor_options: dict[str, Any] = {"num_cpus": config.text_num_cpus}
    if text_neuron_cores(config):
        actor_options["resources"] = {"neuron_cores": text_neuron_cores(config)}
    if config.backend == "cuda":
        # The image replica asks for a whole GPU, so a text replica needs one of its own.
        actor_options["num_gpus"] = 1
    if config.env_vars:
        actor_options["runtime_env"] = {"env_vars": dict(config.env_vars)}
    return serve.deployment(
        TextEncoderReplica,
        name="TextEncoder",
        num_replicas=config.text_replica_count,
        ray_actor_options=actor_options,
        max_ongoing_requests=text_max_ongoing(config),
        health_check_period_s=10,
        graceful_shutdown_timeout_s=max(5.0, config.request_timeout_s),
    )
