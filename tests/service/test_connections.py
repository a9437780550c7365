"""service/http/connections.py in a real `python -m service` process: the head size limit, the head
and body deadlines, the connection cap, and what the server says (and logs) meanwhile."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.requests import Request

from benchmarks import servers
from service.errors import ErrorType, ServiceError
from service.http import connections
from service.http.app import create_app
from service.http.connections import Coalesced, guarded_protocol
from service.http.middleware import unless_disconnected
from service.http.server import uvicorn_config
from tests.service.helpers import (
    FakeModel,
    ServerProcess,
    fast_settings,
    server_process,
    uvicorn_thread,
    wait_for,
)

EN_DE = {"source": "en", "target": "de"}
HEAD_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 40


def metric(url: str, name: str, **labels: str) -> float:
    return servers.metric(httpx.get(f"{url}/metrics", timeout=5).text, name, **labels)


@pytest.fixture(scope="module")
def server(eos_bundle: Path) -> Iterator[ServerProcess]:
    args = [
        "--bundle", str(eos_bundle), "--intra-op-threads", "1", "--default-beam-size", "1",
        "--header-timeout-s", str(HEAD_TIMEOUT_S), "--body-timeout-s", str(HEAD_TIMEOUT_S),
        "--max-connections", str(MAX_CONNECTIONS), "--max-header-bytes", "4096",
        "--log-level", "info",
    ]  # fmt: skip
    with server_process(args) as running:
        yield running


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def test_a_head_over_the_limit_gets_400_and_is_closed(server: ServerProcess) -> None:
    before = metric(server.url, "mt_closed_connections_total", reason="bad_request")
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with pytest.raises(OSError):  # the server closes before the trickle ends
            for _ in range(64):
                sock.sendall(b"a" * 1024)
                # Meanwhile another client is answered.
                assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert read_until_closed(sock).startswith(b"HTTP/1.1 400")
    assert metric(server.url, "mt_closed_connections_total", reason="bad_request") == before + 1


def test_the_head_limit_is_exact_for_a_head_sent_at_once(server: ServerProcess) -> None:
    def status_for(header_bytes: int) -> bytes:
        # Request line (18 bytes counted: the URL) and "Host: x" (9): the rest is X-Pad's.
        pad = b"p" * (header_bytes - len(b"/health") - 9 - len(b"X-Pad") - 4)
        with connect(server) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + b"\r\n\r\n")
            return sock.recv(12)

    assert status_for(4096) == b"HTTP/1.1 200"
    assert status_for(4097) == b"HTTP/1.1 400"


def test_heads_and_bodies_that_stall_are_cut_off(server: ServerProcess) -> None:
    reasons = ("idle_timeout", "header_timeout", "body_timeout")
    before = {r: metric(server.url, "mt_closed_connections_total", reason=r) for r in reasons}
    start = time.monotonic()
    silent, half_head, half_body = connect(server), connect(server), connect(server)
    half_head.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Ty")
    half_body.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"text": '
    )
    answers = [read_until_closed(sock) for sock in (silent, half_head, half_body)]
    elapsed = time.monotonic() - start
    for sock in (silent, half_head, half_body):
        sock.close()
    assert answers[0] == b""  # nothing asked, nothing answered
    assert answers[1].startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answers[1]
    assert answers[2] == b""  # the app's answer to a vanished body is not sent
    assert elapsed < 10 * HEAD_TIMEOUT_S
    for reason in reasons:
        assert metric(server.url, "mt_closed_connections_total", reason=reason) == (
            before[reason] + 1
        ), reason
    # The request whose body stalled is counted as a client disconnect, not a server error.
    assert metric(server.url, "mt_http_requests_total", route="/translate", status="499") >= 1
    assert metric(server.url, "mt_http_requests_total", route="/translate", status="500") == 0


def test_a_kept_alive_connection_gets_a_fresh_head_deadline(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/health").status_code == 200
        time.sleep(2 * HEAD_TIMEOUT_S)  # idle between requests: the keep-alive timeout's
        assert client.get("/health").status_code == 200


def test_at_the_cap_the_longest_waiting_connection_makes_room(server: ServerProcess) -> None:
    """Connections that keep the server waiting (here: silent ones) cannot lock others out: at
    the cap, a new connection closes the one that has waited longest for its client."""
    wait_for(lambda: metric(server.url, "mt_open_connections") <= 1)
    evicted = metric(server.url, "mt_closed_connections_total", reason="evicted")
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            for _ in range(5):
                assert client.get("/health", headers={"connection": "close"}).status_code == 200
        assert read_until_closed(held[0]) == b""  # the oldest made room
        assert metric(server.url, "mt_closed_connections_total", reason="evicted") >= evicted + 1
    finally:
        for sock in held:
            sock.close()


@pytest.fixture
def busy_server() -> Iterator[tuple[int, list[str]]]:
    """uvicorn in a thread with the guarded protocol (cap 3, 0.5 s body and send timeouts) over
    an app whose /slow takes 2 s, /early answers without reading its body and /big sends 8 MB:
    connections with a request in the app are busy, not waiting for their client. Yields the
    port and the protocol's events."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await asyncio.sleep(2)
        body = b"x" * (8 << 20) if scope["path"] == "/big" else b"ok"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    events: list[str] = []
    protocol = guarded_protocol(
        max_connections=3,
        max_header_bytes=4096,
        header_timeout_s=5,
        body_timeout_s=0.5,
        retry_after_s=7,
        on_event=events.append,
    )
    port = servers.free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    try:
        yield port, events
    finally:
        server.should_exit = True
        thread.join(10)


