"""deploy/nginx/transformer-mt.conf: its timeouts and limits agree with the service's settings
and the deployment files (the keep-alive rule, the body limit, the read timeout, the slow-client
timeouts, the request head's size), and a real nginx runs it in front of a real service, or of a
recording stand-in (benchmarks/servers.py starts it on loopback)."""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.servers import HOST, NGINX_CONF, Running, nginx, nginx_binary
from service.http.app import UPLOAD_OVERHEAD_BYTES, create_app
from service.http.middleware import BodyLimitMiddleware
from service.settings import Settings
from tests.deploy.helpers import REPO, NginxBlock, k8s_objects, load_yaml, parse_nginx
from tests.service.helpers import FakeModel, server_process


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    assert match, value
    return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[match[2]]


def size(value: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmM])?", value)
    assert match, value
    return int(match[1]) * {"k": 1024, "m": 1 << 20, None: 1}[match[2] and match[2].lower()]


@pytest.fixture(scope="module")
def conf() -> NginxBlock:
    return parse_nginx(NGINX_CONF.read_text())


def one(block: NginxBlock, name: str) -> list[str]:
    (args,) = block[name]
    return args  # type: ignore[no-any-return]


def keep_alive_values() -> dict[str, int]:
    """MT_KEEP_ALIVE_TIMEOUT_S in the service's defaults, the Deployment and the compose stack."""
    (server,) = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    (compose,) = load_yaml(REPO / "docker-compose.yml")
    return {
        "default": Settings().keep_alive_timeout_s,
        "k8s": int({e["name"]: e.get("value") for e in server["env"]}["MT_KEEP_ALIVE_TIMEOUT_S"]),
        "compose": int(compose["services"]["mt"]["environment"]["MT_KEEP_ALIVE_TIMEOUT_S"]),
    }


def test_nginx_closes_idle_upstream_connections_before_the_service(conf: NginxBlock) -> None:
    (upstream,) = conf["{upstream}"]
    assert upstream["keepalive"], "no upstream keep-alive"
    idle = seconds(one(upstream, "keepalive_timeout")[0])
    values = keep_alive_values()
    assert len(set(values.values())) == 1, values  # one value everywhere
    assert all(idle < value for value in values.values()), (idle, values)
    (server,) = conf["{server}"]
    (location,) = server["{location}"]
    # Upstream keep-alive needs HTTP/1.1 and the client's Connection header dropped.
    assert one(location, "proxy_http_version") == ["1.1"]
    assert ["Connection", '""'] in location["proxy_set_header"]


def test_body_limit_and_read_timeout_fit_the_service(conf: NginxBlock) -> None:
    (server,) = conf["{server}"]
    (location,) = server["{location}"]
    settings = Settings()
    assert size(one(server, "client_max_body_size")[0]) == settings.max_body_bytes
    assert seconds(one(location, "proxy_read_timeout")[0]) > settings.request_timeout_s
    forwarded = {args[0] for args in location["proxy_set_header"]}
    assert {"Host", "X-Forwarded-For", "X-Forwarded-Proto"} <= forwarded


def test_file_uploads_have_the_services_own_limit_on_exactly_its_upload_paths(
    conf: NginxBlock,
) -> None:
    """The paths where the service takes a document's size (BodyLimitMiddleware's uploads,
    every API on at its default prefix: each API's route that takes a file) are the upload
    location's, with that limit; nginx applies it to them and to nothing else."""
    settings = Settings()
    app = create_app(settings, models=[FakeModel()])
    (limits,) = [m.kwargs for m in app.user_middleware if m.cls is BodyLimitMiddleware]
    paths = app.openapi()["paths"]
    assert set(limits["uploads"]) == {
        "/documents",
        settings.libretranslate_prefix + "/translate_file",
        settings.deepl_prefix + "/v2/document",
    }
    (server,) = conf["{server}"]
    (location,) = server["{location}"]
    (uploads,) = location["{location}"]
    assert uploads[""][0] == "~" and one(uploads, "proxy_pass") == one(location, "proxy_pass")
    pattern = re.compile(uploads[""][1])
    assert {p for p in paths if pattern.search(p)} == set(limits["uploads"])
    assert {size(one(uploads, "client_max_body_size")[0])} == set(limits["uploads"].values())


def service_default(name: str) -> Any:
    """A field's default in service.settings.Settings."""
    field = Settings.model_fields.get(name)
    assert field is not None, f"service.settings.Settings has no {name}"
    return field.default


