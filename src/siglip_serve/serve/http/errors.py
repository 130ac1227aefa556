"""The one error contract: every error is `{"error": {"message", "type", "code"}}`, from one place.

A 500 never echoes exception text: unexpected exceptions are logged with their traceback and
answered with a fixed message. models/ raises its own typed image errors, core/texts.py its text ones,
serve/ingress/url_fetch.py its URL ones, all `Rejected` (core/errors.py); REJECTIONS below is the one place that
says what each means here (and in bulk's errors table).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from siglip_serve.core import errors as user_errors
from siglip_serve.core.errors import Rejected
from siglip_serve.core.texts import EmptyText, TextTooLong
from siglip_serve.models.image_errors import (
    CorruptImage,
    EmptyImage,
    ImageFileTooLarge,
    ImageTooLarge,
    UnsupportedImage,
)
from siglip_serve.serve.http.url_errors import UrlFetchFailed, UrlNotAllowed, UrlTimeout, UrlTooLarge

log = logging.getLogger(__name__)


class ErrorType(str, Enum):
    """The contract's error types; also the `reason` label of siglip_requests_rejected_total."""

    EMPTY_BODY = "empty_body"
    INVALID_IMAGE = "invalid_image"
    INVALID_BASE64 = "invalid_base64"
    UNAUTHORIZED = "unauthorized"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    IMAGE_TOO_LARGE = "image_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    INVALID_REQUEST = "invalid_request"
    TOO_MANY_IMAGES = "too_many_images"
    TOO_MANY_TEXTS = "too_many_texts"
    TEXT_TOO_LONG = "text_too_long"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_READY = "not_ready"
    OVERLOADED = "overloaded"
    RATE_LIMITED = "rate_limited"
    REPLICA_UNAVAILABLE = "replica_unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    REQUEST_TIMEOUT = "request_timeout"
    HEADERS_TOO_LARGE = "headers_too_large"
    URL_NOT_ALLOWED = "url_not_allowed"
    URL_FETCH_FAILED = "url_fetch_failed"
    URL_TOO_LARGE = "url_too_large"
    URL_TIMEOUT = "url_timeout"
    INTERNAL = "internal_error"


class ApiError(Exception):
    def __init__(self, status: int, error_type: ErrorType, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}


class ErrorDetail(BaseModel):
    message: str
    type: ErrorType
    code: int = Field(description="the HTTP status")


class ErrorBody(BaseModel):
    """Every error's body; the OpenAPI document publishes this model's schema for every error status."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


def error_response(error: ApiError) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(message=error.message, type=error.error_type, code=error.status))
    return JSONResponse(body.model_dump(mode="json"), status_code=error.status, headers=error.headers)


_STATUS_TYPES = {404: ErrorType.NOT_FOUND, 405: ErrorType.METHOD_NOT_ALLOWED, 413: ErrorType.PAYLOAD_TOO_LARGE}

# Each rejection of one input as (status, error type) of the contract (docs/http-api.md): models' image
# errors, core/texts.py's text ones and serve/ingress/url_fetch.py's URL ones. A failed fetch is the client's URL's
# problem: 400, as OpenAI's API answers "Error while downloading <url>" (openai/openai-python#2776). OpenAI
# answers a slow download 400 too (vercel/ai#8857); here it is 504, like the request's own deadline, so
# clients that retry gateway timeouts retry it.
REJECTIONS: dict[type[Rejected], tuple[int, ErrorType]] = {
    EmptyImage: (400, ErrorType.EMPTY_BODY),
    CorruptImage: (400, ErrorType.INVALID_IMAGE),
    UnsupportedImage: (415, ErrorType.UNSUPPORTED_MEDIA_TYPE),
    ImageTooLarge: (413, ErrorType.IMAGE_TOO_LARGE),
    ImageFileTooLarge: (413, ErrorType.PAYLOAD_TOO_LARGE),
    EmptyText: (422, ErrorType.INVALID_REQUEST),
    TextTooLong: (413, ErrorType.TEXT_TOO_LONG),
    UrlNotAllowed: (400, ErrorType.URL_NOT_ALLOWED),
    UrlFetchFailed: (400, ErrorType.URL_FETCH_FAILED),
    UrlTooLarge: (413, ErrorType.URL_TOO_LARGE),
    UrlTimeout: (504, ErrorType.URL_TIMEOUT),
}


def rejection_type(error: Rejected) -> ErrorType:
    """The contract's type of a rejection (bulk's errors table names it too)."""
    return REJECTIONS[type(error)][1]


def rejection_error(error: Rejected | ApiError, label: str = "") -> ApiError:
    """A rejected input as the contract's error; `label` says which of the request's items it was. An
    ApiError is the request's own wrapping of an image (data URI, base64), relabelled."""
    if isinstance(error, ApiError):
        status, error_type = error.status, error.error_type
    else:
        status, error_type = REJECTIONS[type(error)]
    return ApiError(status, error_type, f"{label}: {error.message}" if label else error.message)


def install_error_handlers(app: FastAPI, on_error: Callable[[ApiError], None]) -> None:
    """Route every error FastAPI can raise through `error_response`; `on_error` counts it."""

    def respond(error: ApiError) -> JSONResponse:
        on_error(error)
        return error_response(error)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(Rejected)
    async def _rejected(_: Request, exc: Rejected) -> JSONResponse:
        return respond(rejection_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(ApiError(422, ErrorType.INVALID_REQUEST, describe_validation(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = _STATUS_TYPES.get(exc.status_code, ErrorType.INVALID_REQUEST)
        message = exc.detail if isinstance(exc.detail, str) else error_type.value.replace("_", " ")
        return respond(ApiError(exc.status_code, error_type, message, dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(ApiError(500, ErrorType.INTERNAL, "internal error; see the server log"))


def describe_validation(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic errors as one line: 'input.3: Input should be a valid string; ...'."""
    return user_errors.describe_validation(errors, root="body", drop=("body",)) or "request does not match the schema"
