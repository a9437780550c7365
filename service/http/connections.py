"""Connection-level defences that uvicorn does not have: a bound on the request head's size, a
deadline for the head, a bound on the gap between two reads of a body, and a cap on open
connections.

uvicorn's keep-alive timeout only runs between requests: a connection that sends nothing, half a
head or half a body stays open for ever, so a few thousand silent sockets exhaust the process's
file descriptors. Its httptools parser has no head size limit (and re-copies a growing header),
so one socket trickling an endless header stalls every other request. The protocol here is
uvicorn's httptools protocol (kept for its speed: h11, which has a size limit of its own, costs
7 % of /translate's throughput and 43 % of /health's; benchmarks/RESULTS.md) with:

- a head (request line and headers) over `max_header_bytes` answered 400 and closed, counted as
  its bytes arrive (a trickle is cut off at the limit) and exactly once the head is parsed;
- the head due `header_timeout_s` after the connection opens (or after the first byte of the
  next request on a kept-alive connection): else 408 and close (a connection that sent nothing
  is closed without an answer, like an idle keep-alive one);
- a body that may pause at most `body_timeout_s` between two reads (while the server itself has
  paused reading, the clock stops); else the connection is closed and the request ends as a
  client disconnect (499 in the metrics); an answer the client stops reading gets as long;
- at `max_connections`, a new connection closes the open one that has waited longest for its
  client (silent, or sending its head or body), so that connections which keep the server
  waiting cannot lock others out; only when every connection has a request the server is
  answering is the new one refused: 503 at once, then the connection lingers for a moment
  reading and dropping what the client sends, so that the client reads the 503, not a reset.

And one change of how answers are written: what a connection writes in one turn of the event
loop leaves in one system call at the end of that turn (`Coalesced`). uvicorn writes an answer's
head and its body in two calls, each a `send` of its own: two packets, and a proxy in front
(nginx) woken twice to read them; one costs 3 % less of the event loop's time for a cached
translation (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import ErrorType
from service.http.errors import ERROR_TABLE

# How long a refused connection is read (and dropped) after its 503, so that the client's request
# bytes do not make the kernel answer with a reset that would discard the 503 before it is read.
_LINGER_S = 1.0
# Refused connections lingering at once; beyond, one is dropped without an answer (each holds a
# file descriptor while it lingers).
_MAX_LINGERING = 128

# Writes of one turn held back at most this many bytes: past it, they go at once (a large body
# is not copied into one buffer, and the transport's flow control sees it).
_COALESCE_BYTES = 64 * 1024

# After this many connections have closed, freed memory is handed back to the system (glibc
# keeps what a wave of connections used: RSS stayed 12 % up after 5,000 idle sockets, 8 % with).
_TRIM_AFTER_CLOSED = 256


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where there is one."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


release_memory = _malloc_trim()

ConnectionEvent = Callable[[str], None]
"""Called with "opened" and "closed" for each connection served, and with why the server closed
or refused one: "evicted" (room made for a new one), "over_limit" (refused), "idle_timeout"
(nothing sent), "header_timeout", "body_timeout", "send_timeout" (the client stopped reading
the answer), "bad_request" (a head the parser refuses, or one over the size limit)."""


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools turns it into the 400 of a bad request."""