# Headers nginx adds to what it forwards, at most: X-Forwarded-Proto, X-Forwarded-For's ", " and
# an IPv6 address (or the whole header when the client sent none), Host when the client sent
# none.
NGINX_ADDED_HEADER_BYTES = 256


def test_slow_clients_meet_the_services_timeouts(conf: NginxBlock) -> None:
    (server,) = conf["{server}"]
    header = seconds(one(server, "client_header_timeout")[0])
    body = seconds(one(server, "client_body_timeout")[0])
    assert header == service_default("header_timeout_s")
    assert body == service_default("body_timeout_s")
    # Clients that stop reading their answer: tighter than nginx's default (60 s).
    assert 0 < seconds(one(server, "send_timeout")[0]) < 60
    assert one(server, "reset_timedout_connection") == ["on"]


def test_header_buffers_fit_the_services_limit(conf: NginxBlock) -> None:
    """nginx refuses any request head the service would: the longest head it reads, grown by its
    rewriting (CRLF for a bare LF, "a: " for "a:": 3-byte lines grow by 5/3) and by the headers
    it adds, stays within MT_MAX_HEADER_BYTES."""
    (server,) = conf["{server}"]
    limit = service_default("max_header_bytes")
    first = size(one(server, "client_header_buffer_size")[0])
    number, each = one(server, "large_client_header_buffers")
    longest = first + int(number) * size(each)
    assert first <= limit and size(each) <= limit and longest <= limit
    assert longest * 5 // 3 + NGINX_ADDED_HEADER_BYTES <= limit, longest


@pytest.fixture(scope="module")
def proxy(eos_bundle: Path) -> Iterator[Running]:
    if nginx_binary() is None:
        pytest.skip("nginx not installed (apt-get install nginx)")
    args = ["--bundle", str(eos_bundle), "--intra-op-threads", "1", "--default-beam-size", "1"]
    with server_process(args) as server, nginx(server.port) as running:
        yield running


