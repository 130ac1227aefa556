"""The ingress's HTTP bodies: reading one within its limit, its Content-Type, JSON request bodies,
multipart file parts, data URIs and base64 images, and the response.

What several endpoints share (serve/ingress/endpoints/); kept apart from the request path (serve/ingress/schedule.py)
so that stays about what a request costs and when; nothing here knows Ray. What comes out is image file bytes for
models/preprocess.py.
"""

import asyncio
import base64
import binascii
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
import pybase64
from fastapi import Request, Response
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from siglip_serve.core import lanes
from siglip_serve.core.front_door import CLIENT_SEND_TIMEOUT_S
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.preprocess import ImageLimits, check_file_size
from siglip_serve.serve.http.embed_request import URLSAFE_TO_STD
from siglip_serve.serve.http.embedding_output import encode_rows
from siglip_serve.serve.http.errors import ApiError, ErrorType, describe_validation, error_response, rejection_error

# Ray Serve's proxy parses headers with httptools and no limits (docs/http-api.md, Front-end
# limits); the application refuses what no client needs: nginx's default buffers hold 32 KiB.
MAX_HEADER_COUNT = 100
MAX_HEADER_BYTES = 64 * 1024

# A body over max_body_bytes is read and thrown away up to this much more before the 413 is sent:
# clients that send the whole body before reading (urllib, requests) then see the 413 instead of
# a connection reset. Past it the connection is closed.
OVERSIZE_DISCARD_BYTES = 64 * 1024 * 1024

# The raw-body media types the contract names (the OpenAPI document lists these), then the
# spellings some clients send for two of them.
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp", "image/tiff",
                     "application/octet-stream")
_SUPPORTED_MEDIA_TYPES = frozenset((*IMAGE_MEDIA_TYPES, "image/jpg", "image/x-ms-bmp"))
_MEDIA_TYPES_TEXT = ", ".join(media for media in IMAGE_MEDIA_TYPES if media.startswith("image/"))


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


async def read_body(request: Request, limit: int, idle_timeout_s: float = CLIENT_SEND_TIMEOUT_S) -> bytes:
    """The body within `limit` bytes (413 past it); 408 when it stops arriving for `idle_timeout_s`
    (a body shorter than its Content-Length would otherwise hold its place until the deadline)."""
    declared = request.headers.get("content-length")
    declared_size = int(declared) if declared is not None and declared.isdigit() else None
    over = declared_size is not None and declared_size > limit
    body = bytearray()
    received = 0
    chunks = request.stream().__aiter__()
    while True:
        try:
            async with asyncio.timeout(idle_timeout_s):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise ApiError(408, ErrorType.REQUEST_TIMEOUT,
                           f"the body stopped arriving: nothing for {idle_timeout_s:g} s after {received} bytes"
                           + (f" of {declared_size}" if declared_size is not None else ""),
                           {"Connection": "close"}) from None
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


def is_multipart(request: Request) -> bool:
    return (request.headers.get("content-type") or "").lower().startswith("multipart/form-data")


def media_type_supported(content_type: str | None) -> bool:
    """For raw-bytes uploads: True for image/jpeg, image/png, image/webp, image/gif, image/bmp, image/tiff,
    image/x-ms-bmp, image/jpg and application/octet-stream (and missing); False for image/svg+xml,
    application/pdf, text/*, and everything else. Ignores parameters like '; charset=…' and case."""
    if content_type is None:
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    return not media_type or media_type in _SUPPORTED_MEDIA_TYPES


def check_image_content_type(request: Request) -> None:
    """415 for a raw image body whose Content-Type names no supported image type."""
    content_type = request.headers.get("content-type")
    if not media_type_supported(content_type):
        raise ApiError(415, ErrorType.UNSUPPORTED_MEDIA_TYPE,
                       f"content type {safe_filename(content_type or '')!r} is not a supported image type")


JsonRequest = TypeVar("JsonRequest", bound=BaseModel)


def parse_json(body: bytes, schema: type[JsonRequest]) -> JsonRequest:
    """A JSON body as `schema` (its `model` is the route's to look up: serve/ingress/ingress.py `serving`)."""
    try:
        parsed = schema.model_validate_json(body)
    except ValidationError as exc:
        raise ApiError(422, ErrorType.INVALID_REQUEST, describe_validation(exc.errors())) from None
    # The body's priority, from here on (core/lanes.py); every request model has the field (embed_request.py
    # `Priority`), each in its own place among its fields.
    lanes.demote(getattr(parsed, "priority", None))
    return parsed


