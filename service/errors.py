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
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    QUEUE_FULL = "queue_full"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DECODING_TIMEOUT = "decoding_timeout"
    CLIENT_DISCONNECTED = "client_disconnected"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ServiceError(Exception):
    """A failure with a type and a message meant for the client."""

    def __init__(self, type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
