"""The sentence cache and single flight (service/scheduling/cache.py) through the HTTP API, over
the fake model: what is decoded, what is answered from the cache or from another request's
decoding, and that a cached answer is the model's own; in process and in a real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import math
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.servers import RedisServer
from service.bundle.decoding import NO_CONSTRAINTS, Constraints, DecodingOptions, Hypothesis
from service.http.app import create_app
from service.inference.engine import Engine
from service.metrics import Metrics
from service.scheduling.cache import (
    FLIGHT_PREFIX,
    REDIS_PREFIX,
    SAME_HYPOTHESES,
    MemoryStore,
    SharedSentences,
    decode,
    encode,
    sentence_key,
)
from service.store.connection import RedisLink, StoreUnavailable
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}


def decoded(fake: FakeModel) -> list[str]:
    """Every sentence the fake engine was given, in order."""
    return ["".join(map(chr, ids[:-1])) for sources, _ in fake.calls for ids in sources]


async def cache_counts(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["result"]: s.value for s in families["mt_sentence_cache"].samples}


async def translate(client: httpx.AsyncClient, text: Any, **fields: Any) -> dict[str, Any]:
    response = await client.post("/translate", json={"text": text, **EN_DE, **fields})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_paragraph_half_seen_decodes_only_its_new_sentences(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    fake.calls.clear()  # the warm-up's
    first = await translate(client, "One dog runs. Two cats sleep.")
    second = await translate(client, "Two cats sleep. Three birds sing.")
    assert decoded(fake) == ["One dog runs.", "Two cats sleep.", "Three birds sing."]
    assert first["translations"][0]["text"] == "ONE DOG RUNS. TWO CATS SLEEP."
    assert second["translations"][0]["text"] == "TWO CATS SLEEP. THREE BIRDS SING."
    # The sentence seen is a hit, or joins the first request's flight if its entry is still
    # being stored (a task of its own); the warm-up's sentence was a miss too.
    counts = await cache_counts(client)
    assert (counts["hit"] + counts["joined"], counts["miss"]) == (1, 4)
    # cache: false decodes every sentence again, and reads nothing from the cache.
    again = await translate(client, "One dog runs.", cache=False)
    assert decoded(fake)[-1] == "One dog runs."
    assert again["translations"][0]["text"] == "ONE DOG RUNS."
    assert await cache_counts(client) == counts


async def test_a_sentence_twice_in_one_request_is_decoded_once(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    fake.calls.clear()
    body = await translate(client, ["A fox jumps.", "Hi. A fox jumps.", "A fox jumps."])
    assert sorted(decoded(fake)) == ["A fox jumps.", "Hi."]
    texts = [t["text"] for t in body["translations"]]
    assert texts == ["A FOX JUMPS.", "HI. A FOX JUMPS.", "A FOX JUMPS."]
    assert (await cache_counts(client))["joined"] == 2


async def held_in_the_engine(
    client: httpx.AsyncClient, fake: FakeModel, text: str
) -> asyncio.Future[dict[str, Any]]:
    """A request of `text`, being decoded by the fake engine until `fake.gate` is set (its
    calls recorded from now on)."""
    fake.calls.clear()
    fake.entered.clear()
    fake.gate = threading.Event()
    request = asyncio.ensure_future(translate(client, text))
    await asyncio.to_thread(fake.entered.wait, 5)
    return request


async def test_identical_sentences_of_concurrent_requests_are_decoded_once(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    first = await held_in_the_engine(client, fake, "The same status.")
    others = [
        asyncio.ensure_future(translate(client, text, return_scores=True))
        for text in ["The same status.", "The same status. And more."]
    ]
    await asyncio.sleep(0.05)  # the others have joined (and queued "And more.")
    fake.gate.set()
    bodies = [await first, *[await o for o in others]]
    assert [b["translations"][0]["text"] for b in bodies] == [
        "THE SAME STATUS.",
        "THE SAME STATUS.",
        "THE SAME STATUS. AND MORE.",
    ]
    assert decoded(fake) == ["The same status.", "And more."]
    assert bodies[1]["translations"][0]["score"] == 0.0  # return_scores joins: same search
    assert (await cache_counts(client))["joined"] == 2


def client_flights(client: httpx.AsyncClient) -> dict[bytes, Any]:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app: Any = transport.app
    flights: dict[bytes, Any] = app.state.runtime.sentences._flights
    return flights


async def test_a_joiner_decodes_on_its_own_when_the_request_it_joined_goes_away(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    blocker = await held_in_the_engine(client, fake, "Occupies the engine.")
    owner = asyncio.ensure_future(translate(client, "Wanted by two."))
    await async_wait_for(lambda: len(client_flights(client)) == 2)
    joiner = asyncio.ensure_future(translate(client, "Wanted by two."))
    await asyncio.sleep(0.05)
    owner.cancel()  # its client went away while its sentence was queued
    await asyncio.sleep(0.05)
    fake.gate.set()
    await blocker
    body = await joiner
    assert body["translations"][0]["text"] == "WANTED BY TWO."
    assert decoded(fake) == ["Occupies the engine.", "Wanted by two."]


async def test_options_that_change_the_hypotheses_are_never_answered_from_each_other(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    fake.calls.clear()
    await translate(client, "A cat.")
    await translate(client, "A cat.", beam_size=2)
    await translate(client, "A cat.", beam_size=2, num_hypotheses=2)
    plain = await translate(client, "A cat.", return_alignments=True)
    assert len(fake.calls) == 4
    # The same again: all from the cache, alignments included where asked.
    fake.calls.clear()
    cached = await translate(client, "A cat.", return_alignments=True)
    await translate(client, "A cat.", beam_size=2, num_hypotheses=2, return_scores=True)
    assert fake.calls == []
    assert cached == plain and "alignments" in cached["translations"][0]


def test_a_glossarys_constraints_are_in_the_key() -> None:
    """A sentence searched with a glossary's terms (or words to avoid) is never answered from
    the same sentence searched without them, nor with other terms; no constraints is the key
    of a sentence without a glossary."""
    options = DecodingOptions(beam_size=4)
    plain = sentence_key("m", ("en", "de"), [5, 6, 2], [], options)
    assert sentence_key("m", ("en", "de"), [5, 6, 2], [], options, NO_CONSTRAINTS) == plain
    keys = {
        sentence_key("m", ("en", "de"), [5, 6, 2], [], options, constraints)
        for constraints in (
            Constraints(terms=((7, 8),)),
            Constraints(terms=((7, 9),)),
            Constraints(terms=((7, 8),), avoid=frozenset({11})),
            Constraints(terms=((7, 8), (7, 8))),
        )
    }
    assert len(keys) == 4 and plain not in keys


def test_every_decoding_option_but_return_scores_is_in_the_key() -> None:
    options = DecodingOptions(beam_size=4, num_hypotheses=2)
    key = sentence_key("m", ("en", "de"), [5, 6, 2], [], options)
    changed = {
        "beam_size": 5,
        "num_hypotheses": 1,
        "length_penalty": 0.5,
        "max_decoding_length": 100,
        "min_decoding_length": 1,
        "max_length_a": 1.5,
        "max_length_b": 3,
        "no_repeat_ngram_size": 3,
        "return_scores": True,
        "alignments": True,
    }
    # A field added to DecodingOptions must be added here (and so be thought about).
    assert set(changed) == {f.name for f in dataclasses.fields(DecodingOptions)}
    for name, value in changed.items():
        other = sentence_key("m", ("en", "de"), [5, 6, 2], [], replace(options, name, value))
        assert (other == key) == (name in SAME_HYPOTHESES), name
    assert {"return_scores"} == SAME_HYPOTHESES
    for model, pair, ids, prefix in [
        ("other", ("en", "de"), [5, 6, 2], []),
        ("m", ("en", "fr"), [5, 6, 2], []),
        ("m", ("en", "de"), [5, 7, 2], []),
        ("m", ("en", "de"), [5, 6, 2], [9]),
        ("m", ("en", "de"), [5, 6], [2]),  # the same ids, cut elsewhere
        ("m", ("en", "de"), [5, 6, 2, 0], []),
    ]:
        assert sentence_key(model, pair, ids, prefix, options) != key


def replace(options: DecodingOptions, name: str, value: Any) -> DecodingOptions:
    return dataclasses.replace(options, **{name: value})


def test_an_entry_reads_back_exactly() -> None:
    alignment = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    hypotheses = [
        Hypothesis([5, 6, 7], -0.123456789012345, "eos", alignment),
        Hypothesis([5], -math.inf, "length"),
    ]
    [first, second] = decode(encode(hypotheses))
    assert first == hypotheses[0] and second == hypotheses[1]
    assert first.score == hypotheses[0].score  # the float, not a rounding of it
    assert first.alignment is not None and np.array_equal(first.alignment, alignment)
    assert first.alignment.dtype == np.float32 and second.alignment is None


async def test_the_memory_store_keeps_the_most_recently_used_within_its_bytes() -> None:
    entry = [Hypothesis(list(range(10)), 0.0, "eos")]
    size = 400 + 8 * 10
    store = MemoryStore(3 * size, Metrics())
    await store.put([(b"a", entry), (b"b", entry), (b"c", entry)])
    await store.get([b"a"])  # a is now the most recent: b goes first
    await store.put([(b"d", entry)])
    found = await store.get([b"a", b"b", b"c", b"d"])
    assert [f is not None for f in found] == [True, False, True, True]
    assert store.bytes == 3 * size


async def test_without_the_cache_setting_nothing_is_cached(fake: FakeModel) -> None:
    async with running(create_app(fast_settings(cache=False), models=[fake])) as client:
        fake.calls.clear()
        await translate(client, "Twice.")
        await translate(client, "Twice.")
        assert decoded(fake) == ["Twice.", "Twice."]


async def test_replicas_share_the_cache_in_redis(redis_url: str) -> None:
    settings = fast_settings(redis_url=redis_url, cache_ttl_s=60)
    one, two = FakeModel(), FakeModel()
    async with (
        running(create_app(settings, models=[one])) as first,
        running(create_app(settings, models=[two])) as second,
    ):
        one.calls.clear()
        two.calls.clear()
        body = await translate(first, "Seen by one replica.", return_alignments=True)
        await async_wait_for(lambda: not first_writes(first))  # stored in the background
        hits = (await cache_counts(second))["hit"]
        again = await translate(second, "Seen by one replica.", return_alignments=True)
        assert decoded(one) == ["Seen by one replica."] and two.calls == []
        assert again == body
        assert (await cache_counts(second))["hit"] == hits + 1


async def test_a_sentence_another_replica_decodes_is_waited_for_not_decoded_again(
    redis_url: str,
) -> None:
    """Single flight across replicas: the second is asked for a sentence while the first decodes
    it; it waits for the first's entry in Redis rather than decoding it too."""
    settings = fast_settings(redis_url=redis_url, redis_timeout_s=5.0)
    one, two = FakeModel(), FakeModel()
    async with (
        running(create_app(settings, models=[one])) as first,
        running(create_app(settings, models=[two])) as second,
    ):
        joins = (await cache_counts(second)).get("joined", 0)
        owner = await held_in_the_engine(first, one, "Wanted by two replicas.")
        two.calls.clear()
        waiter = asyncio.ensure_future(translate(second, "Wanted by two replicas."))
        await asyncio.sleep(0.1)
        assert not waiter.done()  # waiting for the first's decoding
        one.gate.set()
        assert await waiter == await owner
        assert decoded(one) == ["Wanted by two replicas."] and two.calls == []
        assert (await cache_counts(second))["joined"] == joins + 1


