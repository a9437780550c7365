"""GET /status and the model cards over the fake engine, in process: every field, the queue
depth while the engine is held, requests per second after requests, no key needed; and the
sliding window behind requests per second, on a fake clock."""

from __future__ import annotations

import asyncio
import threading
import urllib.parse

import httpx
import pytest

from service.http.app import create_app
from service.metrics import RequestRate
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}


async def test_status_describes_the_models_and_limits(client: httpx.AsyncClient) -> None:
    response = await client.get("/status")
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "draining": False,
        "api_key_required": False,
        "language_detection": True,
        "queue_depth": 0,
        "in_flight": 0,
        "requests_per_second": 0.0,  # the warm-up translation is not a request
        "rate_window_s": 60,
        "limits": {
            "max_texts": 128,
            "max_characters": 100_000,
            "max_segment_characters": 4000,
            "max_beam_size": 8,
            "default_beam_size": 1,
        },
        "models": [
            {
                "name": "fake-en-de",
                "source": "en",
                "sources": ["en"],
                "targets": ["de"],
                "device": "cpu",
                "provider": "FakeProvider",
                "dtype": "fp32",
                "aligns": True,
                "license": "Apache-2.0",
                "card": "models/fake-en-de/card",
                "queue_depth": 0,
            }
        ],
    }


async def test_requests_per_second_counts_answered_translations(
    client: httpx.AsyncClient,
) -> None:
    for _ in range(3):
        assert (await client.post("/translate", json={"text": "a", **EN_DE})).status_code == 200
    await client.get("/status")  # status calls are not translations
    rate = (await client.get("/status")).json()["requests_per_second"]
    # Three requests over the runtime's age so far (at least a second): at most 3 per second.
    assert 0 < rate <= 3.0


async def test_queue_depth_is_the_segments_waiting(fake: FakeModel) -> None:
    app = create_app(fast_settings(), models=[fake])
    async with running(app) as client:
        fake.gate, fake.entered = threading.Event(), threading.Event()
        try:
            busy = asyncio.ensure_future(client.post("/translate", json={"text": "a", **EN_DE}))
            await asyncio.to_thread(fake.entered.wait, 5)
            queued = asyncio.ensure_future(
                client.post("/translate", json={"text": "B\nC", **EN_DE})
            )

            await async_wait_for(lambda: app.state.runtime.batchers[fake.name].depth == 2)
            assert await depths(client) == (2, 2, 2)
        finally:
            fake.gate.set()
        assert [(await r).status_code for r in (busy, queued)] == [200, 200]
        await async_wait_for(lambda: app.state.runtime.in_flight == 0)
        assert await depths(client) == (0, 0, 0)


async def depths(client: httpx.AsyncClient) -> tuple[int, int, int]:
    """/status's queue depth, the model's, and the requests in flight."""
    status = (await client.get("/status")).json()
    return status["queue_depth"], status["models"][0]["queue_depth"], status["in_flight"]


async def test_status_and_cards_need_no_key_and_say_one_is_needed(fake: FakeModel) -> None:
    app = create_app(fast_settings(api_keys=["k"]), models=[fake])
    async with running(app) as client:
        status = await client.get("/status")
        assert status.status_code == 200 and status.json()["api_key_required"] is True
        card = await client.get("/models/fake-en-de/card")
        assert card.status_code == 200


async def test_a_model_card_is_served_as_markdown(client: httpx.AsyncClient) -> None:
    response = await client.get("/models/fake-en-de/card")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.text.startswith("# fake-en-de\n")


async def test_a_model_without_a_card_or_license_says_so(fake: FakeModel) -> None:
    fake.card, fake.license = None, None
    async with running(create_app(fast_settings(), models=[fake])) as client:
        (model,) = (await client.get("/status")).json()["models"]
        assert model["card"] is None and model["license"] is None
        response = await client.get("/models/fake-en-de/card")
        assert response.status_code == 404
        assert response.json()["error"] == {
            "type": "not_found",
            "message": "no model card for 'fake-en-de'",
        }
        assert (await client.get("/models/nobody/card")).status_code == 404


@pytest.mark.parametrize("base", ["http://test/", "http://test/mt/"])
def test_the_card_url_resolves_beside_status_under_any_prefix(base: str) -> None:
    card = "models/fake-en-de/card"  # as /status gives it
    assert urllib.parse.urljoin(f"{base}status", card) == f"{base}models/fake-en-de/card"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_is_over_the_window_or_the_age_if_younger() -> None:
    clock = FakeClock()
    rate = RequestRate(window_s=10, clock=clock)
    assert rate.per_second() == 0.0
    for _ in range(4):
        rate.record()
    assert rate.per_second() == 4.0  # younger than a second: counted over one
    clock.now += 2.0
    assert rate.per_second() == 2.0  # 4 over its 2 s of age
    clock.now += 7.0  # 9 s old
    rate.record()
    assert rate.per_second() == pytest.approx(5 / 9)
    clock.now += 1.0  # 10 s old: the whole window, which the first second has left
    assert rate.per_second() == pytest.approx(1 / 10)
    clock.now += 30.0  # a slot reused for a later second forgets its old count
    rate.record()
    assert rate.per_second() == pytest.approx(1 / 10)


def test_the_window_is_at_least_a_second() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RequestRate(window_s=0)