def _raw_response(type: ErrorType, message: str, retry_after_s: int) -> bytes:
    """A complete HTTP/1.1 response with the native API's error body and the error table's
    status, written where no request was parsed to answer through."""
    row = ERROR_TABLE[type]
    status = HTTPStatus(row.status)
    extra = f"retry-after: {retry_after_s}\r\n" if row.retry_after else ""
    body = json.dumps({"error": {"type": type.value, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "content-type: application/json\r\n"
        "x-content-type-options: nosniff\r\n"
        f"{extra}"
        "connection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class Coalesced(asyncio.Transport):
    """A connection's transport whose writes of one turn of the event loop are sent together
    at its end (`writelines`: one system call), or at once past _COALESCE_BYTES; closing sends
    them first, aborting drops them, as it drops what the transport has not sent."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self._send)
        self._held.append(data if isinstance(data, bytes) else bytes(data))
        if sum(map(len, self._held)) >= _COALESCE_BYTES:
            self._send()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def _send(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        if not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self._send()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def write_eof(self) -> None:
        self._send()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


# A request's scope key for a future that its connection resolves when it is lost: what
# middleware.unless_disconnected waits on, with no task of its own watching the connection.
DISCONNECTED = "transformer_mt.disconnected"


def guarded_protocol(
    *,
    max_connections: int,
    max_header_bytes: int,
    header_timeout_s: float,
    body_timeout_s: float,
    retry_after_s: int,
    on_event: ConnectionEvent,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with the limits above (pass it as uvicorn's `http`)."""
    refusal = _raw_response(
        ErrorType.UNAVAILABLE,
        f"the server has {max_connections} connections open, its limit; try again",
        retry_after_s,
    )
    header_timeout = _raw_response(
        ErrorType.REQUEST_TIMEOUT,
        f"the request headers did not arrive within {header_timeout_s:g} s",
        retry_after_s,
    )

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._refused = False
            self._in_head = False  # from the first byte of a request to the end of its headers
            self._in_body = False  # from there to the end of its body
            self._heads_begun = 0  # requests begun during the data being fed
            self._head_bytes = 0  # bytes of the current head received so far (see data_received)
            self._head_size = 0  # the parsed head's URL and headers
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None
            self._write_timer: asyncio.TimerHandle | None = None
            self._lost: asyncio.Future[None] = self.loop.create_future()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                if waiting:
                    oldest, _ = waiting.popitem(last=False)
                    oldest._make_room()
                else:
                    self._refuse(transport)
                    return
            super().connection_made(transport)
            # The parser's and the answers' writes alike, so that they stay in order.
            self.transport = Coalesced(transport, self.loop)
            on_event("opened")
            # A new connection owes its first head from now on.
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_late)
            self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            if self._refused:
                lingering[0] -= 1
                self.transport.close()
                return
            waiting.pop(self, None)
            on_event("closed")
            self._lost.set_result(None)
            super().connection_lost(exc)
            closed_since_trim[0] += 1
            if closed_since_trim[0] >= _TRIM_AFTER_CLOSED and release_memory is not None:
                closed_since_trim[0] = 0
                self.loop.call_later(_LINGER_S, release_memory, 0)

        def eof_received(self) -> None:
            if self._refused:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # dropped: the answer is written
            # Whether this data starts inside a head (or starts one: nothing is half-read).
            continues_head = self._in_head
            starts_head = not self._in_head and not self._in_body
            self._heads_begun = 0
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self._in_head:
                # Counted where the data is all this head's (httptools keeps a head's bytes
                # without a callback until a header is complete): exact for a head that
                # arrives on its own, at most one read short after a pipelined body.
                if (continues_head and self._heads_begun == 0) or (
                    starts_head and self._heads_begun == 1
                ):
                    self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self.send_400_response("Request head too large.")
                    return
                if self._head_timer is None:  # the next request's head: its clock starts
                    self._head_timer = self.loop.call_later(header_timeout_s, self._head_late)
            self._follow()

        # Parser callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[DISCONNECTED] = self._lost  # type: ignore[literal-required]
            self._in_head, self._heads_begun = True, self._heads_begun + 1
            self._head_bytes = self._head_size = 0

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._head_size += len(name) + len(value) + 4  # ": " and the line end

        def on_headers_complete(self) -> None:
            if self._head_size > max_header_bytes:
                raise _HeadTooLarge
            super().on_headers_complete()
            self._in_head, self._in_body = False, True
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_body = False

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def send_400_response(self, msg: str) -> None:
            self._cancel_timers()
            on_event("bad_request")
            super().send_400_response(msg)

        def pause_writing(self) -> None:
            super().pause_writing()
            # The client is not reading the answer: it gets as long as a body's pause.
            self._write_timer = self.loop.call_later(body_timeout_s, self._write_late)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _unsupported_upgrade_warning(self) -> None:
            # An Upgrade (h2c, a WebSocket) is not served: the request is answered over HTTP/1.1
            # and the connection then closed (the parser reads nothing after an upgrade), with
            # no warning per packet in the log.
            if self.cycle is not None:
                self.cycle.keep_alive = False

        def _servers_turn(self) -> bool:
            """Whether the connection waits for the server, not for its client: a request
            being answered or queued behind one, reading paused by the server, or a body not
            yet asked for (Expect: 100-continue)."""
            if self.pipeline or self.flow.read_paused:
                return True
            if self.cycle is None or self.cycle.response_complete:
                return False
            # A request in the app: while its body arrives the client's turn, unless the app
            # has not asked for it yet (Expect: 100-continue).
            return not self._in_body or self.cycle.waiting_for_100_continue

        def _follow(self) -> None:
            """Keep `waiting` (in the order in which connections began to wait for their
            clients) and the body's clock up to date."""
            servers_turn = self._servers_turn()
            if self.transport.is_closing() or servers_turn:
                waiting.pop(self, None)
            elif self not in waiting:
                waiting[self] = None
            idle = not (servers_turn or self._in_head or self._in_body or self.cycle is None)
            if idle and self.timeout_keep_alive_task is None:
                # Between requests, uvicorn's keep-alive clock runs; a body that arrived after
                # its answer (uvicorn stops that clock on any data) must not leave it stopped.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            if self._in_body:
                self._body_timer = self.loop.call_later(body_timeout_s, self._body_late)

        def _refuse(self, transport: asyncio.Transport) -> None:
            """Every connection is busy with a request the server is answering: a 503, then
            the connection lingers (reading and dropping) before it closes; past a bound on
            lingering ones, it is dropped at once."""
            self._refused = True
            self.transport = transport
            on_event("over_limit")
            lingering[0] += 1
            if lingering[0] > _MAX_LINGERING:
                transport.abort()
                return
            transport.write(refusal)
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(_LINGER_S, transport.abort)

        def _make_room(self) -> None:
            """Closed for a new connection: this one has kept the server waiting longest."""
            on_event("evicted")
            if self._in_head:
                self.transport.write(refusal)  # part of a request arrived: say why
            self._close()

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._in_head:
                # Part of a request arrived: say why it is not answered.
                on_event("header_timeout")
                self.transport.write(header_timeout)
            elif self.cycle is None:
                on_event("idle_timeout")  # a new connection that sent nothing
            else:
                return
            self._close()

        def _body_late(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or not self._in_body:
                return
            if self._servers_turn():
                self._body_timer = self.loop.call_later(body_timeout_s, self._body_late)
                return
            on_event("body_timeout")
            self._close()  # the app's receive() then reports a disconnect

        def _write_late(self) -> None:
            self._write_timer = None
            if not self.transport.is_closing():
                on_event("send_timeout")
            self.transport.abort()  # what is left unsent would keep the connection open

        def _close(self) -> None:
            """Close after what is written is sent, or at once if the client does not read."""
            self.transport.close()
            self.loop.call_later(_LINGER_S, self.transport.abort)

        def _cancel_timers(self) -> None:
            for timer in (self._head_timer, self._body_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = self._write_timer = None

    # Connections waiting for their client (for a request, the rest of its head or of its
    # body), the longest-waiting first: when all max_connections are open, the first one makes
    # room for a new connection. Those whose request the server is answering are not in it.
    waiting: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
    lingering = [0]  # refused connections not yet closed
    closed_since_trim = [0]
    return GuardedHttpToolsProtocol