async def test_a_replica_decodes_a_sentence_itself_when_the_one_decoding_it_gives_up(
    redis_url: str,
) -> None:
    settings = fast_settings(redis_url=redis_url, redis_timeout_s=5.0)
    one, two = FakeModel(), FakeModel()
    async with (
        running(create_app(settings, models=[one])) as first,
        running(create_app(settings, models=[two])) as second,
    ):
        blocker = await held_in_the_engine(first, one, "Occupies the engine.")
        owner = asyncio.ensure_future(translate(first, "Wanted, then dropped."))
        await async_wait_for(lambda: len(client_flights(first)) == 2)  # claimed, queued
        two.calls.clear()
        waiter = asyncio.ensure_future(translate(second, "Wanted, then dropped."))
        await asyncio.sleep(0.1)
        assert not waiter.done() and two.calls == []
        owner.cancel()  # its client went away: its claim is given up
        body = await asyncio.wait_for(waiter, 5)
        assert body["translations"][0]["text"] == "WANTED, THEN DROPPED."
        assert decoded(two) == ["Wanted, then dropped."]
        one.gate.set()
        await blocker


async def test_a_claim_of_this_process_it_could_not_give_up_is_taken_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim this process could not give up (Redis failed when its decoding ended) is its
    own to take again at once; one it holds for a request still decoding, or another
    process's, is waited for (never decoded twice); an entry stored is found, not claimed."""
    links = [RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics()) for _ in "ab"]
    try:
        mine, other = (
            SharedSentences(link, MemoryStore(1 << 20, Metrics()), ttl_s=60) for link in links
        )
        keys = [b"\x01" * 16, b"\x02" * 16]
        assert await mine.find_or_claim(keys, 5.0) == [True, True]
        assert await mine.find_or_claim(keys, 5.0) == [False, False]  # still its requests'
        assert await other.find_or_claim(keys, 5.0) == [False, False]
        run = links[0].run

        async def failing(operation: str, call: Any) -> Any:
            if operation == "cache_store":
                raise StoreUnavailable("Redis is down")
            return await run(operation, call)

        monkeypatch.setattr(links[0], "run", failing)
        await mine.release(keys[:1])  # not given up: the claim stays in Redis
        assert await other.find_or_claim(keys, 5.0) == [False, False]
        assert await mine.find_or_claim(keys, 5.0) == [True, False]  # its own left: taken again
        monkeypatch.setattr(links[0], "run", run)
        hypotheses = [Hypothesis([5, 6], -0.5, "eos", None)]
        await mine.store([(keys[0], hypotheses)], keys)  # stored and given up at once
        assert await other.find_or_claim(keys, 5.0) == [hypotheses, True]
        # A claim it could not give up that expired and was taken by another since: that
        # one's, waited for, and never given up by this process.
        late = b"\x03" * 16
        assert await mine.find_or_claim([late], 0.2) == [True]
        monkeypatch.setattr(links[0], "run", failing)
        await mine.release([late])
        monkeypatch.setattr(links[0], "run", run)
        await asyncio.sleep(0.3)  # expired
        assert await other.find_or_claim([late], 5.0) == [True]
        assert await mine.find_or_claim([late], 5.0) == [False]
        await mine.release([late])  # not its claim: stays
        assert await mine.find_or_claim([late], 5.0) == [False]
    finally:
        for link in links:
            await link.close()


