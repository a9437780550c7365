"""HTTP plumbing the routers share: the runtime and API-key dependencies, reading a JSON body,
answering only while the client is connected, and the metrics, draining, body-size and
security-header middlewares."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar
from urllib.parse import parse_qsl

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter, Histogram
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorType, ServiceError
from service.http.connections import DISCONNECTED
from service.http.errors import ErrorRenderer, describe_validation_errors
from service.keys.store import ApiKey
from service.metrics import Metrics
from service.scheduling.runtime import DetectedTranslation, Runtime
from service.text.detect import Candidate
from service.text.pipeline import Form
from service.text.placeholders import Protection
from service.text.terms import Terms

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

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


XApiKey = Annotated[str | None, Security(_api_key_header)]
BearerToken = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


async def presented_key(header_key: XApiKey, bearer: BearerToken) -> str | None:
    """The API key from `X-API-Key: KEY` or `Authorization: Bearer KEY`."""
    key = header_key if header_key is not None else bearer.credentials if bearer else None
    return None if key is None else utf8_header(key)


def utf8_header(value: str) -> str:
    """A header value as the UTF-8 the client sent (HTTP hands header bytes over as Latin-1),
    so that a non-ASCII key matches the same key sent in a body."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


PresentedKey = Annotated[str | None, Depends(presented_key)]


async def check_api_key(runtime: Runtime, key: str | None, request: Request) -> ApiKey | None:
    """The stored key (service/keys/) the request presents, whose limits it is counted
    against; None: a static key (api_keys), or none needed. Else 401."""
    return await runtime.access.authenticate(key, request.headers.get("origin"))


@dataclass(frozen=True, slots=True)
class Client:
    """Who calls: the runtime that answers, the API key presented (None: none) and the stored
    key whose limits the request counts against (None: a static key, or no limits)."""

    runtime: Runtime
    key: str | None
    stored: ApiKey | None


async def identify(request: Request, header_key: XApiKey, bearer: BearerToken) -> Client:
    """The caller, 401 for a key refused. One dependency over the two key schemes, not three
    (runtime, key, stored key): FastAPI walks a dependency's whole tree on every request, the
    parts it has already solved included, and the three cost /translate nine walks, some
    55 us, a sixth of the event loop's time for a cached request."""
    runtime = await get_runtime(request)
    key = await presented_key(header_key, bearer)
    return Client(runtime, key, await check_api_key(runtime, key, request))


Caller = Annotated[Client, Depends(identify)]


# The routes that carry translations (/translate, LibreTranslate's and DeepL's) solve no FastAPI
# dependency: FastAPI walks a route's dependency tree on every request (0.165: some 10 us a
# walk, 32 of the 258 us a cached /translate costs the event loop with Caller's three). They
# read the caller or the key themselves with the same scheme objects, and state the schemes to
# OpenAPI with KEYED.
KEYED: dict[str, Any] = {"security": [{"APIKeyHeader": []}, {"HTTPBearer": []}]}


async def request_key(request: Request) -> str | None:
    """`presented_key`, read by a route itself."""
    return await presented_key(await _api_key_header(request), await _bearer(request))


async def caller_of(request: Request) -> Client:
    """`identify`, called by a route itself."""
    return await identify(request, await _api_key_header(request), await _bearer(request))


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a ServiceError (never a 500) for anything else:
    not UTF-8, not JSON, NaN or Infinity (not JSON either), nested deeper than the parser's
    recursion limit (about 1,000 levels: a pathological body costs microseconds), not an
    object, or holding a lone surrogate (an escape such as \\ud800: not text)."""
    body = await request.body()
    try:
        # Decoded here (a leading byte order mark allowed): json.loads would take UTF-16 and
        # UTF-32 bytes as well.
        data = json.loads(body.decode("utf-8-sig"), parse_constant=_no_constant)
    except RecursionError:
        raise ServiceError(
            ErrorType.INVALID_REQUEST, "the JSON body is nested too deeply"
        ) from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError among them
        raise ServiceError(ErrorType.INVALID_REQUEST, f"the body is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ServiceError(ErrorType.INVALID_REQUEST, "the JSON body must be an object")
    check_text(data)
    return data


async def read_json_or_refuse(
    request: Request, runtime: Runtime, header_key: str | None
) -> dict[str, Any]:
    """`read_json` for a route whose key may be in the body: a body that cannot be read holds
    no key, so the header's is checked first, then the body's problem is raised (a client
    without a key learns nothing about the API)."""
    try:
        return await read_json(request)
    except ServiceError:
        await check_api_key(runtime, header_key, request)
        raise


def is_json(request: Request) -> bool:
    """Whether the client says its body is JSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type == "application/json" or content_type.endswith("+json")