def open_to(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_when_every_connection_is_busy_a_new_one_gets_503(
    busy_server: tuple[int, list[str]],
) -> None:
    port, _ = busy_server
    busy = [open_to(port) for _ in range(3)]
    try:
        for sock in busy:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)  # the three requests are in the app
        with open_to(port) as extra:
            extra.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"retry-after: 7" in answer and b"its limit" in answer
        for sock in busy:  # the busy ones were not touched
            sock.settimeout(5)
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    finally:
        for sock in busy:
            sock.close()


def test_headers_and_access_log(eos_bundle: Path) -> None:
    args = ["--bundle", str(eos_bundle), "--intra-op-threads", "1", "--log-level", "info"]
    with server_process(args) as running:
        response = httpx.post(
            f"{running.url}/libretranslate/translate?api_key=s3cret-key",
            content=json.dumps({"q": "\ud800 dog", **EN_DE}),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 400
        assert "server" not in response.headers
        assert response.headers["x-content-type-options"] == "nosniff"
        response = httpx.post(f"{running.url}/translate", json={"text": "A dog.", **EN_DE})
        assert response.status_code == 200
    log = running.output()
    assert "api_key=***" in log and "s3cret-key" not in log
    assert "Traceback" not in log


def test_a_connection_answering_pipelined_requests_is_never_evicted(
    busy_server: tuple[int, list[str]],
) -> None:
    port, events = busy_server
    pipelining = open_to(port)  # the oldest connection, but busy
    pipelining.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
    time.sleep(0.2)
    silent = [open_to(port) for _ in range(2)]
    newcomers = [open_to(port) for _ in range(2)]  # each makes room: the silent ones go
    try:
        for sock in silent:
            assert read_until_closed(sock) == b""
        answers = b""
        pipelining.settimeout(10)
        while answers.count(b"HTTP/1.1 200") < 2:
            chunk = pipelining.recv(4096)
            assert chunk, answers  # not closed before both answers
            answers += chunk
        assert events.count("evicted") == 2
    finally:
        for sock in [pipelining, *silent, *newcomers]:
            sock.close()


def test_a_body_sent_after_an_early_answer_leaves_the_connection_timed(
    busy_server: tuple[int, list[str]],
) -> None:
    """/early answers before reading its body; the rest of the body arrives later. The
    connection is then idle again, with the keep-alive clock running, and can make room."""
    port, events = busy_server
    with open_to(port) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"67890")
        held = [open_to(port) for _ in range(2)]  # at the cap: the next one needs room
        try:
            with open_to(port) as newcomer:
                newcomer.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
                assert newcomer.recv(4096).startswith(b"HTTP/1.1 200")
            assert read_until_closed(sock) == b""  # the longest waiting: made room
        finally:
            for other in held:
                other.close()
    assert "evicted" in events


def test_a_pipelined_head_is_bounded_while_a_request_is_answered(
    busy_server: tuple[int, list[str]],
) -> None:
    port, events = busy_server
    with open_to(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nX-Big: ")
        time.sleep(0.1)
        with pytest.raises(OSError):
            for _ in range(64):
                sock.sendall(b"a" * 1024)
                time.sleep(0.005)
        read_until_closed(sock)
    assert "bad_request" in events


def test_a_client_that_does_not_read_its_answer_is_cut_off(
    busy_server: tuple[int, list[str]],
) -> None:
    port, events = busy_server
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    try:
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: "send_timeout" in events, 10)
    finally:
        sock.close()