def counted(link: RedisLink, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The operations of the calls `link` runs from now on, in order."""
    calls: list[str] = []
    run = link.run

    async def counting(operation: str, call: Any) -> Any:
        calls.append(operation)
        return await run(operation, call)

    monkeypatch.setattr(link, "run", counting)
    return calls


async def test_the_stores_of_one_turn_go_to_redis_in_one_round_trip(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests of a batch end together: their entries and the claims they give up go to
    Redis in one round trip, each store returning once it is written; a replica waiting for one
    of those sentences is woken with its entry, one waiting for a claim given up without an
    entry decodes it itself."""
    links = [RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics()) for _ in "ab"]
    try:
        mine, other = (
            SharedSentences(link, MemoryStore(1 << 20, Metrics()), ttl_s=60) for link in links
        )
        calls = counted(links[0], monkeypatch)
        keys = [bytes([i]) * 16 for i in range(10, 14)]
        assert await mine.find_or_claim(keys, 5.0) == [True] * 4
        stored = asyncio.ensure_future(other.wait(keys[:1], time.monotonic() + 3))
        dropped = asyncio.ensure_future(other.wait(keys[3:], time.monotonic() + 3))
        await asyncio.sleep(0.2)  # both blocking
        calls.clear()
        hypotheses = [Hypothesis([5, 6], -0.5, "eos", None)]
        await asyncio.gather(
            mine.store([(keys[0], hypotheses)], keys[:1]),
            mine.store([(key, hypotheses) for key in keys[1:3]], keys[1:3]),
            mine.release(keys[3:]),
        )
        assert calls == ["cache_store"]
        assert await asyncio.wait_for(stored, 1) == [hypotheses]
        assert await asyncio.wait_for(dropped, 1) == [None]
        assert await other.find_or_claim(keys, 5.0) == [hypotheses] * 3 + [True]
    finally:
        for link in links:
            await link.close()


