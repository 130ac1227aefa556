"""The contract's checks of one text (docs/http-api.md, Images and texts), before any tokenizing: the
service's /v1/embeddings and /v1/classify and `siglip-serve embed --text` run this one function, so a
bulk row is refused exactly when the API refuses the same text.

Like models/image_errors.py for images, the rejections know no transport: serve/http/errors.py's REJECTIONS
says what each is in the HTTP contract (status and type), for the service and for bulk's errors table.
"""

from __future__ import annotations

import sys

from siglip_serve.core.errors import Rejected


def _whitespace() -> str:
    """The characters `str.strip()` strips, as the inside of a regular expression's character class: JSON Schema's
    `\\s` (ECMA-262's) is another set, so the OpenAPI document's patterns of texts name them
    (serve/http/embed_request.py)."""
    runs: list[list[int]] = []
    for code in (code for code in range(sys.maxunicode + 1) if chr(code).isspace()):
        if runs and runs[-1][-1] == code - 1:
            runs[-1].append(code)
        else:
            runs.append([code])
    return "".join(f"\\u{run[0]:04x}" + (f"-\\u{run[-1]:04x}" if len(run) > 1 else "") for run in runs)


# One character `str.strip()` strips, and one it keeps: a text holding one of the latter is not blank.
BLANK_CHAR = f"[{_whitespace()}]"
NOT_BLANK = f"[^{BLANK_CHAR[1:-1]}]"


class TextRejected(Rejected):
    """Base of every text rejection."""


class EmptyText(TextRejected):
    """No characters, or only whitespace: nothing for the tokenizer to embed."""


class TextTooLong(TextRejected):
    """More characters than the service's limit (max_text_chars)."""


def check_text(text: str, max_chars: int) -> None:
    """Raise the text's rejection (empty or blank first, then too long), or return when it may be embedded."""
    if not text.strip():
        raise EmptyText("text is empty" if not text else "text is blank (whitespace only)")
    if len(text) > max_chars:
        raise TextTooLong(f"text is {len(text)} characters, over the {max_chars}-character limit")