async def form_items(request: Request) -> list[tuple[str, str]]:
    """The query parameters, then the form fields of the body, in order (uploaded files are
    not fields). A urlencoded body is read as UTF-8, escaped or not (`curl -d 'q=läuft'` sends
    the raw bytes, which starlette's parser would read as Latin-1), as werkzeug reads it for
    LibreTranslate and DeepL's servers read theirs."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/x-www-form-urlencoded":
        body = (await request.body()).decode("utf-8", errors="replace")
        form: list[tuple[str, Any]] = parse_qsl(body, keep_blank_values=True)
    else:
        form = list((await request.form()).multi_items())
    items = [*request.query_params.multi_items(), *form]
    return [(key, value) for key, value in items if isinstance(value, str)]


def json_or_form_body(json_schema: dict[str, Any], form_schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI request body of JSON or form fields (LibreTranslate's, DeepL's), which the
    route reads by hand (`form_items`, `read_json`)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": json_schema},
                "application/x-www-form-urlencoded": {"schema": form_schema},
                "multipart/form-data": {"schema": form_schema},
            },
        }
    }


def validate(model: type[M], fields: dict[str, Any], *, strict: bool | None = None) -> M:
    """`fields` as a `model`, or a ServiceError listing every invalid field."""
    try:
        return model.model_validate(fields, strict=strict)
    except ValidationError as e:
        raise ServiceError(ErrorType.INVALID_REQUEST, describe_validation_errors(e.errors())) from e


class _Protecting(Protocol):
    placeholders: bool
    placeholder_patterns: list[str]


def protection(body: _Protecting) -> Protection | None:
    """What a request's plain text keeps byte for byte (service/text/placeholders.py): None
    when it turned placeholders off; a ServiceError for a pattern that does not compile."""
    return Protection(body.placeholder_patterns) if body.placeholders else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_text(value: object) -> None:
    """Every string in `value` (nested lists and dicts, keys included) encodes to UTF-8; else a
    ServiceError naming the first lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                bad = item[e.start].encode("utf-8", "backslashreplace").decode()
                raise ServiceError(
                    ErrorType.INVALID_REQUEST,
                    f"the request holds a lone surrogate ({bad}), which is not text",
                ) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has gone. Called after the body was read, so the next ASGI
    message is the disconnect (the server sends it when the connection drops)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`; cancel it if the client disconnects first, which drops its queued segments.
    Awaited in the request's own task, which the connection's loss cancels (connections.py's
    DISCONNECTED; a task reading the ASGI messages under another server): a request answered
    without waiting (from the cache) makes no task and no turn of the event loop."""
    lost: asyncio.Future[Any] | None = request.scope.get(DISCONNECTED)
    watcher = None
    if lost is None:
        lost = watcher = asyncio.ensure_future(_until_disconnected(request))
    task = asyncio.current_task()
    assert task is not None
    awaiting, gone = True, False

    def cancel(_: asyncio.Future[Any]) -> None:
        nonlocal gone
        if awaiting:
            gone = True
            task.cancel()

    lost.add_done_callback(cancel)
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise ServiceError(
                ErrorType.CLIENT_DISCONNECTED, "the client closed the connection"
            ) from None
        raise
    finally:
        awaiting = False
        lost.remove_done_callback(cancel)
        if watcher is not None:
            watcher.cancel()
    if gone:  # the work answered all the same: the task's count of cancellations kept exact
        task.uncancel()
    return result


async def translate_texts(
    request: Request,
    runtime: Runtime,
    texts: Sequence[str],
    source: str | None,
    target: str,
    requested: Mapping[str, Any],
    *,
    deadline: float,
    form: Form,
    terms: Terms | None = None,
) -> list[DetectedTranslation]:
    """Each text translated into `target` from `source`, or with None from its own detected
    language (Runtime.translate_detected), with the options `requested` and a glossary's
    `terms`, cancelled if the client leaves (the compatible APIs' translation). With a source,
    each text's `detected` is that source, at confidence 1."""
    if source is None:
        detecting = runtime.translate_detected(
            texts, target, requested, deadline=deadline, form=form, terms=terms
        )
        return await unless_disconnected(request, detecting)
    pair = (source, target)
    model = runtime.model(*pair)  # a pair no model serves is refused before any work
    options = runtime.decoding_options(pair, requested)
    work = runtime.translate(texts, pair, options, deadline=deadline, form=form, terms=terms)
    results = await unless_disconnected(request, work)
    return [DetectedTranslation(r, Candidate(source, 1.0), model.name, None) for r in results]


# --- Middlewares -------------------------------------------------------------------------------


class HttpMetricsMiddleware:
    """Counts every response by route and status and times it: a route by its template
    (`/models/{name}/card`); unknown paths share one label."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes
        # Each route and status's counter and timer, looked up once (the client library's
        # lookup takes a lock and checks the labels on every call).
        self._series: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self.templates = [
            (re.compile("".join(map(_template_part, re.split(r"(\{[^}]*\})", route)))), route)
            for route in sorted(routes)
            if "{" in route
        ]

    def label(self, path: str) -> str:
        if path in self.routes:
            return path
        matched = (route for pattern, route in self.templates if pattern.fullmatch(path))
        return next(matched, "other")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
            route = self.label(scope["path"])
            series = self._series.get((route, status))
            if series is None:
                series = self._series[route, status] = (
                    self.metrics.requests.labels(route, str(status)),
                    self.metrics.request_seconds.labels(route),
                )
            series[0].inc()
            series[1].observe(time.perf_counter() - start)


def _template_part(part: str) -> str:
    """A route template's part as a pattern: a parameter (`{name}`) is one path segment."""
    return "[^/]+" if part.startswith("{") else re.escape(part)


class ResponseHeadersMiddleware:
    """Headers on every answer: `X-Content-Type-Options: nosniff` (a browser never reads a JSON
    error that quotes the client's input as HTML or script), and while the service drains,
    `Connection: close`. A keep-alive client or proxy then opens a new connection for its next
    request, which the load balancer sends to a replica that is not shutting down; otherwise
    the kept connection stays pinned to this one, and gets its 503s, for as long as the
    keep-alive lasts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
                runtime: Runtime | None = getattr(scope["app"].state, "runtime", None)
                if runtime is not None and runtime.draining:
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimitMiddleware:
    """413 for a body over the limit: at once when Content-Length says so, else as soon as
    the bytes received pass it. `uploads`: paths (file uploads) with a limit of their own."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        renderer: ErrorRenderer,
        uploads: Mapping[str, int] | None = None,
    ) -> None:
        self.app, self.max_bytes, self.renderer = app, max_bytes, renderer
        self.uploads = dict(uploads or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.uploads.get(scope["path"], self.max_bytes)
        message = f"the request body is larger than the limit of {limit} bytes"
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            response = self.renderer.response(scope["path"], ErrorType.PAYLOAD_TOO_LARGE, message)
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            got = await receive()
            if got["type"] == "http.request":
                received += len(got.get("body", b""))
                if received > limit:
                    # Raised inside body parsing; the HTTPException handler answers 413.
                    raise HTTPException(413, message)
            return got

        await self.app(scope, receive_within_limit, send)


class LargeBodyGate:
    """Requests with a large body (over `threshold` bytes by Content-Length, or chunked) are let
    in one at a time, each held until its answer starts (after reading, parsing and checking
    its body: all of a refused one's work) or `hold_s` after it was let in, and the next waits
    twice as long as that took (at most `hold_s`). A flood of large bodies then gets about a
    third of the event loop, and normal requests the rest: at eight clients posting 1 MB
    bodies, a short /translate's p50 went from 5.8x to 1.5-1.6x its unloaded value
    (benchmarks/RESULTS.md). A client that trickles its body holds the others for `hold_s` at
    most. Waiting requests are not read: their clients are held back by TCP."""

    def __init__(self, app: ASGIApp, *, threshold: int, hold_s: float) -> None:
        self.app, self.threshold, self.hold_s = app, threshold, hold_s
        self._lock: asyncio.Lock | None = None  # made in the server's event loop

    def _large(self, scope: Scope) -> bool:
        if scope["type"] != "http":
            return False
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        return chunked or (declared.isdigit() and int(declared) > self.threshold)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._large(scope):
            await self.app(scope, receive, send)
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        lock, loop = self._lock, asyncio.get_running_loop()
        await lock.acquire()
        start = time.perf_counter()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                timer.cancel()
                loop.call_later(min(2 * (time.perf_counter() - start), self.hold_s), lock.release)

        timer = loop.call_later(self.hold_s, release)

        async def send_and_release(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_and_release)
        finally:
            release()
