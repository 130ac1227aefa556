"""The ingress's text half: the text checks and zero-shot /v1/classify (docs/http-api.md).

Which `/v1/embeddings` items are texts is serve/embed_request.py's rule. Texts are checked (empty, too
long, too many) before any tokenizing, then admitted and encoded like images (serve/ingress_core.py),
in calls of at most the largest text bucket to the TextEncoder deployment.
"""

# No `from __future__ import annotations`: FastAPI-facing types are resolved at runtime.
import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from fastapi import Request, Response
from ray.serve.handle import DeploymentHandle

from siglip_serve.core.texts import TextRejected, check_text
from siglip_serve.models.loading import ModelInfo
from siglip_serve.serve import tracing
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.errors import ApiError, ErrorType, text_error
from siglip_serve.serve.http_body import (
    DEFAULT_TEMPLATE,
    file_labels,
    is_multipart,
    multipart_form,
    parse_classify_request,
    read_body,
)
from siglip_serve.serve.ingress_core import IngressCore


def check_texts(texts: Sequence[str], labels: Sequence[str], config: ServiceConfig, what: str = "texts") -> None:
    """Limits before any tokenizing: count (422), then each text by core/texts.py's check (bulk's too):
    empty or blank (422), characters per text (413)."""
    if len(texts) > config.max_texts_per_request:
        raise ApiError(422, ErrorType.TOO_MANY_TEXTS,
                       f"{len(texts)} {what} in one request; the limit is {config.max_texts_per_request}")
    for text, label in zip(texts, labels, strict=True):
        try:
            check_text(text, config.max_text_chars)
        except TextRejected as exc:
            raise text_error(exc, label) from None


def zero_shot(images: np.ndarray, texts: np.ndarray, scale: float, bias: float) -> np.ndarray:
    """SigLIP's per-pair probability: sigmoid(scale * cos + bias), [n_images, n_labels]."""
    logits = scale * (images.astype(np.float64) @ texts.astype(np.float64).T) + bias
    return 1.0 / (1.0 + np.exp(-logits))


def prompts_of(labels: Sequence[str], template: str) -> list[str]:
    if template.count("{}") != 1:
        raise ApiError(422, ErrorType.INVALID_REQUEST,
                       "template must contain '{}' exactly once, where each label goes (e.g. \"a photo of {}\")")
    if len(set(labels)) != len(labels):
        raise ApiError(422, ErrorType.INVALID_REQUEST, "labels must be distinct")
    # str.replace, not str.format: braces in a label are text, never a format field.
    return [template.replace("{}", label) for label in labels]


class TextRoutes(IngressCore):
    """The text routes, on the ingress's shared plumbing (serve/ingress_core.py)."""

    def __init__(self, encoder: DeploymentHandle, config: ServiceConfig, replicas: int, model: ModelInfo,
                 text_encoder: DeploymentHandle | None = None, replica: tuple[str, str] | None = None) -> None:
        super().__init__(encoder, config, replicas, model, text_encoder, replica)
        self._prompt_cache: OrderedDict[str, np.ndarray] = OrderedDict()

    async def encode_texts(self, texts: Sequence[str], deadline: float) -> np.ndarray:
        """Checked texts -> float32 [n, D]: admitted (the text tower ready), then encoded like images (the same retry,
        cancellation and deadline), in calls of at most the largest text bucket."""
        await self._admitted("text", deadline)
        return await self._encode("text", texts, deadline)

    async def embed_prompts(self, prompts: Sequence[str], deadline: float) -> np.ndarray:
        """Text embeddings of classify prompts: cached ones from the LRU cache, the rest encoded once."""
        found: dict[str, np.ndarray] = {}
        for prompt in prompts:
            if prompt in self._prompt_cache:
                self._prompt_cache.move_to_end(prompt)
                found[prompt] = self._prompt_cache[prompt]
        # Snapshot before the await: a concurrent request may evict entries meanwhile.
        missing = [p for p in dict.fromkeys(prompts) if p not in found]
        if missing:
            for prompt, row in zip(missing, await self.encode_texts(missing, deadline), strict=True):
                found[prompt] = row
                if self.config.classify_cache_size:
                    self._prompt_cache[prompt] = row
            while len(self._prompt_cache) > self.config.classify_cache_size:
                self._prompt_cache.popitem(last=False)
        return np.stack([found[p] for p in prompts])

    async def classify_request(self, request: Request, deadline: float) -> Response:
        """/v1/classify's body, under the ingress's auth check and deadline (`time.monotonic()`)."""
        self._require_text()
        body = await read_body(request, self.config.max_body_bytes)
        if is_multipart(request):
            files, fields = await multipart_form(request, body)
            if not files:
                raise ApiError(400, ErrorType.EMPTY_BODY, "multipart body has no file parts")
            items: list[bytes | str] = [data for _, data in files]
            image_labels = file_labels(files)
            labels = fields.get("labels", [])
            template = (fields.get("template") or [DEFAULT_TEMPLATE])[-1]
            if not labels:
                raise ApiError(422, ErrorType.INVALID_REQUEST, "labels: give one or more `labels` form fields")
        else:
            parsed, json_items, image_labels = parse_classify_request(body, self.model.name)
            items = list(json_items)
            labels, template = parsed.labels, parsed.template
        return await self._timed("classify", self._classify(items, image_labels, labels, template, deadline), deadline)

    async def _classify(self, items: Sequence[bytes | str], image_labels: Sequence[str], labels: Sequence[str],
                        template: str, deadline: float) -> Response:
        if not items:
            raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image is needed")
        if len(items) > self.config.max_images_per_request:
            raise ApiError(422, ErrorType.TOO_MANY_IMAGES,
                           f"{len(items)} images in one request; the limit is {self.config.max_images_per_request}")
        prompts = prompts_of(labels, template)
        check_texts(prompts, [f"labels[{i}]" for i in range(len(prompts))], self.config, what="labels")
        info = await self.text_info(wait_s=max(0.0, deadline - time.monotonic()))
        if info is None:
            raise ApiError(503, ErrorType.NOT_READY, "the text encoder is still loading; retry later",
                           {"Retry-After": str(self.config.retry_after_s)})
        await self._admitted("image", deadline)  # before decoding: 503 while draining or loading
        with tracing.span("decode", images=len(items)):
            images = await self.images.prepare_all(items, image_labels)
        image_embeddings, text_embeddings = await asyncio.gather(
            self._encode("image", images, deadline), self.embed_prompts(prompts, deadline))
        scores = zero_shot(image_embeddings, text_embeddings, float(info["logit_scale"]), float(info["logit_bias"]))
        self.metrics.images_embedded.inc(len(items), tags={"endpoint": "classify"})
        self.metrics.texts_embedded.inc(len(prompts), tags={"endpoint": "classify"})
        data = []
        for i, row in enumerate(scores):
            order = sorted(range(len(labels)), key=lambda j: -row[j])  # stable: ties keep label order
            data.append({"object": "classification", "index": i,
                         "labels": [{"label": labels[j], "score": float(row[j])} for j in order]})
        body = {"object": "list", "data": data, "model": self.model.name, "template": template,
                "usage": {"images": len(items), "texts": len(prompts)}}
        return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")
