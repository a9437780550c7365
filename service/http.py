"""HTTP plumbing the routers share: the runtime and API-key dependencies, answering only while
the client is connected, and the metrics, draining and body-size middlewares."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorRenderer, ErrorType, ServiceError
from service.metrics import Metrics
from service.pipeline import Runtime

T = TypeVar("T")

# --- Dependencies ------------------------------------------------------------------------------
# All `async def`: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per
# dependency per request that costs far more than these few lines.


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise ServiceError(ErrorType.UNAVAILABLE, "the service is starting")
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
_bearer = HTTPBearer(auto_error=False)


async def presented_key(
    header_key: Annotated[str | None, Security(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> str | None:
    """The API key from `X-API-Key: KEY` or `Authorization: Bearer KEY`."""
    return header_key if header_key is not None else bearer.credentials if bearer else None


PresentedKey = Annotated[str | None, Depends(presented_key)]


def check_api_key(runtime: Runtime, key: str | None) -> None:
    keys = runtime.settings.api_keys
    if not keys:
        return
    if key is None:
        raise ServiceError(ErrorType.UNAUTHORIZED, "an API key is required")
    presented = key.encode()
    # Constant time, and every key compared: the answer's timing tells nothing.
    accepted = False
    for known in keys:
        accepted |= hmac.compare_digest(known.get_secret_value().encode(), presented)
    if not accepted:
        raise ServiceError(ErrorType.UNAUTHORIZED, "invalid API key")


async def require_api_key(runtime: RuntimeDep, key: PresentedKey) -> None:
    check_api_key(runtime, key)


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has gone. Called after the body was read, so the next ASGI
    message is the disconnect (the server sends it when the connection drops)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`; cancel it if the client disconnects first, which drops its queued segments."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its segments are out of the queue before we answer
    raise ServiceError(ErrorType.CLIENT_DISCONNECTED, "the client closed the connection")


# --- Middlewares -------------------------------------------------------------------------------


class HttpMetricsMiddleware:
    """Counts every response by route and status and times it; unknown paths share one label."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = 500  # if the app fails before answering, the server answers 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)


class CloseWhenDrainingMiddleware:
    """While the service drains, every answer says `Connection: close`. A keep-alive client or
    proxy then opens a new connection for its next request, which the load balancer sends to a
    replica that is not shutting down; otherwise the kept connection stays pinned to this one,
    and gets its 503s, for as long as the keep-alive lasts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                runtime: Runtime | None = getattr(scope["app"].state, "runtime", None)
                if runtime is not None and runtime.draining:
                    headers = [*message.get("headers", []), (b"connection", b"close")]
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing)


class BodyLimitMiddleware:
    """413 for a body over the limit: at once when Content-Length says so, else as soon as
    the bytes received pass it."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, renderer: ErrorRenderer) -> None:
        self.app, self.max_bytes, self.renderer = app, max_bytes, renderer
        self.message = f"the request body is larger than the limit of {max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = self.renderer.response(
                scope["path"], ErrorType.PAYLOAD_TOO_LARGE, self.message
            )
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside body parsing; the HTTPException handler answers 413.
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, receive_within_limit, send)
