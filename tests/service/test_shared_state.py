"""Glossaries and document jobs in Redis (`redis_url`): what one replica stores, another
serves; Redis down answers their calls 503 with Retry-After while translations without them go
on. Two apps over one real redis-server (tests/conftest.py's `redis_url`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI

from benchmarks.servers import RedisServer, metric, service
from service.http.app import create_app
from service.settings import Settings
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio
SHOP = {"name": "shop", "source": "en", "target": "de"}
TEXT = b"Two dogs.\n"
# Short leases, retries and timeouts: a replica gone is replaced within about a second.
SHORT = {"document_lease_s": 1.0, "redis_timeout_s": 0.2, "redis_retry_s": 0.3}


def replica_settings(redis_url: str) -> Settings:
    return fast_settings(redis_url=redis_url, **SHORT)


async def upload(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post(
        "/documents", files={"file": ("a.txt", TEXT)}, data={"source": "en", "target": "de"}
    )


async def finished(client: httpx.AsyncClient, id: str, within_s: float = 8) -> dict[str, Any]:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        answer = await client.get(f"/documents/{id}")
        if answer.status_code == 200 and answer.json()["status"] in ("done", "error"):
            status: dict[str, Any] = answer.json()
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"document {id} not finished in {within_s} s: {answer.text}")


async def taken(client: httpx.AsyncClient, held: FakeModel) -> tuple[str, threading.Event]:
    """A document sent to `client`'s replica, whose model (`held`) holds its translation until
    the event returned is set."""
    gate = held.gate = threading.Event()
    held.entered.clear()
    sent = await upload(client)
    assert sent.status_code == 202
    await async_wait_for(held.entered.is_set)
    return sent.json()["id"], gate


async def test_a_glossary_made_on_one_replica_is_used_by_another(redis_url: str) -> None:
    settings = fast_settings(redis_url=redis_url)
    one, two = FakeModel(), FakeModel()
    async with (
        running(create_app(settings, models=[one])) as first,
        running(create_app(settings, models=[two])) as second,
    ):
        made = await first.post("/glossaries", json={**SHOP, "entries": "bike\tRAD"})
        assert made.status_code == 201
        id = made.json()["glossary_id"]
        listed = (await second.get("/glossaries")).json()["glossaries"]
        assert [g["glossary_id"] for g in listed] == [id]
        body = {"text": "a bike", "source": "en", "target": "de", "glossary_id": id}
        assert (await second.post("/translate", json=body)).status_code == 200
        assert [c.terms for c in two.constraints[-1] if c.terms] == [(tuple(map(ord, "RAD")),)]
        assert (await second.delete(f"/glossaries/{id}")).status_code == 204
        assert (await first.get(f"/glossaries/{id}")).status_code == 404
        assert (await first.get("/glossaries")).json()["glossaries"] == []


async def test_glossary_calls_answer_503_while_redis_is_down(
    redis_server: RedisServer, redis_url: str
) -> None:
    settings = fast_settings(redis_url=redis_url, redis_timeout_s=0.2, redis_retry_s=0.3)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        made = (await client.post("/glossaries", json={**SHOP, "entries": "bike\tRAD"})).json()
        body = {"text": "a bike", "source": "en", "target": "de"}
        redis_server.stop()
        try:
            calls = [
                client.post("/glossaries", json={**SHOP, "entries": "dog\tHund"}),
                client.get("/glossaries"),
                client.get(f"/glossaries/{made['glossary_id']}"),
                client.post("/translate", json={**body, "glossary_id": made["glossary_id"]}),
            ]
            for call in calls:
                answer = await call
                assert answer.status_code == 503, answer.text
                assert int(answer.headers["retry-after"]) > 0
            assert (await client.post("/translate", json=body)).status_code == 200
        finally:
            redis_server.start()
        await asyncio.sleep(0.35)  # the breaker's redis_retry_s
        again = await client.get(f"/glossaries/{made['glossary_id']}")
        assert again.status_code == 200  # Redis's persistence kept it


async def test_a_document_sent_to_one_replica_is_polled_and_downloaded_from_another(
    redis_url: str,
) -> None:
    settings = replica_settings(redis_url)
    async with (
        running(create_app(settings, models=[FakeModel()])) as first,
        running(create_app(settings, models=[FakeModel()])) as second,
    ):
        sent = await upload(first)
        assert sent.status_code == 202
        id = sent.json()["id"]
        assert (await finished(second, id))["status"] == "done"
        result = await second.get(f"/documents/{id}/result")
        assert result.content == b"TWO DOGS.\n"
        assert result.headers["content-disposition"] == 'attachment; filename="a.de.txt"'
        assert (await first.delete(f"/documents/{id}")).status_code == 204
        assert (await second.get(f"/documents/{id}")).status_code == 404


@contextlib.asynccontextmanager
async def one_holding_a_job(redis_url: str) -> AsyncIterator[Replicas]:
    """Two replicas; the first translates a document, held (`taken`) until the block ends."""
    settings = replica_settings(redis_url)
    held = FakeModel()
    app = create_app(settings, models=[held])
    async with running(app) as first:
        id, gate = await taken(first, held)
        try:
            async with running(create_app(settings, models=[FakeModel()])) as second:
                yield Replicas(app, first, second, id, gate)
        finally:
            gate.set()


@dataclasses.dataclass
class Replicas:
    app: FastAPI  # the first's
    first: httpx.AsyncClient
    second: httpx.AsyncClient
    id: str  # the document the first translates
    gate: threading.Event  # holds its translation until set


async def test_a_job_deleted_through_another_replica_stops_where_it_is_translated(
    redis_url: str,
) -> None:
    async with one_holding_a_job(redis_url) as replicas:
        assert (await replicas.second.delete(f"/documents/{replicas.id}")).status_code == 204
        # Its lease is gone with it: the next renewal stops the translation.
        await async_wait_for(lambda: not replicas.app.state.documents._running, timeout=3)
        assert (await replicas.first.get(f"/documents/{replicas.id}")).status_code == 404


async def test_the_job_of_a_replica_that_stops_is_finished_by_another(redis_url: str) -> None:
    """A graceful stop hands the job in translation back at once (queued again)."""
    settings = replica_settings(redis_url)
    held = FakeModel()
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(running(create_app(settings, models=[held])))
        id, gate = await taken(first, held)
        async with running(create_app(settings, models=[FakeModel()])) as second:
            assert (await second.get(f"/documents/{id}")).json()["status"] == "translating"
            threading.Timer(0.3, gate.set).start()  # the held decode ends after the stop
            await stack.aclose()  # the first replica stops with the job in hand
            status = await finished(second, id)
            assert status["status"] == "done"
            assert (await second.get(f"/documents/{id}/result")).content == b"TWO DOGS.\n"


async def test_a_job_whose_lease_expires_is_taken_over(redis_url: str) -> None:
    """A replica that dies stops renewing its job's lease. Here the lease is taken from it in
    Redis and its document workers end without a word (a crash leaves Redis so), and another
    replica takes the job up once the lease expires."""
    async with one_holding_a_job(redis_url) as replicas:
        id, second = replicas.id, replicas.second
        await asyncio.sleep(SHORT["document_lease_s"])  # the lease is renewed meanwhile
        assert (await second.get(f"/documents/{id}")).json()["status"] == "translating"
        with redis.Redis.from_url(redis_url) as client:
            assert client.set(f"mt:document:{id}:lease", "a dead replica", px=300, xx=True)
        workers = replicas.app.state.documents._tasks
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        assert (await second.get(f"/documents/{id}")).json()["status"] == "translating"
        status = await finished(second, id)
        assert status["status"] == "done" and not replicas.gate.is_set()
        assert (await second.get(f"/documents/{id}/result")).content == b"TWO DOGS.\n"


async def test_document_calls_answer_503_while_redis_is_down_and_the_job_finishes_after(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Redis stops while a job is translated: uploads, status and results answer 503 with
    Retry-After; the result the worker could not store is made again once Redis is back."""
    settings = replica_settings(redis_url)
    fake = FakeModel()
    async with running(create_app(settings, models=[fake])) as client:
        id, gate = await taken(client, fake)
        redis_server.stop()
        try:
            for answer in [
                await upload(client),
                await client.get(f"/documents/{id}"),
                await client.get(f"/documents/{id}/result"),
                await client.delete(f"/documents/{id}"),
            ]:
                assert answer.status_code == 503, answer.text
                assert int(answer.headers["retry-after"]) > 0
            gate.set()
            await asyncio.sleep(0.3)  # the translation ends, its result not stored
        finally:
            redis_server.start()
        status = await finished(client, id)
        assert status["status"] == "done"
        assert (await client.get(f"/documents/{id}/result")).content == b"TWO DOGS.\n"


