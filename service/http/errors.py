"""The one error table: every failure the service reports has a type (service/errors.py), and the
type alone decides the HTTP status, whether a Retry-After header is sent, and the metric label.

Body on the native API: `{"error": {"type": ..., "message": ...}}`. Under the LibreTranslate
prefix the body is LibreTranslate's `{"error": message}`, and the two statuses LibreTranslate
does not use become its own: 422 -> 400 and 401 -> 403.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from service.errors import ErrorType, ServiceError
from service.metrics import Metrics


@dataclass(frozen=True)
class ErrorRow:
    status: int
    retry_after: bool  # send Retry-After: the same request may succeed later
    challenge: bool = False  # send WWW-Authenticate (a 401: how to authenticate)


ERROR_TABLE: dict[ErrorType, ErrorRow] = {
    ErrorType.INVALID_REQUEST: ErrorRow(422, retry_after=False),
    ErrorType.UNSUPPORTED_LANGUAGE_PAIR: ErrorRow(422, retry_after=False),
    ErrorType.INPUT_TOO_LONG: ErrorRow(422, retry_after=False),
    # A file that cannot be read (broken, encrypted, entities, names outside the archive).
    ErrorType.INVALID_DOCUMENT: ErrorRow(422, retry_after=False),
    # A file of a type no document format reads, or whose content is not what its name says.
    ErrorType.UNSUPPORTED_MEDIA_TYPE: ErrorRow(415, retry_after=False),
    ErrorType.UNAUTHORIZED: ErrorRow(401, retry_after=False, challenge=True),
    ErrorType.NOT_FOUND: ErrorRow(404, retry_after=False),
    ErrorType.METHOD_NOT_ALLOWED: ErrorRow(405, retry_after=False),
    ErrorType.PAYLOAD_TOO_LARGE: ErrorRow(413, retry_after=False),
    # Written by the server itself (service/http/connections.py) when a request's head is late.
    ErrorType.REQUEST_TIMEOUT: ErrorRow(408, retry_after=False),
    ErrorType.QUEUE_FULL: ErrorRow(429, retry_after=True),
    ErrorType.DEADLINE_EXCEEDED: ErrorRow(503, retry_after=True),
    # Decoded past the deadline: the same request would take as long again, so no Retry-After.
    ErrorType.DECODING_TIMEOUT: ErrorRow(504, retry_after=False),
    ErrorType.UNAVAILABLE: ErrorRow(503, retry_after=True),
    # nginx's code: nobody reads this answer, it labels the metrics and the access log.
    ErrorType.CLIENT_DISCONNECTED: ErrorRow(499, retry_after=False),
    ErrorType.INTERNAL: ErrorRow(500, retry_after=False),
}

# Statuses LibreTranslate clients know for the same failures.
_LIBRETRANSLATE_STATUS = {422: 400, 401: 403}

# Framework HTTPExceptions (unknown path, wrong method, body over the limit) by status.
_HTTP_STATUS_TYPES = {
    404: ErrorType.NOT_FOUND,
    405: ErrorType.METHOD_NOT_ALLOWED,
    413: ErrorType.PAYLOAD_TOO_LARGE,
}


@dataclass(frozen=True)
class ErrorRenderer:
    """Turns an error into the response its path calls for, and counts it."""

    metrics: Metrics
    retry_after_s: int
    libretranslate_prefix: str

    def response(self, path: str, type: ErrorType, message: str) -> JSONResponse:
        row = ERROR_TABLE[type]
        self.metrics.rejected.labels(reason=type.value).inc()
        headers = {"Retry-After": str(self.retry_after_s)} if row.retry_after else {}
        # A message may quote the client's input, which may hold lone surrogates: written as
        # escapes, not as a failure to encode the answer.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        prefix = self.libretranslate_prefix
        if prefix and (path == prefix or path.startswith(prefix + "/")):
            status = _LIBRETRANSLATE_STATUS.get(row.status, row.status)
            return JSONResponse({"error": message}, status_code=status, headers=headers)
        if row.challenge:
            headers["WWW-Authenticate"] = 'Bearer realm="transformer-mt"'
        body = {"error": {"type": type.value, "message": message}}
        return JSONResponse(body, status_code=row.status, headers=headers)


def install_error_handlers(app: FastAPI, renderer: ErrorRenderer) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return renderer.response(request.url.path, exc.type, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = describe_validation_errors(exc.errors())
        return renderer.response(request.url.path, ErrorType.INVALID_REQUEST, message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        type = _HTTP_STATUS_TYPES.get(exc.status_code, ErrorType.INVALID_REQUEST)
        response = renderer.response(request.url.path, type, str(exc.detail))
        response.headers.update(exc.headers or {})  # a 405's Allow
        return response

    @app.exception_handler(ClientDisconnect)
    async def client_disconnect(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The body stopped arriving (the client left, or the server closed a stalled body):
        # nobody reads the answer; it labels the metrics.
        return renderer.response(
            request.url.path, ErrorType.CLIENT_DISCONNECTED, "the client closed the connection"
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this response, so the server logs the stack; the client
        # never sees it.
        return renderer.response(request.url.path, ErrorType.INTERNAL, "internal server error")


def describe_validation_errors(errors: Sequence[Any]) -> str:
    """One line from pydantic's error list: `field: problem; field: problem`."""
    parts = []
    for error in errors:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        message = str(error.get("msg", "invalid"))
        parts.append(f"{location}: {message}" if location else message)
    return "; ".join(parts) or "invalid request"
