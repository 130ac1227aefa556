"""The encoder deployment: one replica per logical NeuronCore (or per configured CPU/GPU worker).

Requests arrive as uint8 chunks of at most the largest bucket's images; the replica's Batcher
(serve/batcher.py) gathers chunks from many requests into one forward pass of the model's buckets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve

from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.serve import registry
from siglip_serve.serve.batcher import Batcher
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.metrics import EncoderMetrics
from siglip_serve.serve.replica_logging import configure_replica_logging

log = logging.getLogger("siglip_serve.encoder")

WARMUP_ITERATIONS = 2


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before its batch ran; it was dropped unrun."""


class EncoderReplica:
    """Loads and warms the model in the constructor, so a replica is RUNNING only once warm."""

    def __init__(self, config: ServiceConfig) -> None:
        # Imported here, not at module level: the ingress imports this module too, and torch would
        # add seconds to its start (during which Serve's proxy holds requests to it unanswered).
        from siglip_serve.models.encoder import create_encoder

        configure_replica_logging(config.log_level)
        self.config = config
        self.encoder = create_encoder(config.model_settings())
        self.metrics = EncoderMetrics()
        self.encoder.forward_observer = self.metrics.forward
        warm = self.encoder.warmup(iterations=WARMUP_ITERATIONS)
        # Every forward pass on one thread: torch's OpenMP keeps a thread team per calling thread, and
        # teams of asyncio.to_thread's rotating workers spin on the same cores after their pass.
        self.forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        self.batcher = Batcher(self._embed_batch, self.encoder.max_batch_size, len,
                               config.batch_wait_timeout_s, on_batch=self.metrics.batch_started)
        context = serve.get_replica_context()
        self.app_name = context.app_name
        self.replica_actor_name = context.replica_id.to_full_id_str()
        self.info: dict[str, Any] = {
            "replica_id": context.replica_id.unique_id,
            "neuron_rt_visible_cores": os.environ.get("NEURON_RT_VISIBLE_CORES"),
            "neuron_logical_nc_config": os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "warmup_seconds": {str(b): round(s, 6) for b, s in warm.items()},
            **self.encoder.describe(),
        }
        registry.register_replica(self.app_name, self.replica_actor_name, self.info)
        log.info("encoder replica ready: %s", self.info)

    async def embed(self, images: np.ndarray, deadline: float) -> np.ndarray:
        """uint8 [n, 3, H, W] with n <= the largest bucket -> float32 [n, D]."""
        return await self.batcher.submit(images, deadline)

    async def embed_chunks(self, chunks: list[np.ndarray], deadlines: list[float]) -> list[Any]:
        """Several callers' chunks in one call (serve/encoder_client.py): one result per chunk, its
        float32 [n, D] or the exception it alone failed with; each joins the batch queue on its own."""
        results = await asyncio.gather(*(self.batcher.submit(chunk, deadline)
                                         for chunk, deadline in zip(chunks, deadlines, strict=True)),
                                       return_exceptions=True)
        # A cancellation (the replica stopping) is no answer to pickle back; the call as a whole fails.
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        return list(results)

    async def _embed_batch(self, chunks: list[np.ndarray | JpegFiles], deadlines: list[float]) -> list[Any]:
        from siglip_serve.models.encoder import EncoderInputError  # loaded by __init__ already

        # Each chunk is answered on its own: a bad or late chunk gets its own error, the rest run.
        results: list[Any] = [None] * len(chunks)
        now = time.time()
        runnable = []
        for i, (chunk, deadline) in enumerate(zip(chunks, deadlines, strict=True)):
            try:
                if not isinstance(chunk, JpegFiles):
                    self.encoder.check_input(chunk)
            except EncoderInputError as exc:
                results[i] = exc
                continue
            if deadline < now:
                results[i] = DeadlineExceeded("deadline passed while queued")
                continue
            runnable.append(i)
        if runnable:
            # Off the event loop, so the replica keeps accepting and gathering the next batch.
            loop = asyncio.get_running_loop()
            taken = [chunks[i] for i in runnable]
            outcome = await loop.run_in_executor(self.forward_thread, self._encode_chunks, taken)
            for i, result in zip(runnable, outcome, strict=True):
                results[i] = result
        return results

    def _encode_chunks(self, chunks: list[np.ndarray | JpegFiles]) -> list[Any]:
        """One forward pass over the chunks (JPEG files decoded on the model's device first): each
        chunk's embeddings, or the decode error that chunk alone failed with."""
        if not any(isinstance(chunk, JpegFiles) for chunk in chunks):
            embeddings = self.encoder.encode(np.concatenate(chunks))
            return _split(embeddings, [len(chunk) for chunk in chunks])
        import torch

        from siglip_serve.models.device_decode import DeviceDecodeError, decode_resize
        from siglip_serve.models.image_errors import CorruptImage

        device = getattr(self.encoder, "device", torch.device("cpu"))
        pixels: list[Any] = []
        for chunk in chunks:
            try:
                pixels.append(decode_resize(chunk.files, self.encoder.image_size, device)
                              if isinstance(chunk, JpegFiles) else torch.from_numpy(chunk).to(device))
            except DeviceDecodeError:
                pixels.append(CorruptImage("image data is truncated or corrupt"))
        good = [p for p in pixels if not isinstance(p, Exception)]
        parts = iter(_split(self.encoder.encode(torch.cat(good)), [len(p) for p in good]) if good else [])
        return [p if isinstance(p, Exception) else next(parts) for p in pixels]

    def __del__(self) -> None:
        try:
            registry.unregister_replica(self.app_name, self.replica_actor_name)
        except Exception:  # broad on purpose: best effort at shutdown; live_replicas prunes dead ones anyway
            pass


def _split(embeddings: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    offsets = np.cumsum([0, *sizes])
    return [embeddings[start:stop] for start, stop in zip(offsets[:-1], offsets[1:], strict=True)]


def encoder_max_ongoing(config: ServiceConfig) -> int:
    # One batch runs while the next gathers: a full batch of single-image calls queued behind it.
    return 2 * config.max_batch_size


def encoder_deployment(config: ServiceConfig, replicas: int) -> serve.Deployment:
    """The deployment with placement and queue bounds from the config."""
    resources: dict[str, float] = {}
    if config.cores_per_replica:
        resources["neuron_cores"] = config.cores_per_replica
    actor_options: dict[str, Any] = {"num_cpus": config.encoder_num_cpus}
    if resources:
        actor_options["resources"] = resources
    if config.backend == "cuda":
        actor_options["num_gpus"] = 1
    # The backend's own environment first (neuron-native: the artifact's recipe, read by TorchNeuron
    # at import); a config env_var that contradicts it is refused by the replica, naming both.
    from siglip_serve.models.encoder import backend_replica_env  # here, not at import: the ingress imports this module

    env_vars = {**backend_replica_env(config.model_settings()), **config.env_vars}
    if env_vars:
        actor_options["runtime_env"] = {"env_vars": env_vars}
    return serve.deployment(
        EncoderReplica,
        name="Encoder",
        num_replicas=replicas,
        ray_actor_options=actor_options,
        # No max_queued_requests: the queue is bounded in the ingress (Ingress._encode), which
        # answers 503 in the contract's JSON, where Serve's own limit answers in plain text.
        max_ongoing_requests=encoder_max_ongoing(config),
        health_check_period_s=10,
        graceful_shutdown_timeout_s=max(5.0, config.request_timeout_s),
    )
