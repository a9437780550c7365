"""The service's own failures: a type and a message meant for the client.

Raised by every room (text limits, scheduling, inference); only the HTTP room
(service/http/errors.py) knows which status, headers and body each type becomes, so nothing here
imports a web framework.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request"
    UNSUPPORTED_LANGUAGE_PAIR = "unsupported_language_pair"
    INPUT_TOO_LONG = "input_too_long"
    INVALID_DOCUMENT = "invalid_document"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    DOCUMENT_NOT_READY = "document_not_ready"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    QUEUE_FULL = "queue_full"
    # An API key over its requests per minute (429 on every API).
    RATE_LIMITED = "rate_limited"
    # An API key over its characters per day or month (429 here and on LibreTranslate's API;
    # DeepL's API answers 456 for it).
    QUOTA_EXCEEDED = "quota_exceeded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DECODING_TIMEOUT = "decoding_timeout"
    CLIENT_DISCONNECTED = "client_disconnected"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ServiceError(Exception):
    """A failure with a type and a message meant for the client."""

    def __init__(self, type: ErrorType, message: str, *, retry_after_s: int | None = None) -> None:
        """`retry_after_s`: when the same request may succeed (an API key's window has room
        again); None: the settings' retry_after_s, for the types whose answer has one."""
        super().__init__(message)
        self.type = type
        self.message = message
        self.retry_after_s = retry_after_s
