"""API keys with limits (service/keys/): the CLI, the key store reloaded by a running service,
and each limit counted before any work, in one process and across two sharing a real Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from benchmarks.servers import RedisServer
from service.http.app import create_app
from service.keys.__main__ import main as keys_cli
from service.settings import Settings, invalid_settings
from tests.service.helpers import FakeModel, fast_settings, running, uvicorn_thread

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}


def add_key(capsys: pytest.CaptureFixture[str], store: list[str], name: str, *limits: str) -> str:
    """`python -m service.keys add NAME LIMITS...`: the secret it printed."""
    assert keys_cli([*store, "add", name, *limits]) == 0
    return capsys.readouterr().out.rsplit(": ", 1)[1].strip()


async def run_cli(*args: str) -> int:
    """The CLI from an async test: it runs its own event loop (asyncio.run)."""
    return await asyncio.to_thread(keys_cli, list(args))


async def added(
    capsys: pytest.CaptureFixture[str], store: list[str], name: str, *limits: str
) -> str:
    return await asyncio.to_thread(add_key, capsys, store, name, *limits)


def sqlite(tmp_path: Path) -> list[str]:
    return ["--store", "sqlite", "--db", str(tmp_path / "keys.sqlite3")]


def store_settings(store: list[str], **settings: Any) -> Settings:
    """The service's settings on the key store the CLI arguments `store` name."""
    kind, where = store[1], store[3]
    values = {"key_store": kind, "keys_reload_s": 0.05, **settings}
    values["keys_db" if kind == "sqlite" else "redis_url"] = where
    return fast_settings(**values)


def app_on(store: list[str], fake: FakeModel, **settings: Any) -> Any:
    return running(create_app(store_settings(store, **settings), models=[fake]))


async def post(client: httpx.AsyncClient, secret: str | None, text: str = "Hi.") -> httpx.Response:
    headers = {} if secret is None else {"X-API-Key": secret}
    return await client.post("/translate", json={"text": text, **EN_DE}, headers=headers)


def test_the_cli_adds_lists_changes_and_removes_keys_without_storing_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = sqlite(tmp_path)
    secret = add_key(
        capsys, store, "alice", "--requests-per-minute", "5", "--origin", "https://a.example"
    )
    assert len(secret) >= 32
    assert secret.encode() not in (tmp_path / "keys.sqlite3").read_bytes()
    assert keys_cli([*store, "set", "alice", "--characters-per-day", "1000"]) == 0
    assert keys_cli([*store, "add", "bob", "--key", "chosen-secret"]) == 0
    capsys.readouterr()
    assert keys_cli([*store, "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "alice: 5 requests/minute, 1000 characters/day, unlimited characters/month; "
        "origins: https://a.example",
        "bob: unlimited requests/minute, unlimited characters/day, unlimited "
        "characters/month; origins: any",
    ]
    assert keys_cli([*store, "add", "alice"]) == 1  # the name is taken
    assert keys_cli([*store, "add", "carol", "--key", "chosen-secret"]) == 1  # and the secret
    assert keys_cli([*store, "remove", "bob"]) == 0
    assert keys_cli([*store, "remove", "bob"]) == 1
    assert keys_cli([*store, "usage", "alice"]) == 1  # counted in the service without Redis
    assert "GET /usage" in capsys.readouterr().err
    assert keys_cli(["list"]) == 1  # no store named
    assert "no key store" in capsys.readouterr().err


async def test_a_running_service_takes_keys_added_and_removed_and_keeps_static_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake: FakeModel
) -> None:
    store = sqlite(tmp_path)
    async with app_on(store, fake, api_keys="static-key") as client:
        assert (await post(client, None)).status_code == 401
        assert (await post(client, "static-key")).status_code == 200
        secret = await added(capsys, store, "alice")
        await asyncio.sleep(0.1)  # keys_reload_s
        assert (await post(client, secret)).status_code == 200
        assert (await client.get("/status")).json()["api_key_required"] is True
        assert await run_cli(*store, "remove", "alice") == 0
        await asyncio.sleep(0.1)
        response = await post(client, secret)
        assert response.status_code == 401
        assert response.json()["error"]["message"] == "invalid API key"


async def test_a_key_with_origins_is_refused_from_any_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake: FakeModel
) -> None:
    store = sqlite(tmp_path)
    secret = await added(capsys, store, "page", "--origin", "https://a.example")
    async with app_on(store, fake) as client:
        for origin, status in [("https://a.example", 200), ("https://b.example", 401)]:
            response = await client.post(
                "/translate",
                json={"text": "Hi.", **EN_DE},
                headers={"X-API-Key": secret, "Origin": origin},
            )
            assert response.status_code == status, origin


