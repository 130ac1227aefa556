"""One check of a text for the service and for bulk (core/texts.py): `siglip-serve embed --text` refuses
the texts /v1/embeddings refuses, with the contract's type and words (bulk/job.py: a row equals what the
API answers)."""

from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.core import texts
from siglip_serve.core.texts import TextRejected
from siglip_serve.serve.http.errors import REJECTIONS, ApiError
from siglip_serve.serve.ingress.schedule import check_texts
from siglip_serve.serve.plan.config import ServiceConfig

MAX_CHARS = 10
TEXTS = ["", " ", "\n\t \u00a0", "a cat", " a cat ", "x" * MAX_CHARS, "x" * (MAX_CHARS + 1), " " * (MAX_CHARS + 1)]


def served(text: str) -> tuple[int, str, str] | None:
    """(status, type, message without the item's label) /v1/embeddings answers for `text`, None when embedded."""
    try:
        check_texts([text], ["input[0]"], ServiceConfig.from_args({"max_text_chars": MAX_CHARS}))
    except ApiError as exc:
        return exc.status, exc.error_type.value, exc.message.removeprefix("input[0]: ")
    return None


def test_bulk_refuses_the_texts_the_api_refuses_with_its_type_and_words() -> None:
    from siglip_serve.bulk.stages import check_texts as bulk_check_texts

    batch = {"shard": np.zeros(len(TEXTS), np.int64), "pos": np.arange(len(TEXTS)),
             "item": np.array(TEXTS, dtype=object)}
    rows = bulk_check_texts(batch, max_chars=MAX_CHARS, model="tiny-siglip")
    # Before: empty and blank texts went on to the text tower and were embedded.
    assert list(rows["error_type"]) == ["invalid_request"] * 3 + ["", "", "", "text_too_long", "invalid_request"]
    for text, error_type, message in zip(TEXTS, rows["error_type"], rows["message"], strict=True):
        answer = served(text)
        assert (error_type, message) == (("", "") if answer is None else answer[1:]), repr(text)
    assert [answer[0] for answer in map(served, TEXTS) if answer is not None] == [422, 422, 422, 413, 422]


def test_the_check_says_what_is_wrong() -> None:
    for text, says in (("", "text is empty"), (" \n", "text is blank (whitespace only)"),
                       ("x" * 11, "text is 11 characters, over the 10-character limit")):
        with pytest.raises(texts.TextRejected, match=says.replace("(", r"\(").replace(")", r"\)")):
            texts.check_text(text, MAX_CHARS)
    texts.check_text(" a cat ", MAX_CHARS)  # surrounding spaces are the text's own: embedded as sent


def test_every_text_rejection_has_one_answer_in_the_table() -> None:
    raised = {cls for cls in vars(texts).values()
              if isinstance(cls, type) and issubclass(cls, texts.TextRejected)} - {texts.TextRejected}
    assert {cls for cls in REJECTIONS if issubclass(cls, TextRejected)} == raised


def test_the_documents_not_blank_pattern_is_the_checks_blank() -> None:
    # The OpenAPI document's texts carry NOT_BLANK (serve/http/embed_request.py); check_text's blank is str.strip's,
    # whose whitespace is not JSON Schema's \s. Every code point, read by Python's regex and the document's validator.
    import re
    import sys

    import jsonschema_rs

    pattern = re.compile(texts.NOT_BLANK)
    document = jsonschema_rs.Draft202012Validator({"type": "string", "pattern": texts.NOT_BLANK})
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code < 0xE000:  # surrogates: no JSON string holds one alone
            continue
        kept = chr(code).strip() != ""
        assert (pattern.search(chr(code)) is not None) == kept == document.is_valid(chr(code)), hex(code)