async def test_waiters_for_a_claim_that_expired_and_was_taken_again_get_the_first_entry(
    redis_url: str,
) -> None:
    """A decoding that outlives its claim (a request's remaining time): another replica claims
    the sentence again. When the first decoding is stored, the replicas waiting, for either
    claim, are woken with its entry, not left blocking until the second ends or their call
    times out."""
    links = [RedisLink(redis_url, timeout_s=8.0, retry_s=0.3, metrics=Metrics()) for _ in "abc"]
    try:
        first, second, third = (
            SharedSentences(link, MemoryStore(1 << 20, Metrics()), ttl_s=60) for link in links
        )
        key = b"\x0a" * 16
        hypotheses = [Hypothesis([5, 6], -0.5, "eos", None)]
        assert await first.find_or_claim([key], 0.2) == [True]
        assert await third.find_or_claim([key], 5.0) == [False]
        # Blocks for at most half the link's timeout (4 s).
        early = asyncio.ensure_future(third.wait([key], time.monotonic() + 6))
        await asyncio.sleep(0.3)  # the first claim expired
        assert await second.find_or_claim([key], 5.0) == [True]
        late = asyncio.ensure_future(third.wait([key], time.monotonic() + 6))
        await asyncio.sleep(0.1)
        assert not early.done() and not late.done()
        await first.store([(key, hypotheses)], [key])
        assert await asyncio.wait_for(asyncio.gather(early, late), 1) == [[hypotheses]] * 2
        # The second claim is the second decoding's: kept, and given up by it.
        assert await links[0].client.get(FLIGHT_PREFIX + key.hex()) is not None
        await second.store([(key, hypotheses)], [key])
        assert await links[0].client.get(FLIGHT_PREFIX + key.hex()) is None
    finally:
        for link in links:
            await link.close()