def test_through_nginx_the_body_limit_is_the_services(proxy: Running) -> None:
    request = b'{"text": "A dog runs.", "source": "en", "target": "de"}'
    limit = Settings().max_body_bytes
    headers = {"Content-Type": "application/json"}
    # Whitespace after the JSON value: a valid request of exactly the limit.
    at_limit = request + b" " * (limit - len(request))
    response = httpx.post(f"{proxy.url}/translate", content=at_limit, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    over = at_limit + b" "
    response = httpx.post(f"{proxy.url}/translate", content=over, headers=headers, timeout=30)
    assert response.status_code == 413
    # nginx's own page (the service answers JSON): refused before reaching the service.
    assert response.headers["content-type"].startswith("text/html"), response.text


# Each API's upload path: its fields, and its status for a file of a format it does not read.
UPLOADS = {
    "/documents": ({"source": "en", "target": "de"}, 415),
    "/libretranslate/translate_file": ({"source": "en", "target": "de"}, 400),
    "/v2/document": ({"source_lang": "EN", "target_lang": "DE"}, 400),
}


def test_through_nginx_a_file_upload_has_the_documents_limit(proxy: Running) -> None:
    """A file over the 1 MiB of other bodies reaches the service on each API's upload path (its
    JSON refusal of a format it does not read, not nginx's 413); one over the documents' limit
    gets nginx's 413."""
    settings = Settings()
    over_bodies = b"x" * (2 * settings.max_body_bytes)
    for path, (fields, status) in UPLOADS.items():
        file = {"file": ("large.xyz", over_bodies)}
        response = httpx.post(f"{proxy.url}{path}", files=file, data=fields, timeout=30)
        assert response.status_code == status, (path, response.text)
        assert response.headers["content-type"] == "application/json", path
    over = b"x" * (settings.max_document_bytes + UPLOAD_OVERHEAD_BYTES)
    file = {"file": ("large.xyz", over)}
    response = httpx.post(f"{proxy.url}/documents", files=file, data=UPLOADS["/documents"][0])
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/html"), response.text


def read_answer(sock: socket.socket, timeout: float) -> bytes:
    """One answer: its head and its Content-Length body, or what the peer sends before it
    closes (or resets) the connection or `timeout` passes."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            head, blank, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            if blank and length and len(body) >= int(length[1]):
                break
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_through_nginx_a_trickled_header_is_refused(proxy: Running) -> None:
    """A header sent piece by piece, never ending: nginx refuses it once it outgrows its buffers,
    long before the service's limit, while other clients are served at once. (Its 10 s
    client_header_timeout would end it too; the size limit comes first here.)"""
    limit = service_default("max_header_bytes")
    start = time.monotonic()
    with socket.create_connection((HOST, proxy.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent, answer, served = 0, b"", False
        while time.monotonic() - start < 5:
            if select.select([sock], [], [], 0.01)[0]:
                answer = read_answer(sock, 1)
                break
            try:
                sock.sendall(b"y" * 512)
            except OSError:  # closed or reset: what it answered, if anything, is buffered
                answer = read_answer(sock, 1)
                break
            sent += 512
            if sent == 4096:  # halfway through nginx's buffers: another client is served
                began = time.monotonic()
                response = httpx.get(f"{proxy.url}/health", timeout=5)
                assert response.status_code == 200
                assert time.monotonic() - began < 1
                served = True
        else:
            pytest.fail(f"still reading the header after {sent} bytes")
    assert served and sent < limit, sent
    # nginx's own refusal (400 "Request Header Or Cookie Too Large", or 414), or just a close.
    assert answer == b"" or re.match(rb"HTTP/1\.1 (400|414|494) ", answer), answer[:200]
    assert answer == b"" or b"text/html" in answer.split(b"\r\n\r\n")[0], answer[:200]
    response = httpx.get(f"{proxy.url}/health", timeout=5)
    assert response.status_code == 200
    assert time.monotonic() - start < 5


class Recorder:
    """A stand-in for the service on 127.0.0.1 that answers every request with 200 and keeps
    the request heads it received, exactly as received."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.listener = socket.create_server((HOST, 0))
        self.port: int = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        buffer = b""
        with connection:
            while chunk := connection.recv(65536):
                buffer += chunk
                while b"\r\n\r\n" in buffer:  # no bodies: GET requests only
                    head, buffer = buffer.split(b"\r\n\r\n", 1)
                    self.heads.append(head + b"\r\n\r\n")
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@pytest.fixture(scope="module")
def recording_proxy() -> Iterator[tuple[Running, Recorder]]:
    if nginx_binary() is None:
        pytest.skip("nginx not installed (apt-get install nginx)")
    recorder = Recorder()
    try:
        with nginx(recorder.port) as running:
            yield running, recorder
    finally:
        recorder.listener.close()


def heads_to_try() -> Iterator[bytes]:
    """Request heads around nginx's limits: bare-LF 3-byte header lines (which nginx's
    rewriting grows the most), long header lines, a long request line."""
    for lines in (1000, 2000, 2900, 3000, 3050, 3100, 4000, 6000):
        yield b"GET / HTTP/1.1\nHost: x\n" + b"a:\n" * lines + b"\n"
    # Lines that just fit a buffer, after a short or a long request line: most of each buffer
    # used, and the most in all.
    for path in (b"/", b"/" + b"u" * 1000):
        for length in (1020, 4090, 8180):
            line = b"X-Big: " + b"y" * (length - 9) + b"\r\n"
            for count in range(1, 20_000 // length + 2):
                yield b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + line * count + b"\r\n"
    for length in (4000, 8100, 8200, 17_000):
        yield b"GET /" + b"u" * length + b" HTTP/1.1\r\nHost: x\r\n\r\n"


def test_nginx_forwards_no_head_the_service_would_refuse(
    recording_proxy: tuple[Running, Recorder],
) -> None:
    running, recorder = recording_proxy
    limit = service_default("max_header_bytes")
    forwarded: list[int] = []
    for head in heads_to_try():
        recorder.heads.clear()
        with socket.create_connection((HOST, running.port), timeout=5) as sock:
            sock.sendall(head)
            answer = read_answer(sock, 0.5)
        status = answer.split(b"\r\n", 1)[0]
        if status.startswith(b"HTTP/1.1 200 "):
            (received,) = recorder.heads
            forwarded.append(len(received))
            assert len(received) <= limit, (len(head), len(received))
        else:
            assert re.match(rb"HTTP/1\.1 (400|414|494) ", status), (len(head), answer[:200])
            assert recorder.heads == []
    # Not vacuous: heads of 8 KB went through.
    assert max(forwarded) >= 8000, forwarded