async def test_a_replica_killed_mid_job_leaves_it_to_another(
    shipped_bundle: Path, redis_url: str
) -> None:
    """Two real servers of the shipped model share Redis; the one translating a document is
    killed (SIGKILL): the other takes the job up once its lease expires, and finishes it."""
    lines = [f"A man in a blue shirt is riding bike number {i}." for i in range(200)]
    flags = ["--redis-url", redis_url, "--document-lease-s", "2", "--cache"]
    with service(shipped_bundle, flags) as first, service(shipped_bundle, flags) as second:
        sent = httpx.post(
            f"{first.url}/documents",
            files={"file": ("a.txt", "\n".join(lines).encode())},
            data={"source": "en", "target": "de"},
        )
        assert sent.status_code == 202
        id = sent.json()["id"]
        status = sent.json()
        while status["status"] == "queued":
            await asyncio.sleep(0.05)
            status = httpx.get(f"{second.url}/documents/{id}").json()
        assert status["status"] == "translating", status
        first.process.kill()
        first.process.wait()
        async with httpx.AsyncClient(base_url=second.url) as client:
            status = await finished(client, id, within_s=120)
            assert status["status"] == "done"
            result = (await client.get(f"/documents/{id}/result")).text.splitlines()
            metrics = (await client.get("/metrics")).text
        assert len(result) == len(lines) and all(result)
        assert result != lines  # translated
        # The second replica took the job up where the first had started it (it observes a
        # job's time in the queue at its first start only), and finished it.
        assert metric(metrics, "mt_document_queue_seconds_count") == 0
        assert metric(metrics, "mt_documents_total", format="txt", outcome="done") == 1
