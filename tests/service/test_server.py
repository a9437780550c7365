"""`python -m service` as a real uvicorn process on 127.0.0.1 with the tiny eos bundle:
batching across connections, a client that hangs up, LibreTranslate clients' requests, and the
SIGTERM drain with requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.client
import json
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks import servers
from service.http.app import create_app
from service.http.server import DrainingServer, uvicorn_config
from tests.service.helpers import (
    FakeModel,
    ServerProcess,
    fast_settings,
    server_process,
    wait_for,
)

EN_DE = {"source": "en", "target": "de"}


def server_args(bundle: Path, *extra: str) -> list[str]:
    return ["--bundle", str(bundle), "--intra-op-threads", "1", "--default-beam-size", "1", *extra]


def metric(url: str, name: str, **labels: str) -> float:
    """A sample's value from the server's /metrics (0 when absent)."""
    return servers.metric(httpx.get(f"{url}/metrics", timeout=5).text, name, **labels)


async def post_all(url: str, bodies: list[dict[str, object]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post("/translate", json=b) for b in bodies))


@pytest.fixture(scope="module")
def server(eos_bundle: Path) -> Iterator[ServerProcess]:
    # The whole-batch scheduler with a 400 ms batching window: requests sent together are sure
    # to meet in the queue (step-level batching admits at every step: test_running.py).
    flags = ("--scheduler", "batch", "--max-wait-ms", "400")
    with server_process(server_args(eos_bundle, *flags)) as running:
        yield running


def test_concurrent_clients_are_decoded_in_one_batch(server: ServerProcess) -> None:
    batches_before = metric(server.url, "mt_batch_size_segments_count")
    segments_before = metric(server.url, "mt_batch_size_segments_sum")
    bodies: list[dict[str, object]] = [
        {"text": f"A dog number {i} runs.", **EN_DE} for i in range(8)
    ]
    responses = asyncio.run(post_all(server.url, bodies))
    assert [r.status_code for r in responses] == [200] * 8
    assert metric(server.url, "mt_batch_size_segments_count") - batches_before == 1
    assert metric(server.url, "mt_batch_size_segments_sum") - segments_before == 8


def test_a_client_that_hangs_up_is_not_decoded(server: ServerProcess) -> None:
    dropped = metric(server.url, "mt_dropped_segments_total", reason="cancelled")
    segments = metric(server.url, "mt_batch_size_segments_sum")
    with pytest.raises(httpx.ReadTimeout):  # gives up inside the 400 ms window, closing the socket
        httpx.post(f"{server.url}/translate", json={"text": "Gone.", **EN_DE}, timeout=0.15)
    wait_for(lambda: metric(server.url, "mt_dropped_segments_total", reason="cancelled") > dropped)
    assert metric(server.url, "mt_batch_size_segments_sum") == segments
    answered = metric(server.url, "mt_http_requests_total", route="/translate", status="499")
    assert answered >= 1


def test_an_idle_connection_outlives_client_pools_and_proxies(server: ServerProcess) -> None:
    """One connection reused after 6 s idle: longer than uvicorn's default keep-alive (5 s),
    shorter than the idle timeouts of the pools and proxies in front (nginx upstream and AWS
    ALB: 60 s). A server that closes first loses the request sent as it closes; http.client
    never resends, so with a 5 s keep-alive the second request fails every time."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"text": "A dog runs.", **EN_DE})
    headers = {"Content-Type": "application/json"}
    try:
        connection.request("POST", "/translate", body, headers)
        first = connection.getresponse()
        assert first.status == 200 and first.getheader("connection") is None
        first.read()
        local = connection.sock.getsockname()
        time.sleep(6)
        connection.request("POST", "/translate", body, headers)
        second = connection.getresponse()
        assert second.status == 200, second.read()
        assert connection.sock.getsockname() == local  # the same connection, not a new one
    finally:
        connection.close()


def test_libretranslate_clients_work_unchanged(server: ServerProcess) -> None:
    """The requests libretranslatepy (urllib, form-encoded) and JSON clients send."""
    base = f"{server.url}/libretranslate/"
    form = urllib.parse.urlencode({"q": "A dog runs.", "source": "en", "target": "de"})
    with urllib.request.urlopen(
        urllib.request.Request(base + "translate", data=form.encode())
    ) as r:
        assert isinstance(json.loads(r.read())["translatedText"], str)
    with urllib.request.urlopen(
        urllib.request.Request(base + "languages", data=b"", method="GET")
    ) as r:
        assert json.loads(r.read()) == [
            {"code": "de", "name": "German", "targets": []},
            {"code": "en", "name": "English", "targets": ["de"]},
        ]
    with urllib.request.urlopen(urllib.request.Request(base + "detect", data=b"q=Hello")) as r:
        assert json.loads(r.read())[0]["language"] == "en"
    response = httpx.post(
        base + "translate",
        json={"q": ["A dog.", "A cat."], "source": "auto", "target": "de", "alternatives": 1},
    )
    body = response.json()
    assert len(body["translatedText"]) == 2 and len(body["alternatives"]) == 2
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]