async def test_an_entry_read_from_redis_is_kept_in_the_process_store(redis_url: str) -> None:
    """...so that the next request for it costs no round trip; one Redis cannot read (another
    format) is decoded again rather than failing the request."""
    links = [RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics()) for _ in "ab"]
    try:
        near = MemoryStore(1 << 20, Metrics())
        mine, other = SharedSentences(links[0], near, 60), SharedSentences(links[1], near, 60)
        key, bad = b"\x04" * 16, b"\x05" * 16
        hypotheses = [Hypothesis([7], -0.1, "eos", np.ones((1, 3), np.float32))]
        assert await other.find_or_claim([key], 5.0) == [True]
        await other.store([(key, hypotheses)], [key])
        await links[0].client.set(REDIS_PREFIX + bad.hex(), b"not an entry")
        assert await near.get([key]) == [None]
        found = await mine.find_or_claim([key, bad], 5.0)
        assert found == [hypotheses, True]  # (alignments are not part of equality)
        assert isinstance(found[0], list) and found[0][0].alignment is not None
        np.testing.assert_array_equal(found[0][0].alignment, hypotheses[0].alignment)
        assert await near.get([key]) == [hypotheses]
        # A replica waiting for it decodes it too, rather than waiting on or failing.
        assert await other.wait([bad], time.monotonic() + 1) == [None]
    finally:
        for link in links:
            await link.close()


