"""What a bulk job's shards and rows say their vectors were made with: the weights (a checkpoint by its content's
digest, a hub model by its snapshot's commit) and the preprocessing, so that a re-run against other weights or
another preprocessing never resumes into shards of the old ones (bulk/job.py names its shards by them)."""

from __future__ import annotations

import hashlib

from siglip_serve.models.preprocess import FAST_PREPROCESS, PREPROCESS_VERSION
from siglip_serve.serve.http.embed_request import Modality
from siglip_serve.serve.plan.config import ServiceConfig


def weights_id(config: ServiceConfig) -> str:
    """What the weights are, for shard names and output rows: a checkpoint by its content's digest, a hub model
    with the revision of its cached snapshot (fetched here once)."""
    if config.source.on_hub and not config.uses_random_weights:
        from siglip_serve.models.hub_repo import hub_model

        return hub_model(config.source, weights=True).label
    if config.checkpoint is None:
        return config.weights_source
    digest = hashlib.sha256()
    with open(config.checkpoint, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"checkpoint-sha256:{digest.hexdigest()}"


def preprocessing_id(config: ServiceConfig, modality: Modality) -> str:
    if modality == "text":
        return f"text:{config.model}-tokenizer"
    resample = "bicubic"
    if config.source.on_hub:  # its processor's filter, which may be another
        from siglip_serve.models.hub_repo import hub_model

        image = hub_model(config.source).image
        resample = image.resample
        if image.naflex is not None:  # each image at its own aspect ratio, packed at the model's own budget
            return f"naflex-{resample}-uint8-v1-patches{image.naflex.default_budget}"
    version = PREPROCESS_VERSION if resample == "bicubic" else PREPROCESS_VERSION.replace("bicubic", resample)
    return f"{version}{FAST_PREPROCESS if config.fast_jpeg_decode else ''}"
