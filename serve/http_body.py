"""The ingress's HTTP bodies: reading one within its limit, multipart file parts, and the response.

Kept apart from the request path (serve/ingress.py) so that module stays about what a request
costs and when; nothing here knows Ray.
"""

import base64
import json
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from fastapi import Request, Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from serve.errors import ApiError, ErrorType, error_response

# Ray Serve's proxy parses headers with httptools and no limits (docs/http-api.md, Front-end
# limits); the application refuses what no client needs: nginx's default buffers hold 32 KiB.
MAX_HEADER_COUNT = 100
MAX_HEADER_BYTES = 64 * 1024

# A body over max_body_bytes is read and thrown away up to this much more before the 413 is sent:
# clients that send the whole body before reading (urllib, requests) then see the 413 instead of
# a connection reset. Past it the connection is closed.
OVERSIZE_DISCARD_BYTES = 64 * 1024 * 1024
class HeaderLimits:
    """ASGI middleware: 431 for a request with more than MAX_HEADER_COUNT headers or MAX_HEADER_BYTES of them."""

    def __init__(self, app: Any, on_error: Callable[[ApiError], None]) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers") or []
            size = sum(len(name) + len(value) + 4 for name, value in headers)
            if len(headers) > MAX_HEADER_COUNT or size > MAX_HEADER_BYTES:
                error = ApiError(431, ErrorType.HEADERS_TOO_LARGE,
                                 f"{len(headers)} headers of {size} bytes; the limits are {MAX_HEADER_COUNT} "
                                 f"headers and {MAX_HEADER_BYTES} bytes")
                self.on_error(error)
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    declared_size = int(declared) if declared is not None and declared.isdigit() else None
    over = declared_size is not None and declared_size > limit
    body = bytearray()
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if over or received > limit:
            over = True
            body.clear()  # read and thrown away, so the client gets to read the 413
            if received > limit + OVERSIZE_DISCARD_BYTES:
                break
            continue
        body += chunk
    if over:
        size = f"{declared_size} bytes" if declared_size is not None else "over that"
        raise ApiError(413, ErrorType.PAYLOAD_TOO_LARGE, f"body is {size}, over the {limit}-byte limit")
    if not body:
        raise ApiError(400, ErrorType.EMPTY_BODY, "request body is empty")
    return bytes(body)


async def multipart_form(request: Request, body: bytes) -> tuple[list[tuple[str, bytes]], dict[str, list[str]]]:
    """File parts (cleaned filename, bytes) in order, and text fields, of an already size-checked body."""

    async def replay() -> Any:
        yield body

    parser = MultiPartParser(request.headers, replay())
    # The body is already in memory and bounded by max_body_bytes: no spooling of parts to disk.
    parser.spool_max_size = len(body) + 1
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, ErrorType.INVALID_REQUEST, f"malformed multipart body: {exc.message}") from None
    files: list[tuple[str, bytes]] = []
    fields: dict[str, list[str]] = {}
    try:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                files.append((safe_filename(value.filename or ""), await value.read()))
            else:
                fields.setdefault(key, []).append(value)
    finally:
        await form.close()
    return files, fields


async def multipart_files(request: Request, body: bytes) -> list[tuple[str, bytes]]:
    """(filename, bytes) of every file part, in order; 400 when there is none."""
    files, _ = await multipart_form(request, body)
    if not files:
        raise ApiError(400, ErrorType.EMPTY_BODY, "multipart body has no file parts")
    return files


def safe_filename(name: str, limit: int = 64) -> str:
    """A client's filename as it may appear in a message: no control, format (bidi) or separator characters."""
    cleaned = "".join("?" if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in name)
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."


def render_embeddings(embeddings: np.ndarray, model: str, encoding_format: str, texts: int = 0) -> Response:
    """The contract's embeddings answer; rows are text embeddings when `texts` counts them."""
    rows: Sequence[Any]
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in embeddings]
    else:
        rows = embeddings.astype(np.float32).tolist()
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "model": model,
        "usage": ({"images": 0, "texts": texts, "prompt_tokens": 0, "total_tokens": 0} if texts
                  else {"images": len(rows), "prompt_tokens": 0, "total_tokens": 0}),
    }
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")
