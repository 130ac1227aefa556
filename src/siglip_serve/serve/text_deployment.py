"""The text tower's deployment: SigLIP's text tower in replicas of its own (serve/tower_replica.py).

Texts are cheap next to images, and a separate deployment gives them a separate Serve queue: a burst
of images never delays a text, and a burst of texts never delays an image. The ingress checks every
text (empty, too long, too many) before it gets here; tokenizing happens here, per batch.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from siglip_serve.core.constants import NEURON_CORES
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.metrics import EncoderMetrics
from siglip_serve.serve.placement import plan
from siglip_serve.serve.replica_logging import configure_replica_logging
from siglip_serve.serve.replica_start import start_tower
from siglip_serve.serve.start_marks import BUILD, StartMarks
from siglip_serve.serve.tower_replica import TowerReplica, max_ongoing, refusal_recorder, split_rows, tower_deployment

log = logging.getLogger("siglip_serve.text")


class TextEncoderReplica(TowerReplica):
    """The text tower and its tokenizer; its published record (context length, buckets, tokenizer, the
    zero-shot logit scale, exponentiated, and bias) is what /v1/models and the scores read."""

    def __init__(self, config: ServiceConfig) -> None:
        start = StartMarks.at_constructor()
        configure_replica_logging(config.log_level)
        settings = config.model_settings()

        def build() -> Any:
            # torch: in the replica only, after the backend's environment is set (serve/replica_start.py).
            from siglip_serve.models.backends.implementation import create_text_encoder
            from siglip_serve.serve.cpu_plan import text_torch_threads

            start.imported(settings.backend)
            return create_text_encoder(settings.model_copy(update={"torch_threads": text_torch_threads(config)}))

        encoder = start_tower("text encoder replica", settings, build, config.env_vars, refusal_recorder("text"))
        start.mark(BUILD)
        super().__init__(config, encoder, EncoderMetrics(tower="text"), start)
        self.publish()
        log.info("text encoder replica ready: %s", self.info)

    def encode_chunks(self, chunks: list[Any]) -> list[Any]:
        embeddings = self.encoder.encode([text for chunk in chunks for text in chunk], self.metrics.forward)
        return split_rows(embeddings, [len(chunk) for chunk in chunks])


def text_max_ongoing(config: ServiceConfig) -> int:
    return max_ongoing(config.text_buckets[-1])


def text_neuron_cores(config: ServiceConfig) -> int:
    """NeuronCores one text replica holds (serve/placement.py): a core of its own where its backend
    runs on NeuronCores."""
    return int(plan(config).text.devices.get(NEURON_CORES, 0))


def text_deployment(config: ServiceConfig) -> serve.Deployment:
    """The text tower's deployment. What its artifact or tokenizer lacks is refused by the replica, where
    they are (the builder runs on the head): serve/replica_start.py."""
    return tower_deployment(TextEncoderReplica, "TextEncoder", config, config.text_replica_count, plan(config).text,
                            config.text_buckets[-1])