async def test_the_connections_a_burst_opens_parse_no_package_metadata(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link's new connection costs a connect: redis-py's own version, which it names to Redis
    (CLIENT SETINFO), is read from its package metadata once, not by every connection (a file
    parsed: 264 us a connection against 7, more on a busy loop, paid by a burst's requests)."""
    link = RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics())
    reads: list[str] = []
    version = importlib.metadata.version

    def counted(name: str) -> str:
        reads.append(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", counted)
    try:
        # Eight at once, each blocking on its own connection.
        blocking = partial(link.client.blpop, ["mt:test:nothing"], 0.05)
        await asyncio.gather(*(link.run("test", blocking) for _ in range(8)))
        clients = await link.client.client_list()
        ours = [c for c in clients if c["cmd"] in ("blpop", "client|list")]
        assert len(ours) >= 8 and reads == []
        # What they name to a Redis that takes it (7.2 and later: CLIENT SETINFO).
        driver = link.pool.connection_kwargs["driver_info"]
        assert (driver.formatted_name, driver.lib_version) == ("redis-py", version("redis"))
    finally:
        await link.close()


async def test_a_link_whose_redis_restarted_fails_no_call_once_redis_answers(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Redis killed and started again: the connections the link's pool kept were closed by the
    old server, and each is replaced when it is next taken, so no call fails once the new one
    answers. (redis-py 8's maintenance notifications, on by default, skip that check: each
    connection kept failed its next command, and each failure opened the breaker for every
    request; seen as 503s from documents after a restart.)"""
    link = RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics())
    blocking = partial(link.client.blpop, ["mt:test:nothing"], 0.05)
    try:
        await asyncio.gather(*(link.run("test", blocking) for _ in range(8)))  # 8 connections
        await asyncio.to_thread(redis_server.stop)
        await asyncio.to_thread(redis_server.start)
        # Eight calls at once take the eight connections kept.
        await asyncio.gather(*(link.run("test", blocking) for _ in range(8)))
        assert link.up
    finally:
        if redis_server.process is None:
            redis_server.start()
        await link.close()


async def test_a_waiting_replica_wakes_when_the_decoding_ends_and_blocks_for_a_new_one(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica waiting for a sentence another decodes blocks until that decoding ends: one
    blocking call and one look, not a poll every few ms; a sentence claimed again after an
    earlier decoding of it ended is waited for anew (that end forgotten, not spun on); with
    every blocking slot taken, or a link timeout too short for Redis's late end of a blocking
    call, a wait looks again now and then instead."""
    links = [RedisLink(redis_url, timeout_s=5.0, retry_s=0.3, metrics=Metrics()) for _ in "ab"]
    try:
        mine, other = (
            SharedSentences(link, MemoryStore(1 << 20, Metrics()), ttl_s=60) for link in links
        )
        calls = counted(links[1], monkeypatch)
        hypotheses = [Hypothesis([5, 6], -0.5, "eos", None)]
        key, again = b"\x06" * 16, b"\x07" * 16
        assert await mine.find_or_claim([key], 5.0) == [True]
        assert await other.find_or_claim([key], 5.0) == [False]
        calls.clear()
        # Blocks for at most half the link's timeout (2.5 s): answered within 1 s, it was
        # woken by the store.
        waiter = asyncio.ensure_future(other.wait([key], time.monotonic() + 3))
        await asyncio.sleep(0.3)
        assert not waiter.done() and calls == ["cache_wait"]  # one call, blocking
        await mine.store([(key, hypotheses)], [key])
        assert await asyncio.wait_for(waiter, 1) == [hypotheses]
        assert calls == ["cache_wait"]  # the blocking call brought the entry
        # A decoding that ended without an entry leaves an item for its waiters; the next
        # claim forgets it, so the next waiters block rather than wake at once.
        assert await mine.find_or_claim([again], 5.0) == [True]
        await mine.release([again])
        assert await mine.find_or_claim([again], 5.0) == [True]
        assert await other.find_or_claim([again], 5.0) == [False]
        calls.clear()
        blocked = asyncio.ensure_future(other.wait([again], time.monotonic() + 3))
        await asyncio.sleep(0.3)
        assert not blocked.done() and calls == ["cache_wait"]
        await mine.store([(again, hypotheses)], [again])
        assert await asyncio.wait_for(blocked, 1) == [hypotheses]
        # A link whose timeout leaves no room for Redis's late end of a blocking call (its
        # 100 ms tick) looks instead of blocking, and never times out.
        short = RedisLink(redis_url, timeout_s=0.1, retry_s=0.3, metrics=Metrics())
        links.append(short)
        brief = SharedSentences(short, MemoryStore(1 << 20, Metrics()), ttl_s=60)
        fourth = b"\x09" * 16
        assert await mine.find_or_claim([fourth], 5.0) == [True]
        assert await brief.find_or_claim([fourth], 5.0) == [False]
        waiter = asyncio.ensure_future(brief.wait([fourth], time.monotonic() + 3))
        await asyncio.sleep(0.5)
        await mine.store([(fourth, hypotheses)], [fourth])
        assert await asyncio.wait_for(waiter, 1) == [hypotheses] and short.up
        # No blocking slot free: looked for again after a pause, and found.
        third = b"\x08" * 16
        monkeypatch.setattr("service.scheduling.cache.MAX_BLOCKING", 0)
        polling = SharedSentences(links[1], MemoryStore(1 << 20, Metrics()), ttl_s=60)
        assert await mine.find_or_claim([third], 5.0) == [True]
        assert await polling.find_or_claim([third], 5.0) == [False]
        calls.clear()
        waiter = asyncio.ensure_future(polling.wait([third], time.monotonic() + 3))
        await asyncio.sleep(0.3)
        assert not waiter.done() and len(calls) >= 5  # a look every 20 ms
        await mine.store([(third, hypotheses)], [third])
        assert await asyncio.wait_for(waiter, 1) == [hypotheses]
    finally:
        for link in links:
            await link.close()


def first_writes(client: httpx.AsyncClient) -> set[Any]:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app: Any = transport.app
    writes: set[Any] = app.state.runtime.sentences._writes
    return writes


async def test_translation_goes_on_while_redis_is_down_and_uses_it_once_back(
    redis_server: RedisServer, redis_url: str
) -> None:
    settings = fast_settings(
        redis_url=redis_url, redis_timeout_s=0.2, redis_retry_s=0.3, request_timeout_s=5
    )
    fake = FakeModel()
    async with running(create_app(settings, models=[fake])) as client:
        await translate(client, "Up first.")  # Redis has the cache's scripts now, then loses them
        redis_server.stop()
        fake.calls.clear()
        try:
            started = time.monotonic()
            for text in ["Down one.", "Down two.", "Down one."]:
                await translate(client, text)
            assert time.monotonic() - started < 3 * 0.2 + 1  # at most one timeout each
            # The process's own store, in front of Redis's, still answers what it decoded.
            assert decoded(fake) == ["Down one.", "Down two."]
            text = (await client.get("/metrics")).text
            assert "mt_redis_up 0.0" in text
        finally:
            redis_server.start()
        await asyncio.sleep(0.35)  # the breaker's retry_s
        fake.calls.clear()
        await translate(client, "Back again.")
        await async_wait_for(lambda: not first_writes(client))
        await translate(client, "Back again.")
        assert decoded(fake) == ["Back again."]
        assert "mt_redis_up 1.0" in (await client.get("/metrics")).text


async def test_the_shipped_models_answers_come_back_the_same_from_redis(
    shipped_bundle: Path, redis_url: str
) -> None:
    """One replica decodes (markup and n-best with scores and alignments), another with no
    store of its own answers from Redis: the same answers, byte for byte, nothing decoded."""
    settings = fast_settings(redis_url=redis_url, cache_bytes=0)
    engine = Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)
    text = "A man in a blue shirt rides a bike. A dog runs."
    bodies = [
        {"text": f"<p>{text.replace('blue', '<b>blue</b>')}</p>", "format": "html", **EN_DE},
        {"text": text, "num_hypotheses": 2, "beam_size": 4, "return_scores": True, **EN_DE},
        {"text": text, "return_alignments": True, "return_scores": True, **EN_DE},
    ]
    async with running(create_app(settings, models=[engine])) as first:
        answers = [await first.post("/translate", json=body) for body in bodies]
        await async_wait_for(lambda: not first_writes(first))
    async with running(create_app(settings, models=[engine])) as second:
        hits = (await cache_counts(second))["hit"]
        again = [await second.post("/translate", json=body) for body in bodies]
        assert (await cache_counts(second))["hit"] == hits + 2 * len(bodies)
    assert all(a.status_code == 200 for a in answers)
    assert [a.content for a in again] == [a.content for a in answers]
