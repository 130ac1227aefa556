"""Locust users for the text half of siglip-serve: text embeddings and zero-shot classify.

    locust -f src/siglip_serve/loadtest/text_locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -t 60s \\
        --texts-per-request 8 --labels 5

A separate file from loadtest/locustfile.py (whose image users and recorder drive `siglip-serve
loadtest`), so image runs stay exactly as they were; pick one class with `TextUser` or `ClassifyUser`
on the command line, or run both. Every answer is checked: a text request succeeds only with one
embedding per text of the served dimension, a classify request only with every label scored once,
scores in [0, 1] and sorted. Locust's stats count requests: texts/s = requests/s * --texts-per-request.
"""

# Locust first: its gevent monkey-patching must precede anything that imports ssl or urllib3.
from locust import FastHttpUser, constant, events, task  # isort: skip

import base64
import json
import logging
import random
import uuid
from typing import Any

import httpx

from siglip_serve.core.constants import LOADTEST_API_KEY_ENV
from siglip_serve.loadtest.validate import check_response, error_reason
from siglip_serve.measure.corpus import load_corpus

log = logging.getLogger("siglip_loadtest.text")

WORDS = ("cat", "dog", "rocket", "coffee", "astronaut", "tree", "car", "boat", "flower", "house", "red", "blue",
         "small", "large", "photo", "picture", "night", "city", "beach", "mountain")
LABELS = ("astronaut", "cat", "coffee", "rocket", "galaxy", "moon", "camera", "cells", "dog", "car")


class TextSetup:
    dim: int = 0
    headers: dict[str, str] = {}
    images: list[str] = []


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    group = parser.add_argument_group("siglip-serve text")
    group.add_argument("--texts-per-request", type=int, default=8, help="TextUser: texts in each request (default 8)")
    group.add_argument("--labels", type=int, default=5, help=f"ClassifyUser: labels per request (1-{len(LABELS)})")
    group.add_argument("--template", default="a photo of {}", help="ClassifyUser: prompt template")
    group.add_argument("--text-api-key", default="", env_var=LOADTEST_API_KEY_ENV,
                       help="Authorization: Bearer KEY (or env SIGLIP_LOADTEST_API_KEY)")


@events.test_start.add_listener
def _test_start(environment: Any, **_kw: Any) -> None:
    options = environment.parsed_options
    key = options.text_api_key if options is not None else ""
    TextSetup.headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{(environment.host or '').rstrip('/')}/v1/models", headers=TextSetup.headers, timeout=30)
    response.raise_for_status()
    entry = response.json()["data"][0]
    if "text" not in entry.get("modalities", []):
        log.error("the service serves no text tower (modalities %s)", entry.get("modalities"))
        environment.process_exit_code = 2
        environment.runner.quit()
        return
    TextSetup.dim = int(entry["embedding_dim"])
    TextSetup.images = ["data:image/jpeg;base64," + base64.b64encode(image.data).decode()
                        for image in load_corpus(None) if image.content_type == "image/jpeg"]


def check_classify(status: int, body: bytes, labels: list[str]) -> str | None:
    if status != 200:
        return error_reason(status, body)
    try:
        ranked = json.loads(body)["data"][0]["labels"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "HTTP 200 without data[0].labels"
    scores = [entry.get("score") for entry in ranked]
    if sorted(entry.get("label") for entry in ranked) != sorted(labels):
        return "labels missing or repeated"
    if not all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores) or scores != sorted(scores, reverse=True):
        return "scores not probabilities in descending order"
    return None


class _Checked(FastHttpUser):
    abstract = True
    wait_time = constant(0)
    network_timeout = 120.0

    def _post(self, path: str, name: str, payload: dict[str, Any], check: Any) -> None:
        headers = {**TextSetup.headers, "Content-Type": "application/json", "X-Request-ID": uuid.uuid4().hex}
        with self.client.request("POST", path, name=name, data=json.dumps(payload), headers=headers,
                                 catch_response=True) as response:
            if response.status_code == 0:
                return
            reason = check(response.status_code, response.content or b"")
            if reason is None:
                response.success()
            else:
                response.failure(reason)


class TextUser(_Checked):
    """Closed loop: POST /v1/embeddings with --texts-per-request short random texts."""

    @task
    def embed_texts(self) -> None:
        n = self.environment.parsed_options.texts_per_request
        texts = [" ".join(random.choices(WORDS, k=random.randint(2, 8))) for _ in range(n)]
        self._post("/v1/embeddings", f"text x{n}", {"input": texts},
                   lambda status, body: check_response(status, body, n, TextSetup.dim))


class ClassifyUser(_Checked):
    """Closed loop: POST /v1/classify with one photo and --labels labels."""

    @task
    def classify(self) -> None:
        options = self.environment.parsed_options
        labels = random.sample(LABELS, max(1, min(options.labels, len(LABELS))))
        image = random.choice(TextSetup.images)
        self._post("/v1/classify", f"classify x{len(labels)}",
                   {"input": image, "labels": labels, "template": options.template},
                   lambda status, body: check_classify(status, body, labels))