def test_sigterm_answers_every_accepted_request_then_exits(eos_bundle: Path) -> None:
    # A 1.5 s window of the whole-batch scheduler holds the accepted requests in the queue
    # while SIGTERM arrives.
    flags = ("--scheduler", "batch", "--max-wait-ms", "1500", "--drain-timeout-s", "20")
    args = server_args(eos_bundle, *flags)
    with server_process(args) as server:
        bodies: list[dict[str, object]] = [
            {"text": [f"A man number {i} sings.", "Two dogs play."], **EN_DE} for i in range(6)
        ]

        async def scenario() -> tuple[list[httpx.Response], list[httpx.Response], float]:
            accepted = asyncio.ensure_future(post_all(server.url, bodies))
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
                while metric(server.url, "mt_in_flight_requests") < len(bodies):
                    await asyncio.sleep(0.02)
                server.terminate()
                start = time.monotonic()
                await asyncio.sleep(0.2)
                during = [
                    await client.get("/ready"),
                    await client.post("/translate", json={"text": "Late.", **EN_DE}),
                ]
            return await accepted, during, start

        responses, during, start = asyncio.run(scenario())
        assert [r.status_code for r in during] == [503, 503]
        # Keep-alive clients and proxies are told to reconnect (elsewhere) for the next request.
        assert all(r.headers["connection"] == "close" for r in [*during, *responses])
        assert [r.status_code for r in responses] == [200] * len(bodies)  # none lost
        assert all(len(r.json()["translations"]) == 2 for r in responses)
        assert server.process.wait(20) == 0
        assert time.monotonic() - start < 20
    assert "finishing accepted requests" in server.output()


def held_request(bundle: Path, drain_timeout_s: int) -> list[str]:
    """A server whose 60 s batching window keeps a short request open, so that a drain would
    last 60 s. The warm-up sentence (12 tokens) fills the 8-token budget alone: it does not
    wait."""
    return server_args(
        bundle,
        *("--scheduler", "batch", "--max-wait-ms", "60000", "--max-batch-tokens", "8"),
        *("--drain-timeout-s", str(drain_timeout_s)),
    )


def post_in_background(server: ServerProcess, answers: list[httpx.Response]) -> threading.Thread:
    def post() -> None:
        with contextlib.suppress(httpx.HTTPError):  # a forced stop drops the connection
            answer = httpx.post(f"{server.url}/translate", json={"text": "A.", **EN_DE}, timeout=90)
            answers.append(answer)

    client = threading.Thread(target=post, daemon=True)
    client.start()
    wait_for(lambda: metric(server.url, "mt_queue_depth_segments") == 1)
    return client


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_during_the_drain_stops_at_once(
    eos_bundle: Path, second: signal.Signals
) -> None:
    """The open request is not answered (SIGINT's forced exit used to answer it a plain 500)
    and the process dies of the second signal."""
    with server_process(held_request(eos_bundle, 60)) as server:
        answers: list[httpx.Response] = []
        client = post_in_background(server, answers)
        server.terminate()
        wait_for(lambda: httpx.get(f"{server.url}/ready", timeout=5).status_code == 503)
        assert server.process.poll() is None  # draining: the request is still open
        server.process.send_signal(second)
        # Hang detection, not a timing: without the fix the process waits out the 60 s window.
        assert server.process.wait(20) == -second
        client.join(20)
        assert answers == []
    assert "finishing accepted requests" in server.output()


def test_a_request_open_at_the_drain_timeout_is_answered_503(eos_bundle: Path) -> None:
    """Not cut off with uvicorn's plain-text 500 when it closes the connections: a 503 with
    Retry-After, which a proxy or client retries on another replica."""
    with server_process(held_request(eos_bundle, 2)) as server:
        answers: list[httpx.Response] = []
        client = post_in_background(server, answers)
        server.terminate()
        client.join(30)
        [answer] = answers
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "unavailable"
        assert "retry-after" in answer.headers
        assert server.process.wait(20) == 0
    assert "1 requests still open at the drain timeout" in server.output()


def test_sigint_shuts_down_without_a_traceback(eos_bundle: Path) -> None:
    with server_process(server_args(eos_bundle)) as server:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(20) == 0
    assert "Traceback" not in server.output()


def test_what_the_start_loaded_is_frozen_out_of_the_garbage_collector() -> None:
    """Once the app has started (models loaded, warmed up), the server freezes every object
    there is (gc.freeze): full collections then walk only what requests leave behind, not the
    models' objects (80 ms each with the shipped model, every ~600 cached requests). The
    runtime, which the app's start makes, is among them."""
    settings = fast_settings(port=0)
    app = create_app(settings, models=[FakeModel()])
    server = DrainingServer(uvicorn_config(app, settings), app, 5.0)

    def collected(thing: object) -> bool:
        """Whether a collection walks `thing` (it is in one of the three generations)."""
        return any(obj is thing for g in range(3) for obj in gc.get_objects(generation=g))

    async def serve() -> tuple[int, bool]:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return gc.get_freeze_count(), collected(app.state.runtime)
        finally:
            server.should_exit = True
            await serving

    gc.unfreeze()
    try:
        frozen, runtime_collected = asyncio.run(serve())
        assert frozen > 10_000 and not runtime_collected
    finally:
        gc.unfreeze()