async def test_concurrent_clients_of_a_key_get_exactly_its_requests_per_minute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake: FakeModel
) -> None:
    store = sqlite(tmp_path)
    limit, clients = 4, 12
    secret = await added(capsys, store, "busy", "--requests-per-minute", str(limit))
    async with app_on(store, fake) as client:
        fake.calls.clear()
        answers = await asyncio.gather(
            *(post(client, secret, f"Text {i}.") for i in range(clients))
        )
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * limit + [429] * (clients - limit)
        refused = [r for r in answers if r.status_code == 429]
        assert {r.json()["error"]["type"] for r in refused} == {"rate_limited"}
        assert all(55 <= int(r.headers["Retry-After"]) <= 60 for r in refused)
        # The refused ones did no work.
        assert sum(len(sources) for sources, _ in fake.calls) == limit
        # LibreTranslate's API: its 429 and error shape.
        response = await client.post(
            "/libretranslate/translate", json={"q": "Hi.", **EN_DE, "api_key": secret}
        )
        assert response.status_code == 429 and "requests per minute" in response.json()["error"]
        usage = (await client.get("/usage", headers={"X-API-Key": secret})).json()
        assert usage["requests_per_minute"] == {"used": limit, "limit": limit, "window_s": 60}


async def test_characters_are_charged_before_any_work_and_only_when_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake: FakeModel
) -> None:
    store = sqlite(tmp_path)
    secret = await added(capsys, store, "small", "--characters-per-day", "20")
    async with app_on(store, fake) as client:
        fake.calls.clear()
        assert (await post(client, secret, "Fifteen chars.!")).status_code == 200
        response = await post(client, secret, "Ten chars.")
        assert response.status_code == 429
        assert response.json()["error"]["type"] == "quota_exceeded"
        assert 1 <= int(response.headers["Retry-After"]) <= 86400
        assert (await post(client, secret, "Five.")).status_code == 200  # 20: at the limit
        assert sum(len(sources) for sources, _ in fake.calls) == 2
        usage = (await client.get("/usage", headers={"X-API-Key": secret})).json()
        assert usage == {
            "name": "small",
            "requests_per_minute": None,
            "characters_per_day": {"used": 20, "limit": 20, "window_s": 86400},
            "characters_per_month": {"used": 20, "limit": None, "window_s": 2592000},
        }
        text = (await client.get("/metrics")).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        [sample] = families["mt_quota_rejections"].samples
        assert sample.labels == {"limit": "characters_per_day"} and sample.value == 1


async def test_a_documents_characters_are_charged_when_it_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake: FakeModel
) -> None:
    """A document pays for its text when it is sent, as a request does: one over the key's
    quota is refused (429) before it is queued, natively and through LibreTranslate's
    /translate_file."""
    store = sqlite(tmp_path)
    secret = await added(capsys, store, "docs", "--characters-per-day", "30")
    headers = {"X-API-Key": secret}
    text = "A dog runs.\nA cat sleeps.\n"  # 26 characters of text, two paragraphs
    async with app_on(store, fake) as client:
        files = {"file": ("a.txt", text.encode(), "text/plain")}
        sent = await client.post("/documents", data=EN_DE, files=files, headers=headers)
        assert sent.status_code == 202, sent.text
        again = await client.post("/documents", data=EN_DE, files=files, headers=headers)
        assert again.status_code == 429 and again.json()["error"]["type"] == "quota_exceeded"
        form = {**EN_DE, "api_key": secret}
        libre = await client.post("/libretranslate/translate_file", data=form, files=files)
        assert libre.status_code == 429, libre.text


async def test_usage_needs_a_stored_key(fake: FakeModel) -> None:
    async with running(create_app(fast_settings(api_keys="static"), models=[fake])) as client:
        response = await client.get("/usage", headers={"X-API-Key": "static"})
        assert response.status_code == 404
        assert (await client.get("/usage")).status_code == 401


