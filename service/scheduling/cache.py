"""The sentence cache and single flight, between the runtime and its batchers.

A sentence's translation is a function of the model, the ids the model reads (the source ids
and the decoder prefix), the pair and the decoding options; `sentence_key` hashes exactly
these, so a key never answers for another model or another option. The runtime
(service/scheduling/runtime.py) asks `Sentences.decode` for the hypotheses of a request's
sentences: each is answered from the store (a hit), by the decoding of the same sentence already
queued or running for any request, or earlier in the same request (joined: single flight), or
submitted to the batcher (a miss), which stores what it gives. With Redis, single flight spans
the replicas (`SharedSentences`): a replica claims each sentence it is about to decode, and
another asked for it meanwhile waits for its entry rather than decoding it too. A paragraph half
seen reuses the sentences it shares with earlier ones; markup and every API get it by going
through the runtime.

Stores: `MemoryStore` (in this process: least recently used out past `cache_bytes`), and with
`redis_url` `SharedSentences` behind it (shared by every replica, entries expire after
`cache_ttl_s`). A sentence costs Redis at most two round trips: one that finds its entry or
claims it, and, if it was decoded here, one that stores it and gives up the claim (shared by
the stores of one turn of the event loop); a replica waiting for it costs a blocking call that
returns its entry when its decoding ends (and a look, for a wait of several). A Redis that
fails is skipped (service/store/connection.py): the sentences are decoded, or answered by the
process's own store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import logging
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import numpy as np

from service.bundle.decoding import NO_CONSTRAINTS, Constraints, DecodingOptions, Hypothesis
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.scheduling.batcher import DECODING_TIMEOUT_MESSAGE
from service.store.connection import RedisLink, StoreUnavailable

log = logging.getLogger(__name__)

# Bumped when what a key means or how an entry is written changes: old entries are then never
# read (they expire in Redis; the in-process store starts empty anyway).
FORMAT = 2
# DecodingOptions' fields that change no hypothesis: return_scores only says whether to show
# the scores every hypothesis carries. Every other field is part of the key, so a field added
# to DecodingOptions is in it unless it is named here.
SAME_HYPOTHESES = frozenset({"return_scores"})
# Bytes an entry costs besides its ids and alignments (objects, the key, the LRU's links):
# measured with tracemalloc on the shipped model's entries, rounded up.
ENTRY_OVERHEAD = 400
REDIS_PREFIX = "mt:sentence:"
FLIGHT_PREFIX = "mt:flight:"
# A list that gets an item when a sentence's decoding ends (stored or given up), for the
# replicas waiting for it (`SharedSentences.wait`); taken away when it is claimed again.
DONE_PREFIX = "mt:done:"
# Blocking waits one process holds at once (each holds a connection of the pool while it
# blocks: service/store/connection.py MAX_CONNECTIONS); a wait beyond them looks again after
# FLIGHT_POLL_S instead.
MAX_BLOCKING = 16
FLIGHT_POLL_S = 0.02
# Redis ends a blocking call past its timeout at its next tick: up to 100 ms late at its default
# `hz 10` when idle (BLMOVE for 10 ms measured 101 ms, for 250 ms 301 ms). A blocking call's timeout
# leaves that much of the link's for it, and half at most for the pool and the round trip; a
# link too short for both does not block (it looks every FLIGHT_POLL_S).
REDIS_TICK_S = 0.15
# A claim's longest life (a document's sentences have no deadline): a replica that dies
# holding it leaves the others waiting this long at most, then they decode the sentence
# themselves, as they do one whose decoding takes longer (decoded twice, never lost).
FLIGHT_CLAIM_MAX_S = 5.0


def sentence_key(
    model: str,
    pair: tuple[str, str],
    ids: Sequence[int],
    prefix: Sequence[int],
    options: DecodingOptions,
    constraints: Constraints = NO_CONSTRAINTS,
) -> bytes:
    """The cache key of a sentence: `model` is the model's fingerprint (its bundle's content
    hash), `ids` and `prefix` what its encoder and decoder read, `options` every decoding
    option but those in SAME_HYPOTHESES, `constraints` the glossary terms its search must write
    and the words it must avoid (service/text/terms.py: what a glossary changes of it)."""
    digest = hashlib.blake2b(_context(model, pair, options), digest_size=20)
    for sequence in (ids, prefix):
        digest.update(struct.pack(f"<I{len(sequence)}i", len(sequence), *sequence))
    if constraints:
        parts = [[list(term) for term in constraints.terms], sorted(constraints.avoid)]
        digest.update(json.dumps(parts, separators=(",", ":")).encode())
    return digest.digest()


@functools.lru_cache(maxsize=256)
def _context(model: str, pair: tuple[str, str], options: DecodingOptions) -> bytes:
    """What a key says besides the sentence (the same for every sentence of a request): made
    once per model, pair and options, not once per sentence."""
    fields = {
        field.name: getattr(options, field.name)
        for field in dataclasses.fields(options)
        if field.name not in SAME_HYPOTHESES
    }
    parts = [FORMAT, model, list(pair), fields]
    return json.dumps(parts, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def encode(hypotheses: Sequence[Hypothesis]) -> bytes:
    """A sentence's hypotheses as bytes for Redis: a JSON line (ids, score, finish reason,
    alignment shape), then each alignment's float32 values; exact, scores included."""
    head = [
        [h.ids, h.score, h.finish_reason, None if h.alignment is None else h.alignment.shape]
        for h in hypotheses
    ]
    rows = [h.alignment.astype("<f4").tobytes() for h in hypotheses if h.alignment is not None]
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + b"".join(rows)


