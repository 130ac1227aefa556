"""The text tower's replica: SigLIP's text tower in replicas of its own (serve/towers/tower_replica.py).

Texts are cheap next to images, and a separate deployment gives them a separate Serve queue: a burst
of images never delays a text, and a burst of texts never delays an image. The ingress checks every
text (empty, too long, too many) before it gets here; tokenizing happens here, per batch.
"""

from __future__ import annotations

import logging
from typing import Any

from siglip_serve.serve.plan.replica_slices import TowerRun
from siglip_serve.serve.plan.service_plan import TowerPlan
from siglip_serve.serve.shared import registry
from siglip_serve.serve.shared.metrics import TowerMetrics
from siglip_serve.serve.towers.tower_replica import TowerReplica, build_tower, split_rows, start_served

log = logging.getLogger("siglip_serve.text")


class TextReplica(TowerReplica):
    """The text tower and its tokenizer; its published record (context length, buckets, tokenizer, the
    zero-shot logit scale, exponentiated, and bias) is what /v1/models and the scores read."""

    def __init__(self, run: TowerRun, plan: TowerPlan) -> None:
        tower, start = build_tower(run, plan, "text")
        super().__init__(run, tower, TowerMetrics(plan.served_as, tower="text"), start)
        self.publish({registry.SERVED_AS: plan.served_as})
        log.info("text encoder replica ready: %s", self.info)

    def encode_chunks(self, chunks: list[Any]) -> list[Any]:
        embeddings = self.tower.encode([text for chunk in chunks for text in chunk], self.metrics.forward)
        return split_rows(embeddings, [len(chunk) for chunk in chunks])


class ServedTextReplica(TextReplica):
    """TextReplica as Serve deploys it: it waits for its artifact volume before it is built."""

    # Serve awaits an async constructor (ray/serve/_private/replica.py UserCallableWrapper.initialize_callable).
    async def __init__(self, run: TowerRun, plan: TowerPlan) -> None:
        await start_served("text", run, lambda: TextReplica.__init__(self, run, plan))