def test_memory_is_handed_back_after_a_wave_of_connections(
    busy_server: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []
    monkeypatch.setattr(connections, "release_memory", trims.append)
    for _ in range(connections._TRIM_AFTER_CLOSED + 10):
        open_to(busy_server[0]).close()
    wait_for(lambda: trims == [0], 5)


def test_an_answers_head_and_body_arrive_in_one_read(server: ServerProcess) -> None:
    """uvicorn writes the head and the body in two calls: written as they come, a client
    already waiting (here, in another process than the server) reads the head alone, and a
    proxy in front is woken twice."""
    body = json.dumps({"text": "A dog runs through the grass.", **EN_DE}).encode()
    request = (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with connect(server) as sock:
        for _ in range(20):
            sock.sendall(request)
            answer = sock.recv(65536)
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), answer
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert len(rest) == length, answer  # the body came with the head
            assert json.loads(rest)["translations"]


class Recorded(asyncio.Transport):
    """What a transport was asked to do, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[bytes]]] = []
        self.closing = False

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(("writelines", list(list_of_data)))

    def close(self) -> None:
        self.calls.append(("close", []))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", []))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


@pytest.mark.anyio
async def test_the_writes_of_one_turn_leave_together_at_its_end() -> None:
    loop = asyncio.get_running_loop()
    inner = Recorded()
    transport = Coalesced(inner, loop)
    transport.write(b"head")
    transport.write(memoryview(b"body"))
    assert inner.calls == [] and transport.get_write_buffer_size() == 8
    await asyncio.sleep(0)
    assert inner.calls == [("writelines", [b"head", b"body"])]
    transport.write(b"next")  # another turn, another call
    await asyncio.sleep(0)
    assert inner.calls[1:] == [("writelines", [b"next"])]


@pytest.mark.anyio
async def test_a_close_sends_what_is_held_first_and_an_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    closed, aborted = Recorded(), Recorded()
    for inner in (closed, aborted):
        transport = Coalesced(inner, loop)
        transport.write(b"answer")
        transport.close() if inner is closed else transport.abort()
        await asyncio.sleep(0)  # the end of the turn sends nothing more
    assert closed.calls == [("writelines", [b"answer"]), ("close", [])]
    assert aborted.calls == [("abort", [])]


@pytest.mark.anyio
async def test_a_large_write_is_not_held() -> None:
    inner = Recorded()
    transport = Coalesced(inner, asyncio.get_running_loop())
    transport.write(b"head")
    transport.write(b"x" * connections._COALESCE_BYTES)
    assert inner.calls == [("writelines", [b"head", b"x" * connections._COALESCE_BYTES])]
    await asyncio.sleep(0)
    assert len(inner.calls) == 1


def test_a_cached_answer_costs_no_task_beyond_the_servers_own() -> None:
    """unless_disconnected awaits a request's work in the request's own task, which the
    connection's loss cancels (DISCONNECTED): a request answered from the cache makes no task
    of its own, where a task for the work and one watching the connection cost a cached
    request about a tenth of the event loop's time. uvicorn makes one a request."""
    app = create_app(fast_settings(), models=[FakeModel()])
    made: list[int] = []

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is None:

            def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
                made.append(1)
                return asyncio.Task(coro, loop=loop, **kwargs)

            loop.set_task_factory(factory)
        await app(scope, receive, send)

    config = uvicorn_config(app, fast_settings(port=servers.free_port(), log_level="warning"))
    with uvicorn_thread(counted, config) as url, httpx.Client(base_url=url) as client:
        body = {"text": "Two dogs play.", **EN_DE}
        assert client.post("/translate", json=body).status_code == 200  # decoded, cached
        before = len(made)
        answers = [client.post("/translate", json=body) for _ in range(20)]
        assert [a.status_code for a in answers] == [200] * 20
        assert {a.json()["translations"][0]["text"] for a in answers} == {"TWO DOGS PLAY."}
        assert len(made) - before == 20


def _request_on(lost: asyncio.Future[None]) -> Request:
    """A request whose connection resolves `lost` when it is lost (as the protocol does)."""
    return Request({"type": "http", "headers": [], connections.DISCONNECTED: lost})


@pytest.mark.anyio
async def test_a_lost_connection_cancels_the_work_and_answers_client_disconnected() -> None:
    """The work is cancelled inside the request's task, its cleanup done before the error is
    raised, and the task keeps no cancellation (a later timeout in it would take it for its
    own)."""
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()
    events: list[str] = []

    async def work() -> str:
        try:
            await loop.create_future()  # a sentence waiting for the engine
        finally:
            events.append("left the queue")
        return "never"

    loop.call_later(0.01, lost.set_result, None)
    with pytest.raises(ServiceError) as raised:
        await unless_disconnected(_request_on(lost), work())
    assert raised.value.type == ErrorType.CLIENT_DISCONNECTED
    assert events == ["left the queue"]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


@pytest.mark.anyio
async def test_work_that_answers_despite_the_loss_is_returned_and_other_cancels_pass() -> None:
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()

    async def stubborn() -> str:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            return "answered"
        return "never"

    loop.call_later(0.01, lost.set_result, None)
    assert await unless_disconnected(_request_on(lost), stubborn()) == "answered"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    # A cancellation from elsewhere (a shutdown) is not taken for the client's: it propagates.
    still: asyncio.Future[None] = loop.create_future()
    inner = asyncio.ensure_future(unless_disconnected(_request_on(still), loop.create_future()))
    await asyncio.sleep(0.01)
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inner
    assert not still.done()
