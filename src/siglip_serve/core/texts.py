"""The contract's checks of one text (docs/http-api.md, Images and texts), before any tokenizing: the
service's /v1/embeddings and /v1/classify and `siglip-serve embed --text` run this one function, so a
bulk row is refused exactly when the API refuses the same text.

Like models/image_errors.py for images, the rejections know no transport: serve/http/errors.py's REJECTIONS
says what each is in the HTTP contract (status and type), for the service and for bulk's errors table.
"""

from __future__ import annotations

from siglip_serve.core.errors import Rejected


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