async def read_json(request: Request, limit: int, schema: type[JsonRequest]) -> JsonRequest:
    """The body within `limit` bytes, as `schema`."""
    return parse_json(await read_body(request, limit), schema)


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


def file_labels(files: Sequence[tuple[str, bytes]]) -> list[str]:
    """How messages name each file part: its index, and its filename when it has one."""
    return [f"file[{i}]" + (f" ({name})" if name else "") for i, (name, _) in enumerate(files)]


def _check_size(size: int, limits: ImageLimits) -> None:
    try:
        check_file_size(size, limits)
    except ImageRejected as exc:
        raise rejection_error(exc) from None


def _invalid_base64(message: str) -> ApiError:
    return ApiError(400, ErrorType.INVALID_BASE64, message)


def decode_base64_image(item: str, limits: ImageLimits = ImageLimits()) -> bytes:
    """A data URI or bare base64 -> the image file's bytes. Raises ApiError (400 invalid_base64, 413, 415)."""
    if not isinstance(item, str):
        raise _invalid_base64("image must be a base64 string or data URI")
    payload = item.strip()
    if payload[:5].lower() == "data:":
        header, comma, payload = payload[5:].partition(",")
        if not comma:
            raise _invalid_base64("data URI has no ',' before its data")
        params = [p.strip().lower() for p in header.split(";")]
        media_type = params[0]
        # An empty media type is tolerated (clients build "data:;base64,..." too).
        if media_type and not media_type_supported(media_type):
            raise ApiError(415, ErrorType.UNSUPPORTED_MEDIA_TYPE,
                           f"unsupported media type '{safe_filename(media_type)}' in data URI; "
                           f"supported: {_MEDIA_TYPES_TEXT}")
        if "base64" not in params[1:]:
            raise _invalid_base64("data URI is not base64-encoded (missing ';base64')")

    # Cheap bound on the raw text first; whitespace can inflate it, so only a failing
    # item pays for the exact count.
    if len(payload) * 3 // 4 <= limits.max_bytes and (data := _canonical_base64(payload)) is not None:
        _check_size(len(data), limits)
        return data
    if len(payload) * 3 // 4 > limits.max_bytes:
        payload = "".join(payload.split())
        _check_size(len(payload.rstrip("=")) * 3 // 4, limits)
    compact = "".join(payload.split()).translate(URLSAFE_TO_STD).rstrip("=")
    if not compact:
        raise _invalid_base64("base64 image data is empty")
    if len(compact) % 4 == 1:
        raise _invalid_base64("base64 data has an impossible length (truncated?)")
    # Padding is optional in practice (url-safe encoders drop it), so re-pad ourselves.
    compact += "=" * (-len(compact) % 4)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid_base64("image is not valid base64") from None
    _check_size(len(data), limits)
    return data


def _canonical_base64(payload: str) -> bytes | None:
    """Standard, padded base64 without whitespace (what nearly every client sends), decoded and checked
    by pybase64's SIMD decoder; None for anything else, which the tolerant path then reads or refuses
    with its reason. Measured on a 40 KB image: 2.7 us here, 120 us in binascii, 234 us on the
    tolerant path (whitespace split, translate, regex validation)."""
    try:
        return pybase64.b64decode(payload, validate=True) if payload else None
    except (ValueError, binascii.Error):  # non-ASCII text, or not canonical base64
        return None


def safe_filename(name: str, limit: int = 64) -> str:
    """A client's filename as it may appear in a message: no control, format (bidi) or separator characters."""
    cleaned = "".join("?" if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in name)
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."


def render_embeddings(embeddings: np.ndarray, model: str, encoding: str, images: int, texts: int = 0,
                      read_as: Sequence[str] | None = None) -> Response:
    """The contract's embeddings answer, rows in input order (serve/http/embedding_output.py encodes them).

    Floats are written by orjson straight from the float32 array, each as the shortest text that reads
    back to the same float32 (json's tolist() path wrote float64 digits: 30x the CPU, twice the bytes;
    546 vs 19 us for one 1152-dim SO400M embedding, measured)."""
    rows, scales = encode_rows(embeddings, encoding)
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    if scales is not None:
        for item, scale in zip(data, scales, strict=True):
            item["scale"] = scale
    usage: dict[str, Any] = {"images": images, "texts": texts, "prompt_tokens": 0, "total_tokens": 0}
    if read_as is not None:
        usage["read_as"] = list(read_as)
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")