def decode(data: bytes) -> list[Hypothesis]:
    line, _, rest = data.partition(b"\n")
    hypotheses = []
    offset = 0
    for ids, score, finish_reason, shape in json.loads(line):
        alignment = None
        if shape is not None:
            count = shape[0] * shape[1]
            alignment = np.frombuffer(rest, "<f4", count, offset).reshape(shape).astype(np.float32)
            offset += 4 * count
        hypotheses.append(Hypothesis(ids, score, finish_reason, alignment))
    return hypotheses


def _size(hypotheses: Sequence[Hypothesis]) -> int:
    return ENTRY_OVERHEAD + sum(
        8 * len(h.ids) + (0 if h.alignment is None else h.alignment.nbytes) for h in hypotheses
    )


class MemoryStore:
    """In this process, bounded in bytes; the least recently used entries go first."""

    def __init__(self, max_bytes: int, metrics: Metrics) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, tuple[list[Hypothesis], int]] = OrderedDict()
        self._gauge = metrics.sentence_cache_bytes

    async def get(self, keys: Sequence[bytes]) -> list[list[Hypothesis] | None]:
        found: list[list[Hypothesis] | None] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            found.append(None if entry is None else entry[0])
        return found

    async def put(self, entries: Sequence[tuple[bytes, list[Hypothesis]]]) -> None:
        for key, hypotheses in entries:
            size = _size(hypotheses)
            if size > self.max_bytes:
                continue
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[key] = (hypotheses, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
        self._gauge.set(self.bytes)


# One round trip for the sentences a replica does not hold: for each, its entry if Redis has one,
# else a claim on it (SET NX GET: none there, now ours, and the end of an earlier decoding of it
# forgotten; or its holder's token). KEYS: entry, flight and done names, in threes; ARGV: this
# process's token, the claim's life in ms.
_FIND_OR_CLAIM = """
local found = {}
for i = 1, #KEYS, 3 do
    local entry = redis.call('GET', KEYS[i])
    if entry then
        found[#found + 1] = {0, entry}
    else
        local owner = redis.call('SET', KEYS[i + 1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
        if owner then
            found[#found + 1] = {2, owner}
        else
            redis.call('DEL', KEYS[i + 2])
            found[#found + 1] = {1}
        end
    end
end
return found
"""
# One round trip for what a replica decoded: the entries written (each expiring), and its claims
# given up, each only if it is still its own (one that expired meanwhile may be another's now),
# with an item in its done list for the replicas waiting: the entry itself (a waiter for that
# one sentence needs no other read), or "" for a claim given up without one. A claim that
# expired during its decoding and was taken again gets the entry in its done list too: the
# replicas that waited for either decoding have their answer now, not once the second ends or
# their blocking call times out. KEYS: the entries' names, then the claims' entry, flight and
# done names in threes; ARGV: this process's token, the entries' life in s, the done lists' life
# in ms, then the entries' values.
_STORE = """
local entries = #ARGV - 3
for i = 1, entries do
    redis.call('SET', KEYS[i], ARGV[i + 3], 'EX', ARGV[2])
end
for i = entries + 1, #KEYS, 3 do
    local ours = redis.call('GET', KEYS[i + 1]) == ARGV[1]
    local entry = redis.call('GET', KEYS[i])
    if ours then
        redis.call('DEL', KEYS[i + 1])
    end
    if ours or entry then
        redis.call('RPUSH', KEYS[i + 2], entry or '')
        redis.call('PEXPIRE', KEYS[i + 2], ARGV[3])
    end
end
return entries
"""
# One round trip for the sentences a replica waits for: each one's entry, else 1 while it is
# claimed and 0 once it is not (its decoding failed, or its replica died). A script, so that an
# entry stored and its claim given up between two reads cannot look like a claim gone without
# its entry. KEYS: entry and flight names, in pairs.
_LOOK = """
local found = {}
for i = 1, #KEYS, 2 do
    found[#found + 1] = redis.call('GET', KEYS[i]) or redis.call('EXISTS', KEYS[i + 1])
end
return found
"""


class SharedSentences:
    """The entries in Redis that every replica shares (each expires `ttl_s` after it was
    written), and single flight across them: a claim per sentence (`SET NX`, for the deciding
    request's remaining time) names the replica that decodes it; another asked for it meanwhile
    looks for its entry until it is stored, or until the claim is gone without one (that request
    failed or ran out of time, its replica died), and then decodes it itself. Entries read from
    Redis are kept in this process's store (`near`): an entry never changes (its key says all
    its answer depends on), so a hot sentence costs no round trip. While Redis fails, nothing is
    found or stored there and every replica decodes what it is asked for."""

    def __init__(self, link: RedisLink, near: MemoryStore, ttl_s: int) -> None:
        self._link = link
        self._near = near
        self._ttl_s = ttl_s
        self._find_or_claim = link.client.register_script(_FIND_OR_CLAIM)
        self._store = link.client.register_script(_STORE)
        self._look = link.client.register_script(_LOOK)
        self._blocking = asyncio.Semaphore(MAX_BLOCKING)
        # The longest blocking call: within the link's timeout, which bounds every call.
        self._block_s = min(link.timeout_s / 2, link.timeout_s - REDIS_TICK_S)
        self._token = secrets.token_bytes(8)  # this process's claims
        # Claims this process could not give up (Redis failed), until they expire: its own to
        # take again at once (time.monotonic() when each expires).
        self._unreleased: dict[bytes, float] = {}
        self._writing: _Writes | None = None  # the stores of this turn, not yet sent

    async def find_or_claim(
        self, keys: Sequence[bytes], ttl_s: float
    ) -> list[list[Hypothesis] | bool]:
        """For each key, its hypotheses if Redis has them, else whether this process now
        decodes it (True too when Redis fails, and for a claim of its own that it could not
        give up: a job retried after Redis came back is not kept waiting for itself)."""
        ttl_ms = max(1, int(min(ttl_s, FLIGHT_CLAIM_MAX_S) * 1000))
        names = [name for key in keys for name in _names(key)]
        try:
            answers = await self._link.run(
                "cache_find", lambda: self._find_or_claim(keys=names, args=[self._token, ttl_ms])
            )
        except StoreUnavailable:  # counted and logged by the link: skipped, not failed
            return [True] * len(keys)
        now = time.monotonic()
        self._unreleased = {k: end for k, end in self._unreleased.items() if end > now}
        found: list[list[Hypothesis] | bool] = []
        kept = []
        for key, (kind, *value) in zip(keys, answers, strict=True):
            if kind == 1:  # claimed now
                found.append(True)
            elif kind == 2:  # another claim: this process's own only if it could not give it up
                found.append(value[0] == self._token and self._unreleased.pop(key, 0) > now)
            elif (hypotheses := _read(value[0])) is not None:
                found.append(hypotheses)
                kept.append((key, hypotheses))
            else:  # decoded here, unclaimed (twice at worst), and written over once decoded
                found.append(True)
        await self._near.put(kept)
        return found

    async def store(
        self, entries: Sequence[tuple[bytes, list[Hypothesis]]], claimed: Sequence[bytes]
    ) -> None:
        """Write the entries and give up this process's claims: the replicas waiting read the
        entries, and decode the claimed sentences not stored. The stores of one turn of the
        event loop (the requests of a batch end together) go in one round trip."""
        if self._writing is None:
            self._writing = _Writes(asyncio.ensure_future(self._write()))
        writes = self._writing
        writes.entries += entries
        writes.claimed += claimed
        await asyncio.shield(writes.sent)

    async def _write(self) -> None:
        """The stores gathered until this task runs (`store`), in one round trip."""
        writes, self._writing = self._writing, None
        assert writes is not None
        names = [_names(key)[0] for key, _ in writes.entries]
        names += [name for key in writes.claimed for name in _names(key)]
        args: list[bytes | int] = [self._token, self._ttl_s, int(FLIGHT_CLAIM_MAX_S * 1000)]
        args += [encode(hypotheses) for _, hypotheses in writes.entries]
        try:
            await self._link.run("cache_store", lambda: self._store(keys=names, args=args))
        except StoreUnavailable:  # the next request decodes them again; the claims expire
            end = time.monotonic() + FLIGHT_CLAIM_MAX_S
            self._unreleased.update((key, end) for key in writes.claimed)

    async def release(self, keys: Sequence[bytes]) -> None:
        """Give up this process's claims without entries (their decoding failed)."""
        await self.store([], keys)

    async def wait(self, keys: Sequence[bytes], deadline: float) -> list[list[Hypothesis] | None]:
        """Each key's hypotheses once another replica stored them; None where its claim went
        without an entry, Redis failed or `deadline` (time.monotonic()) came first. Before each
        look it blocks until the decoding of the first sentence still claimed ends (its done
        list gets an item: one round trip, however long the decoding takes), for at most
        `_block_s` (a replica that died holding a claim sends nothing: its claim expires). An
        item that is the entry answers that sentence: only the others are looked at."""
        found: list[list[Hypothesis] | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        try:
            while pending and (left := deadline - time.monotonic()) > 0:
                item = await self._until_done(_names(keys[pending[0]])[2], left)
                values: list[bytes | int] = [item] if item else []
                looked = pending[len(values) :]
                if looked:
                    names = [name for j in looked for name in _names(keys[j])[:2]]
                    values += await self._link.run("cache_wait", partial(self._look, keys=names))
                waiting, kept = [], []
                for j, value in zip(pending, values, strict=True):
                    if isinstance(value, bytes):
                        found[j] = hypotheses = _read(value)  # None: decoded by the waiters
                        if hypotheses is not None:
                            kept.append((keys[j], hypotheses))
                    elif value:
                        waiting.append(j)
                await self._near.put(kept)
                pending = waiting
        except StoreUnavailable:
            pass
        return found

    async def _until_done(self, done: str, left: float) -> bytes | None:
        """Until `done` (a sentence's done list) has an item, or for at most `left` seconds
        and `_block_s`; a short pause instead while MAX_BLOCKING waits block, or where a
        blocking call would not end within the link's timeout or `left` (REDIS_TICK_S). The
        item (the sentence's entry, or b"" for a claim given up without one), if one came."""
        block = min(left, self._block_s)
        if self._blocking.locked() or block < FLIGHT_POLL_S:
            await asyncio.sleep(min(left, FLIGHT_POLL_S))
            return None
        async with self._blocking:
            # BLMOVE from a list to itself: the item stays for every other waiter. Its timeout
            # is in seconds, a fraction too.
            command = ("BLMOVE", done, done, "LEFT", "RIGHT", block)
            call = partial(self._link.client.execute_command, *command)
            item: bytes | None = await self._link.run("cache_wait", call)
            return item


@dataclasses.dataclass
class _Writes:
    """The stores of one turn of the event loop (`SharedSentences.store`), sent by `sent`."""

    sent: asyncio.Future[None]
    entries: list[tuple[bytes, list[Hypothesis]]] = dataclasses.field(default_factory=list)
    claimed: list[bytes] = dataclasses.field(default_factory=list)


def _read(value: bytes) -> list[Hypothesis] | None:
    """An entry's hypotheses; None for one this version cannot read (another's format under
    the same key: a bug, or a hand-written key), which is then decoded again, not a failed
    request. (Bytes: the client decodes no responses.)"""
    try:
        return decode(value)
    except (ValueError, TypeError) as e:
        log.warning("a cached sentence could not be read (%s): decoded again", e)
        return None


def _names(key: bytes) -> tuple[str, str, str]:
    """A sentence's entry, claim and done list in Redis."""
    name = key.hex()
    return REDIS_PREFIX + name, FLIGHT_PREFIX + name, DONE_PREFIX + name


# Submits the sentences at these positions of the request to the batcher: their hypotheses.
Submit = Callable[[list[int]], Awaitable[list[list[Hypothesis]]]]


class Sentences:
    """The cache in front of the batchers, and single flight (module docstring)."""

    def __init__(
        self, store: MemoryStore, metrics: Metrics, shared: SharedSentences | None = None
    ) -> None:
        self.store = store  # this process's; with Redis, in front of `shared`
        self._shared = shared
        self._hits, self._joins, self._misses = (
            metrics.sentence_cache.labels(result=result) for result in ("hit", "joined", "miss")
        )
        # Sentences being decoded, by key: their hypotheses once decoded, None if the request
        # that submitted them failed or went away (a joiner then submits its own).
        self._flights: dict[bytes, asyncio.Future[list[Hypothesis] | None]] = {}
        self._writes: set[asyncio.Task[None]] = set()  # stores in progress (not awaited)

    async def decode(
        self, keys: Sequence[bytes], submit: Submit, *, deadline: float
    ) -> list[list[Hypothesis]]:
        """The hypotheses of the sentences of `keys`, in order (module docstring)."""
        first: dict[bytes, int] = {}  # each key's first position in this request
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        unique = list(first.values())
        results: dict[int, list[Hypothesis]] = {}
        found = await self.store.get([keys[i] for i in unique])
        joined: dict[int, asyncio.Future[list[Hypothesis] | None]] = {}
        owned: list[int] = []
        for i, hypotheses in zip(unique, found, strict=True):
            flight = self._flights.get(keys[i])
            if hypotheses is not None:
                results[i] = hypotheses
            elif flight is not None:
                joined[i] = flight
            else:
                owned.append(i)
        elsewhere: list[int] = []  # decoded by another replica meanwhile
        if owned and self._shared is not None:
            answers = await self._shared.find_or_claim(
                [keys[i] for i in owned], deadline - time.monotonic()
            )
            mine = []
            for i, answer in zip(owned, answers, strict=True):
                if isinstance(answer, list):
                    results[i] = answer
                elif answer:
                    mine.append(i)
                else:
                    elsewhere.append(i)
            owned = mine
        self._hits.inc(len(results))
        self._joins.inc(len(joined) + len(elsewhere) + len(keys) - len(unique))
        self._misses.inc(len(owned))
        if elsewhere:
            joined.update(self._await_elsewhere(keys, elsewhere, deadline))
        if owned:
            results.update(await self._fly(keys, owned, submit))
        again = []  # joined sentences whose flight failed: submitted on their own
        for i, flight in joined.items():
            hypotheses = await _within(flight, deadline)
            if hypotheses is None:
                again.append(i)
            else:
                results[i] = hypotheses
        if again:
            results.update(zip(again, await submit(again), strict=True))
        return [results[first[key]] for key in keys]

    async def _fly(
        self, keys: Sequence[bytes], owned: list[int], submit: Submit
    ) -> dict[int, list[Hypothesis]]:
        """Submit the `owned` sentences, which other requests may join while they decode."""
        loop = asyncio.get_running_loop()
        flights = {i: loop.create_future() for i in owned}
        for i, flight in flights.items():
            self._flights[keys[i]] = flight
        decoded: list[list[Hypothesis]] | None = None
        claimed = [keys[i] for i in owned]
        try:
            decoded = await submit(owned)
        finally:
            for j, flight in enumerate(flights.values()):
                flight.set_result(None if decoded is None else decoded[j])
            if decoded is None:
                self._land(keys, flights)
                if self._shared is not None:  # the replicas waiting decode them
                    self._background(self._shared.release(claimed), keys, {})
        finished = [
            (keys[i], hypotheses)
            for i, hypotheses in zip(owned, decoded, strict=True)
            if all(h.finish_reason != "deadline" for h in hypotheses)
        ]
        # The flights stay (answered) until their sentences are stored: a request that comes
        # meanwhile joins them rather than missing the store.
        self._background(self._stored(finished, claimed), keys, flights)
        return dict(zip(owned, decoded, strict=True))

    def _await_elsewhere(
        self, keys: Sequence[bytes], positions: list[int], deadline: float
    ) -> dict[int, asyncio.Future[list[Hypothesis] | None]]:
        """Flights for the sentences another replica decodes (SharedFlights.wait), which the
        requests of this process join; one answered None is decoded by its joiners."""
        assert self._shared is not None
        shared = self._shared
        loop = asyncio.get_running_loop()
        flights = {i: loop.create_future() for i in positions}
        for i, flight in flights.items():
            self._flights[keys[i]] = flight

        async def wait() -> None:
            found: list[list[Hypothesis] | None] = [None] * len(positions)
            try:
                found = await shared.wait([keys[i] for i in positions], deadline)
            finally:
                for flight, hypotheses in zip(flights.values(), found, strict=True):
                    flight.set_result(hypotheses)
                self._land(keys, flights)

        self._background(wait(), keys, {})
        return flights

    async def _stored(
        self, entries: list[tuple[bytes, list[Hypothesis]]], claimed: list[bytes]
    ) -> None:
        """Store what was decoded, then give up this process's claims on it: the replicas
        waiting read the entries, and decode those not stored."""
        await self.store.put(entries)
        if self._shared is not None:
            await self._shared.store(entries, claimed)

    def _background(
        self,
        work: Awaitable[None],
        keys: Sequence[bytes],
        flights: dict[int, asyncio.Future[list[Hypothesis] | None]],
    ) -> None:
        """`work` in a task of its own (kept until done), then these flights over."""
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(lambda _: self._land(keys, flights))

    def _land(
        self, keys: Sequence[bytes], flights: dict[int, asyncio.Future[list[Hypothesis] | None]]
    ) -> None:
        """These flights (by position in `keys`) are over."""
        for i, flight in flights.items():
            if self._flights.get(keys[i]) is flight:
                del self._flights[keys[i]]
        self._writes = {task for task in self._writes if not task.done()}


async def _within(
    flight: asyncio.Future[list[Hypothesis] | None], deadline: float
) -> list[Hypothesis] | None:
    """The flight's hypotheses, waited for until `deadline` (time.monotonic())."""
    try:
        async with asyncio.timeout(deadline - time.monotonic()):
            return await asyncio.shield(flight)
    except TimeoutError:
        raise ServiceError(ErrorType.DECODING_TIMEOUT, DECODING_TIMEOUT_MESSAGE) from None
