"""Glossaries and document jobs in Redis (`redis_url`): what one replica stores, another
serves; Redis down answers their calls 503 with Retry-After while translations without them go
on. Two apps over one real redis-server (tests/conftest.py's `redis_url`)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.servers import RedisServer
from service.http.app import create_app
from tests.service.helpers import FakeModel, fast_settings, running

pytestmark = pytest.mark.anyio
SHOP = {"name": "shop", "source": "en", "target": "de"}


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
