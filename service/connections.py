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
  client disconnect (499 in the metrics);
- at `max_connections`, a new connection closes the open one that has waited longest for its
  client (silent, or sending its head or body), so that connections which keep the server
  waiting cannot lock others out; only when every connection has a request the server is
  answering is the new one refused: 503 at once, then the connection lingers for a moment
  reading and dropping what the client sends, so that the client reads the 503, not a reset.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# How long a refused connection is read (and dropped) after its 503, so that the client's request
# bytes do not make the kernel answer with a reset that would discard the 503 before it is read.
_LINGER_S = 1.0

ConnectionEvent = Callable[[str], None]
"""Called with "opened" and "closed" for each connection served, and with why the server closed
or refused one: "evicted" (room made for a new one), "over_limit" (refused), "idle_timeout"
(nothing sent), "header_timeout", "body_timeout", "bad_request" (a head the parser refuses, or
one over the size limit)."""

# What a connection waits for: a request's head (none of it yet, or part), the rest of its body,
# or nothing from the client (the server is answering its request).
Phase = Literal["head", "body", "busy"]


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools turns it into the 400 of a bad request."""


def _raw_response(status: str, type: str, message: str, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response with the native API's error body, written where no request
    was parsed to answer through."""
    body = json.dumps({"error": {"type": type, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status}\r\n"
        "content-type: application/json\r\n"
        "x-content-type-options: nosniff\r\n"
        f"{extra}"
        "connection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


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
        "503 Service Unavailable",
        "unavailable",
        f"the server has {max_connections} connections open, its limit; try again",
        f"retry-after: {retry_after_s}\r\n",
    )
    header_timeout = _raw_response(
        "408 Request Timeout",
        "request_timeout",
        f"the request headers did not arrive within {header_timeout_s:g} s",
    )

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._refused = False
            self._phase: Phase = "head"
            self._head_bytes = 0  # bytes received of the current head, up to its end
            self._head_size = 0  # the parsed head's URL and headers
            self._header_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                if waiting:
                    oldest, _ = waiting.popitem(last=False)
                    oldest._make_room()
                else:
                    self._refuse(transport)
                    return
            super().connection_made(transport)
            on_event("opened")
            waiting[self] = None
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            if self._refused:
                self.transport.close()
                return
            waiting.pop(self, None)
            on_event("closed")
            super().connection_lost(exc)

        def eof_received(self) -> None:
            if self._refused:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # dropped: the answer is written
            in_head = self._phase == "head"
            super().data_received(data)
            if self.transport.is_closing():
                return
            if in_head and self._phase == "head":
                # Still no end of head: count what came (httptools would keep it all).
                self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self.send_400_response("Request head too large.")
                    return
            self._follow_request()

        # Parser callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_size = 0

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
            self._phase, self._head_bytes = "body", 0

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._phase = "busy"

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._phase == "busy" and not self.pipeline:
                self._phase = "head"  # answered; nothing more parsed: the next request's turn
            if not self.transport.is_closing():
                self._follow_request()

        def send_400_response(self, msg: str) -> None:
            self._cancel_timers()
            on_event("bad_request")
            super().send_400_response(msg)

        def _refuse(self, transport: asyncio.Transport) -> None:
            """Every connection is busy with a request the server is answering: a 503, then
            the connection lingers (reading and dropping) before it closes."""
            self._refused = True
            self.transport = transport
            on_event("over_limit")
            transport.write(refusal)
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(_LINGER_S, transport.close)

        def _make_room(self) -> None:
            """Closed for a new connection: this one has kept the server waiting longest."""
            on_event("evicted")
            if self._phase == "head" and self._head_bytes:
                self.transport.write(refusal)  # part of a request arrived: say why
            self.transport.close()

        def _follow_request(self) -> None:
            """Arm the timer for what the connection waits for from its client, and keep
            `waiting` in the order in which connections began to wait for their clients."""
            if self._phase == "busy":
                waiting.pop(self, None)
                self._cancel_timers()
                return
            if self not in waiting:
                waiting[self] = None
            if self._phase == "head":
                # The head's clock starts with its first byte (a fresh connection's, when it
                # opened) and is not restarted by more bytes: the deadline is for the whole head.
                if self._head_bytes and self._header_timer is None:
                    self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)
                return  # nothing of a next request yet: uvicorn's keep-alive timeout runs
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = self.loop.call_later(body_timeout_s, self._body_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self._phase != "head":
                return
            if self._head_bytes:
                # Part of a request arrived: say why it is not answered.
                on_event("header_timeout")
                self.transport.write(header_timeout)
            else:
                on_event("idle_timeout")
            self.transport.close()

        def _body_late(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or self._phase != "body":
                return
            if self.flow.read_paused:
                # The server stopped reading (the app has not consumed the body yet): not the
                # client's delay.
                self._body_timer = self.loop.call_later(body_timeout_s, self._body_late)
                return
            on_event("body_timeout")
            self.transport.close()  # the app's receive() then reports a disconnect

        def _cancel_timers(self) -> None:
            for timer in (self._header_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._body_timer = None

    # Connections waiting for their client (for a request, the rest of its head or of its
    # body), the longest-waiting first: when all max_connections are open, the first one makes
    # room for a new connection. Those whose request the server is answering are not in it.
    waiting: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
    return GuardedHttpToolsProtocol
