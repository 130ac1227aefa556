"""The text encoder deployment: SigLIP's text tower in replicas of its own, with a batcher of its own.

Texts are cheap next to images, and a separate deployment gives them a separate Serve queue: a burst
of images never delays a text, and a burst of texts never delays an image. The ingress checks every
text (empty, too long, too many) before it gets here; tokenizing happens here, per batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from ray import serve

from siglip_serve.models.settings import NEURON_BACKENDS
from siglip_serve.models.text import create_text_encoder
from siglip_serve.serve.batcher import Batcher
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.encoder_deployment import DeadlineExceeded
from siglip_serve.serve.metrics import EncoderMetrics
from siglip_serve.serve.replica_logging import configure_replica_logging

log = logging.getLogger("siglip_serve.text")

WARMUP_ITERATIONS = 2


class TextEncoderReplica:
    """Loads and warms the text tower and tokenizer in the constructor (RUNNING only once warm)."""

    def __init__(self, config: ServiceConfig) -> None:
        configure_replica_logging(config.log_level)
        self.encoder = create_text_encoder(config.model_settings())
        self.metrics = EncoderMetrics(tower="text")
        self.encoder.forward_observer = self.metrics.forward
        warm = self.encoder.warmup(iterations=WARMUP_ITERATIONS)
        # Every forward pass on one thread: torch's OpenMP keeps a thread team per calling thread, and
        # teams of asyncio.to_thread's rotating workers spin on the same cores after their pass.
        self.forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        self.batcher = Batcher(self._embed_batch, self.encoder.max_batch_size, len, config.batch_wait_timeout_s,
                               on_batch=self.metrics.batch_started)
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
        return await self.batcher.submit(texts, deadline)

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
            loop = asyncio.get_running_loop()
            embeddings = await loop.run_in_executor(self.forward_thread, self.encoder.encode, texts)
            offset = 0
            for i in runnable:
                results[i] = embeddings[offset: offset + len(chunks[i])]
                offset += len(chunks[i])
        return results


def text_max_ongoing(config: ServiceConfig) -> int:
    return 2 * config.text_buckets[-1]


def text_neuron_cores(config: ServiceConfig) -> int:
    """NeuronCores one text replica holds: on both Neuron lines it runs on a core of its own."""
    return config.cores_per_replica if config.backend in NEURON_BACKENDS else 0


def text_deployment(config: ServiceConfig) -> serve.Deployment:
    from siglip_serve.models.encoder import backend_replica_env
    from siglip_serve.models.text import check_text_artifact

    # Refused here, once, in one line: a text replica that cannot load would die at start while
    # Serve retries it for ever, and /v1/classify would never come up.
    check_text_artifact(config.model_settings())
    actor_options: dict[str, Any] = {"num_cpus": config.text_num_cpus}
    if text_neuron_cores(config):
        actor_options["resources"] = {"neuron_cores": text_neuron_cores(config)}
    if config.backend == "cuda":
        # The image replica asks for a whole GPU, so a text replica needs one of its own.
        actor_options["num_gpus"] = 1
    # As for the image replicas: the backend's environment (neuron-native: the artifact's recipe,
    # read by TorchNeuron when torch is imported) before the config's own.
    env_vars = {**backend_replica_env(config.model_settings()), **config.env_vars}
    if env_vars:
        actor_options["runtime_env"] = {"env_vars": env_vars}
    return serve.deployment(
        TextEncoderReplica,
        name="TextEncoder",
        num_replicas=config.text_replica_count,
        ray_actor_options=actor_options,
        max_ongoing_requests=text_max_ongoing(config),
        health_check_period_s=10,
        graceful_shutdown_timeout_s=max(5.0, config.request_timeout_s),
    )
