"""Is one embedding response right? Returns the reason it is not, as a short stable string.

Reasons are stable (no request ids, no numbers that vary per request beyond the counts that
matter) so that Locust groups them into a few failure rows instead of one row per request.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any


def error_reason(status: int, body: bytes) -> str:
    """The contract's error type if the body is one, else just the status."""
    try:
        error = json.loads(body)["error"]
        return f"HTTP {status} {error['type']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status} (not the contract's error JSON)"


def _dimension(item: Any, encoding_format: str) -> int | None:
    embedding = item.get("embedding") if isinstance(item, dict) else None
    if encoding_format == "base64":
        if not isinstance(embedding, str):
            return None
        try:
            raw = base64.b64decode(embedding, validate=True)
        except (binascii.Error, ValueError):
            return None
        return len(raw) // 4 if len(raw) % 4 == 0 else None
    if not isinstance(embedding, list):
        return None
    return len(embedding)


def check_response(status: int, body: bytes, images: int, dim: int, encoding_format: str = "float") -> str | None:
    """None when the response is a 200 with `images` embeddings of dimension `dim`, else why not."""
    if status != 200:
        return error_reason(status, body)
    try:
        parsed = json.loads(body)
    except ValueError:
        return "HTTP 200 with a body that is not JSON"
    items = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(items, list):
        return "HTTP 200 without a data list"
    if len(items) != images:
        return f"expected {images} embeddings, got {len(items)}"
    for item in items:
        got = _dimension(item, encoding_format)
        if got is None:
            return f"an embedding is not a {encoding_format} vector"
        if got != dim:
            return f"embedding dimension {got}, expected {dim}"
    return None
