"""POST /v1/classify: zero-shot classification, every image scored against every label's prompt with SigLIP's
sigmoid (docs/http-api.md); the body JSON or multipart (image file parts, one `labels` field per label).

Both bodies' labels and template are `Prompts`; its schema says what `prompts_of` and the text checks refuse, but
one rule: a prompt (the template with a label in it) within max_text_chars, which is across the two lengths and
JSON Schema cannot say. The document bounds each alone (a label to max_text_chars, the template to 2 more).
"""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Request, Response
from pydantic import BaseModel, ConfigDict, Field

from siglip_serve.core.texts import BLANK_CHAR, NOT_BLANK
from siglip_serve.serve.http.embed_request import NON_EMPTY, ImageString, Item, ModelName, Priority, image_items
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.http.http_body import file_labels, is_multipart, multipart_form, parse_json, read_body
from siglip_serve.serve.http.openapi import WORK_ERRORS, Files, Operation, form, service_limit
from siglip_serve.serve.http.responses import Answer, Counts
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import SCORE, Scheduled, Work

DEFAULT_TEMPLATE = "{}"
# Text without "{}": characters other than "{", or "{"s before a character other than "{" and "}", then any "{"s.
_NO_SLOT = r"(?:[^{]|\{+[^{}])*\{*"
# A template holding "{}" exactly once (`prompts_of`).
_ONE_SLOT = rf"^{_NO_SLOT}\{{\}}{_NO_SLOT}$"
# A template that is "{}" and whitespace: its prompts are as blank as their labels.
_BLANK_BESIDE_SLOT = rf"^{BLANK_CHAR}*\{{\}}{BLANK_CHAR}*$"


def _prompts_not_blank(schema: dict[str, Any]) -> None:
    # A prompt must not be blank (core/texts.py): the template holds more than "{}" and whitespace, or no label is
    # blank.
    schema["anyOf"] = [{"required": ["template"], "properties": {"template": {"not": {"pattern": _BLANK_BESIDE_SLOT}}}},
                       {"properties": {"labels": {"items": {"pattern": NOT_BLANK}}}}]


class Prompts(BaseModel):
    """The labels and the template of /v1/classify's body, JSON or multipart."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_prompts_not_blank)

    labels: list[Annotated[str, Field(json_schema_extra=service_limit(maxLength="max_text_chars"))]] = Field(
        min_length=1, description="distinct labels",
        json_schema_extra={"uniqueItems": True, **service_limit(maxItems="max_texts_per_request")})
    template: str = Field(DEFAULT_TEMPLATE, description="with exactly one {}, e.g. 'a photo of {}'",
                          json_schema_extra={"pattern": _ONE_SLOT, **service_limit(maxLength=("max_text_chars", 2))})


class ClassifyRequest(Prompts):
    input: ImageString | list[ImageString] = Field(
        json_schema_extra={**NON_EMPTY, **service_limit(maxItems="max_images_per_request")})
    model: ModelName = None
    priority: Priority = None


class ClassifyForm(Prompts):
    """image file parts, one `labels` field per label, optional `template`"""

    file: Files


@dataclass(frozen=True)
class ClassifyInput:
    """/v1/classify's body, JSON or multipart: its images (with the labels messages name them by), the labels
    to score, and the template each label goes into."""

    images: list[bytes | str]
    image_labels: list[str]
    labels: list[str]
    template: str
    model: str | None = None  # the model asked for (JSON's `model`, a multipart `model` field); None: the default


async def read_classify(request: Request, body: bytes) -> ClassifyInput:
    if is_multipart(request):
        files, fields = await multipart_form(request, body)
        if not files:
            raise ApiError(400, ErrorType.EMPTY_BODY, "multipart body has no file parts")
        labels = fields.get("labels", [])
        if not labels:
            raise ApiError(422, ErrorType.INVALID_REQUEST, "labels: give one or more `labels` form fields")
        models = fields.get("model") or []
        return ClassifyInput([data for _, data in files], file_labels(files), labels,
                             (fields.get("template") or [DEFAULT_TEMPLATE])[-1], models[-1] if models else None)
    parsed = parse_json(body, ClassifyRequest)
    if isinstance(parsed.input, str):
        return ClassifyInput([parsed.input], ["input"], parsed.labels, parsed.template, parsed.model)
    return ClassifyInput(list(parsed.input), [f"input[{i}]" for i in range(len(parsed.input))], parsed.labels,
                         parsed.template, parsed.model)


class LabelScore(Answer):
    label: str
    score: float = Field(ge=0, le=1, description="SigLIP's sigmoid probability")


class Classification(Answer):
    object: Literal["classification"]
    index: int = Field(ge=0)
    labels: list[LabelScore] = Field(description="every label with its sigmoid probability, highest first")


class ClassifyResponse(Answer):
    object: Literal["list"]
    data: list[Classification]
    model: str
    template: str
    usage: Counts


def prompts_of(labels: Sequence[str], template: str) -> list[str]:
    if template.count("{}") != 1:
        raise ApiError(422, ErrorType.INVALID_REQUEST,
                       "template must contain '{}' exactly once, where each label goes (e.g. \"a photo of {}\")")
    if len(set(labels)) != len(labels):
        raise ApiError(422, ErrorType.INVALID_REQUEST, "labels must be distinct")
    # str.replace, not str.format: braces in a label are text, never a format field.
    return [template.replace("{}", label) for label in labels]


async def classify(ingress: Ingress, request: Request, deadline: float) -> Response:
    body = await read_body(request, ingress.front.max_body_bytes)
    asked = await read_classify(request, body)
    served = ingress.serving(asked.model)
    if not asked.images:
        raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image is needed")
    prompts = prompts_of(asked.labels, asked.template)
    count = len(asked.images)
    items = [*image_items(asked.images, asked.image_labels),
             *(Item("text", prompt, f"labels[{i}]") for i, prompt in enumerate(prompts))]

    def render(done: Scheduled) -> Response:
        data = []
        for i, row in enumerate(done.scores(done.rows[:count], done.rows[count:])):
            order = sorted(range(len(prompts)), key=lambda j: -row[j])  # stable: ties keep label order
            data.append({"object": "classification", "index": i,
                         "labels": [{"label": asked.labels[j], "score": float(row[j])} for j in order]})
        answer = {"object": "list", "data": data, "model": served.name, "template": asked.template,
                  "usage": {"images": done.images, "texts": done.texts}}
        return Response(json.dumps(answer, separators=(",", ":")), media_type="application/json")

    work = Work("classify", items, score=True, texts_called="labels")
    return await served.scheduler.answer(work, deadline, render)


ROWS = (
    Route("POST", "/v1/classify", classify, needs=(SCORE,), endpoints=("classify",), texts=True, doc=Operation(
        "Zero-shot classification: SigLIP's sigmoid probability of every label for every image", ClassifyResponse,
        "per image, every label's probability", WORK_ERRORS, body=ClassifyRequest, bodies=form(ClassifyForm),
        model_in="form")),
)