async def test_two_instances_sharing_redis_count_one_limit_and_agree_on_usage(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", "redis", "--redis-url", redis_url]
    limit, clients = 5, 16
    secret = await added(capsys, store, "shared", "--requests-per-minute", str(limit))
    one, two = FakeModel(), FakeModel()
    # A Redis call past its timeout fails open (serves): not in this test, on a loaded machine.
    patient = {"redis_timeout_s": 5.0}
    async with app_on(store, one, **patient) as first, app_on(store, two, **patient) as second:
        answers = await asyncio.gather(
            *(post((first, second)[i % 2], secret, f"Text {i}.") for i in range(clients))
        )
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * limit + [429] * (clients - limit)
        usages = [
            (await c.get("/usage", headers={"X-API-Key": secret})).json() for c in (first, second)
        ]
        assert usages[0] == usages[1]
        assert usages[0]["requests_per_minute"]["used"] == limit
        assert usages[0]["characters_per_day"]["used"] == sum(
            len(f"Text {i}.") for i, r in enumerate(answers) if r.status_code == 200
        )
    assert await run_cli(*store, "usage", "shared") == 0
    assert f"requests per minute: {limit} of {limit}" in capsys.readouterr().out


async def test_concurrent_clients_of_a_key_get_exactly_its_characters(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Many requests of one key at once, each within the key's characters but not all of them:
    exactly as many as fit are served (each charge checks and counts in one step in Redis; a
    check, then a count, let every request that checked before any counted through)."""
    store = ["--store", "redis", "--redis-url", redis_url]
    secret = await added(capsys, store, "chars", "--characters-per-day", "100")
    fake = FakeModel()
    async with app_on(store, fake, redis_timeout_s=5.0) as client:  # never failing open here
        answers = await asyncio.gather(*(post(client, secret, "Ten chars.") for _ in range(30)))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * 10 + [429] * 20
        usage = (await client.get("/usage", headers={"X-API-Key": secret})).json()
        assert usage["characters_per_day"]["used"] == 100
        assert usage["characters_per_month"]["used"] == 100


@pytest.mark.parametrize("fail_open", [True, False])
async def test_quotas_fail_open_or_closed_while_redis_is_down(
    redis_server: RedisServer,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    fail_open: bool,
) -> None:
    store = ["--store", "redis", "--redis-url", redis_url]
    secret = await added(capsys, store, "k", "--requests-per-minute", "100")
    fake = FakeModel()
    settings = {"quota_fail_open": fail_open, "redis_timeout_s": 0.2, "redis_retry_s": 0.2}
    async with app_on(store, fake, **settings) as client:
        assert (await post(client, secret)).status_code == 200  # the keys are loaded
        redis_server.stop()
        try:
            response = await post(client, secret, "While Redis is down.")
            assert response.status_code == (200 if fail_open else 503), response.text
            text = (await client.get("/metrics")).text
            assert "mt_quota_unchecked_total 1.0" in text
        finally:
            redis_server.start()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
async def test_redis_stopped_and_started_under_load_costs_no_error_and_no_deadline(
    redis_server: RedisServer, redis_url: str, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    """Clients keep sending over HTTP (cache and quotas in Redis) while Redis goes down (killed:
    connections refused; frozen: connections taken and nothing answered) and comes back: every
    request is answered 200, none waits on Redis for longer than its few calls'
    redis_timeout_s, so none comes near its deadline; the cache and the quotas are back in Redis
    afterwards.

    The service runs under uvicorn in its own thread, as clients meet it: an in-process ASGI
    client would measure the test instead. There, a request answered from the process's own
    sentence store while Redis's breaker fails every call at once awaits nothing that yields,
    so one client's requests ran back to back while the others waited (1.0-2.0 s seen)."""
    store = ["--store", "redis", "--redis-url", redis_url]
    secret = await added(capsys, store, "load", "--requests-per-minute", "100000")
    redis_timeout_s = 0.1
    settings = store_settings(
        store, redis_timeout_s=redis_timeout_s, redis_retry_s=0.2, request_timeout_s=2.0
    )
    slowest = 0.0
    statuses: list[int] = []
    with uvicorn_thread(create_app(settings, models=[FakeModel()])) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            stop = asyncio.Event()

            async def load(worker: int) -> None:
                nonlocal slowest
                i = 0
                while not stop.is_set():
                    started = time.monotonic()
                    response = await post(client, secret, f"Status {worker}-{i % 7}.")
                    slowest = max(slowest, time.monotonic() - started)
                    statuses.append(response.status_code)
                    i += 1

            down, up = {
                "killed": (redis_server.stop, redis_server.start),
                "frozen": (redis_server.freeze, redis_server.thaw),
            }[fault]
            clients = [asyncio.ensure_future(load(w)) for w in range(8)]
            try:
                await asyncio.sleep(0.3)
                await asyncio.to_thread(down)
                try:
                    await asyncio.sleep(0.6)
                finally:  # a Redis left frozen or stopped would fail the tests after this one
                    await asyncio.to_thread(up)
                await asyncio.sleep(0.6)  # past redis_retry_s: Redis is used again
            finally:
                stop.set()
                await asyncio.gather(*clients)
            assert set(statuses) == {200} and len(statuses) > 50
            # While Redis fails, the breaker makes a request's calls fail at once after the
            # first: a request waits out about one timeout (keys, quota and a cache miss, three
            # at most); five leave room for a loaded machine.
            assert slowest < 5 * redis_timeout_s, slowest
            text = (await client.get("/metrics")).text
            samples = {
                sample.name: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
            }
            assert samples["mt_redis_up"] == 1
            assert samples["mt_quota_unchecked_total"] > 0  # requests met the outage
            # Counted in Redis again: one more request is one more in the key's use.
            headers = {"X-API-Key": secret}
            used = (await client.get("/usage", headers=headers)).json()["requests_per_minute"]
            assert (await post(client, secret)).status_code == 200
            again = (await client.get("/usage", headers=headers)).json()["requests_per_minute"]
            assert again["used"] == used["used"] + 1


def test_settings_refuse_a_redis_key_store_without_redis_and_a_url_that_is_not_redis() -> None:
    with pytest.raises(ValidationError, match="key_store redis needs redis_url"):
        Settings(key_store="redis")
    with pytest.raises(ValidationError) as error:
        Settings(redis_url="http://127.0.0.1:6379")
    assert invalid_settings(error.value) == (
        "invalid settings: --redis-url (MT_REDIS_URL): Value error, must start with redis://, "
        "rediss:// or unix://"
    )
