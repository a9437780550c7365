"""Step-level batching (service/inference/running.py) on the shipped model: sentences that join
and leave running batches at random step boundaries, with mixed options, decoder prefixes and
cancellations, get what they get decoded alone; slots are reused, never reallocated when one
joins; and through the batcher a short request is answered while a long one still runs."""

from __future__ import annotations

import asyncio
import gzip
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.bundle.decoding import NO_CONSTRAINTS, Constraints, DecodingOptions, Hypothesis
from service.inference import running as running_module
from service.inference import step_state
from service.inference.engine import Engine
from service.inference.running import Running, _Batch
from service.inference.step_state import step_macs_per_row
from service.metrics import Metrics
from service.scheduling.batcher import Batcher, BatchLimits
from tests.service.helpers import alignment_runs, step_runs

VAL = Path(__file__).resolve().parents[3] / "shared/data/multi30k/val.en.gz"
# The first three share beam sizes with and without alignments (a batch computes them for the
# searches that keep them; the others get none).
OPTIONS = [
    DecodingOptions(alignments=True),
    DecodingOptions(beam_size=4),
    DecodingOptions(beam_size=4, alignments=True),
    DecodingOptions(),
    DecodingOptions(beam_size=5, length_penalty=0.6, alignments=True),
    DecodingOptions(beam_size=2, num_hypotheses=2),
    DecodingOptions(beam_size=4, no_repeat_ngram_size=2),
    DecodingOptions(max_decoding_length=5, alignments=True),
]


@dataclass(eq=False)
class Segment:
    ids: list[int]
    prefix: list[int]
    options: DecodingOptions
    deadline: float = math.inf
    constraints: Constraints = NO_CONSTRAINTS


@pytest.fixture(scope="module")
def engine(shipped_bundle: Path) -> Engine:
    return Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def sentences(engine: Engine) -> list[list[int]]:
    with gzip.open(VAL, "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(40)]
    # Two of four sentences each: the running batch's source width grows and shrinks.
    lines[5], lines[17] = " ".join(lines[5:9]), " ".join(lines[17:21])
    return engine.encode(lines)


def alone(engine: Engine, segment: Segment) -> list[Hypothesis]:
    [nbest] = engine.generate(
        [segment.ids], segment.options, prefixes=[segment.prefix], constraints=[segment.constraints]
    )
    return nbest


def assert_same(got: list[Hypothesis], expected: list[Hypothesis], aligned: bool) -> None:
    """The same n-best list, with alignments as `aligned` (its options') says."""
    assert [(h.ids, h.finish_reason) for h in got] == [(h.ids, h.finish_reason) for h in expected]
    assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-4)
    for g, e in zip(got, expected, strict=True):
        if not aligned:
            assert g.alignment is None and e.alignment is None
            continue
        assert g.alignment is not None and e.alignment is not None
        np.testing.assert_allclose(g.alignment, e.alignment, atol=1e-4)


def drive(
    running: Running, segments: list[Segment], rng: random.Random, cancel: set[int]
) -> dict[int, list[Hypothesis]]:
    """Admit the segments in order, a random few at each step boundary, as slots allow;
    cancel those in `cancel` a random number of steps after they joined."""
    waiting = list(segments)
    joined: dict[int, int] = {}
    got: dict[int, list[Hypothesis]] = {}
    step = 0
    while waiting or running.sentences:
        batch: list[Segment] = []
        room = {b: running.room(b) for b in {s.options.beam_size for s in waiting}}
        for segment in list(waiting)[: rng.randint(0, 3)]:
            if room[segment.options.beam_size]:
                room[segment.options.beam_size] -= 1
                batch.append(segment)
                waiting.remove(segment)
                joined[id(segment)] = step
        for segment, nbest in running.admit(batch):
            got[id(segment)] = nbest
        for i, segment in enumerate(segments):
            if i in cancel and id(segment) in joined and step - joined[id(segment)] == 2:
                segment.deadline = -math.inf
        finished, _ = running.step()
        for segment, nbest in finished:
            assert id(segment) not in got, "answered twice"
            got[id(segment)] = nbest
        step += 1
    return got


class AnyOrder(Running):
    """Steps a random running batch (Running picks the one with the least decoder time: an
    order that depends on the clock): whatever the order, every sentence's result is its own."""

    def __init__(self, engine: Engine, slots: int, rng: random.Random) -> None:
        super().__init__(engine, slots)
        self.rng = rng

    def step(self) -> tuple[list[tuple[Any, list[Hypothesis]]], int]:
        live = self._live()
        if not live:
            return [], 0
        batch = self.rng.choice(live)
        return batch.step(), batch.n * batch.beam_size


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_joining_and_leaving_between_steps_changes_no_translation(
    engine: Engine, sentences: list[list[int]], seed: int
) -> None:
    """Seeds 0-2 step the batches in a random order (seed 0 once found buffers replaced twice
    between two steps, which left the step bound to the old ones); seed 3 as the service does.
    A fifth of the sentences have a term ("Hund", "Rad" or "Gasse": constrained beam search,
    greedy ones too), searched with the others."""
    rng = random.Random(seed)
    segments = [
        Segment(ids, [rng.randrange(4, 1000)] if rng.random() < 0.2 else [], rng.choice(OPTIONS))
        for ids in rng.sample(sentences, len(sentences))
    ]
    for segment in rng.sample(segments, len(segments) // 5):
        segment.constraints = Constraints(((rng.choice([485, 1505, 4331]),),))
    expected = [alone(engine, s) for s in segments]
    cancel = set(rng.sample(range(len(segments)), 4))
    running = Running(engine, 6) if seed == 3 else AnyOrder(engine, 6, random.Random(seed))
    got = drive(running, segments, rng, cancel)
    assert len(got) == len(segments)
    for i, (segment, nbest) in enumerate(zip(segments, expected, strict=True)):
        result = got[id(segment)]
        if i in cancel and result[0].finish_reason == "deadline":
            # It left at the step after its deadline passed, with what it had by then.
            [stopped] = result
            assert stopped.ids == nbest[0].ids[: len(stopped.ids)] or segment.options.beam_size > 1
        else:  # finished before its deadline passed, or never cancelled
            assert_same(result, nbest, segment.options.alignments)


def test_with_a_shortlist_joining_and_leaving_changes_no_translation(
    shortlist_bundle: Path, sentences: list[list[int]]
) -> None:
    """The running batch's shortlist is the union of its sentences' ids, remade whenever one
    joins or leaves; each sentence's mask keeps it to its own, so what it gets is its own."""
    engine = Engine.load(shortlist_bundle, device="cpu", intra_op_threads=1)
    rng = random.Random(4)
    segments = [Segment(ids, [], rng.choice(OPTIONS[:4])) for ids in sentences[:24]]
    expected = [alone(engine, s) for s in segments]
    got = drive(AnyOrder(engine, 5, rng), segments, rng, set())
    for segment, nbest in zip(segments, expected, strict=True):
        assert_same(got[id(segment)], nbest, segment.options.alignments)


def test_steps_move_between_the_wide_and_narrow_sessions_with_their_rows(
    shipped_bundle: Path,
    engine: Engine,
    sentences: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With two intra-op threads a running batch of fewer than `narrow_rows` rows (12 here)
    steps on the one-thread session, and moves between the two as sentences join and leave
    (every step on the session its rows call for: a beam batch of 3-5 sentences has 12 rows or
    more, of 1-2 fewer): what each sentence gets is what it gets decoded alone on one thread."""
    per_row = step_macs_per_row(engine.manifest.model)
    monkeypatch.setattr(step_state, "NARROW_STEP_MACS", 12 * per_row)
    monkeypatch.setattr(step_state, "MIN_NARROW_ROWS", 1)  # a model this small gets it
    two = Engine.load(shipped_bundle, device="cpu", intra_op_threads=2)
    sessions = two.step_sessions
    assert sessions.narrow is not None and sessions.narrow_rows == 12
    ran = step_runs(monkeypatch)  # each step's session and rows
    rng = random.Random(5)
    segments = [Segment(ids, [], rng.choice(OPTIONS[:3])) for ids in sentences[:20]]
    got = drive(AnyOrder(two, 5, rng), segments, rng, set())
    assert all(session is sessions.for_rows(rows) for session, rows in ran)
    assert {rows < 12 for _, rows in ran if rows > 5} == {True, False}  # beam batches moved
    for segment in segments:
        assert_same(got[id(segment)], alone(engine, segment), segment.options.alignments)


def test_slots_are_reused_and_joining_moves_nothing(
    engine: Engine, sentences: list[list[int]]
) -> None:
    running = Running(engine, slots=4)
    options = DecodingOptions(beam_size=4)
    first = [Segment(ids, [], options) for ids in sentences[:2]]
    running.admit(first)
    running.step()
    [batch] = running._batches.values()
    assert isinstance(batch, _Batch)
    cache = {name: buffer for name, buffer in batch._cache.items()}
    before = {name: buffer[: 2 * 4, :, :1].copy() for name, buffer in cache.items()}
    running.admit([Segment(ids, [], options) for ids in sentences[2:4]])
    assert running.room(4) == 0
    with pytest.raises(ValueError, match="no room"):
        running.admit([Segment(sentences[5], [], options)])
    for name, buffer in batch._cache.items():  # the same memory, the running rows unmoved
        assert buffer is cache[name]
        np.testing.assert_array_equal(buffer[: 2 * 4, :, :1], before[name])
    done = 0
    while running.sentences:
        finished, rows = running.step()
        assert rows <= 4 * 4
        done += len(finished)
    assert done == 4
    size = running.usage().cache_bytes
    for ids in sentences[4:20]:  # many more through the same slots: no more memory
        running.admit([Segment(ids, [], options)])
        while running.sentences:
            running.step()
    assert running.usage().cache_bytes <= 2 * size  # at most a wider source or a longer cache
    assert running.usage().sentences == 0


def test_a_running_batch_computes_the_alignment_while_a_search_keeps_it(
    engine: Engine, sentences: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps skip the aligner's nodes while no running search keeps alignment rows, run them
    from the step one joins until it leaves."""
    runs = alignment_runs(monkeypatch)
    running = Running(engine, slots=4)
    by_length = sorted(sentences, key=len)  # the aligned one ends first
    plain = [Segment(ids, [], DecodingOptions(beam_size=4)) for ids in by_length[-2:]]
    running.admit(plain)
    for _ in range(2):
        running.step()
    aligned = Segment(by_length[0], [], DecodingOptions(beam_size=4, alignments=True))
    running.admit([aligned])
    gates, ended = [], {}
    while running.sentences:
        finished, _ = running.step()
        gates.append(runs[-1][0])
        ended.update({id(segment): (len(gates), nbest) for segment, nbest in finished})
    assert [gate for gate, _ in runs[:2]] == [False, False]
    last, [best] = ended[id(aligned)]
    assert gates[:last] == [True] * last  # from its first step to its last
    assert len(gates) > last and not any(gates[last:])  # then no more
    assert best.alignment is not None and len(best.alignment) == len(best.ids)
    assert all(h.alignment is None for s in plain for _, nbest in [ended[id(s)]] for h in nbest)


def test_a_bad_sentence_admits_none(engine: Engine, sentences: list[list[int]]) -> None:
    running = Running(engine, slots=4)
    too_long = [5] * (engine.max_input_tokens + 1)
    with pytest.raises(ValueError):
        running.admit(
            [Segment(sentences[0], [], DecodingOptions()), Segment(too_long, [], DecodingOptions())]
        )
    assert running.sentences == 0


def test_a_search_that_fails_to_start_admits_none(
    engine: Engine, sentences: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running.admit is all or nothing even where a search fails at its start, after its
    batch gave it slots: they are free again, and the batch runs the next ones."""
    running = Running(engine, slots=4)
    greedy, beam = DecodingOptions(), DecodingOptions(beam_size=4)
    running.admit([Segment(sentences[0], [], greedy)])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a search that cannot start (test)")
        yield  # a generator, as search_steps

    monkeypatch.setattr(running_module, "search_steps", broken)
    with pytest.raises(RuntimeError):
        running.admit([Segment(sentences[1], [], beam), Segment(sentences[2], [], greedy)])
    assert running.load(4)[0] == 0 and running.load(1)[0] == 1  # only the first one runs
    monkeypatch.undo()
    segments = [Segment(s, [], o) for s, o in zip(sentences[1:3], (beam, greedy), strict=True)]
    running.admit(segments)
    got = {}
    while running.sentences:
        got.update({id(s): nbest for s, nbest in running.step()[0]})
    for segment in segments:
        assert_same(got[id(segment)], alone(engine, segment), aligned=False)


@pytest.mark.anyio
async def test_a_short_request_is_answered_while_a_long_one_runs(
    engine: Engine, sentences: list[list[int]]
) -> None:
    limits = BatchLimits(max_batch_size=32, max_batch_tokens=4096, max_wait_s=0, max_queue=100)
    metrics = Metrics()
    stepper = engine.stepper(limits.max_batch_size)
    assert stepper is not None
    batcher = Batcher(engine.generate, model="m", limits=limits, metrics=metrics, stepper=stepper)
    batcher.start()
    order: list[str] = []

    async def request(name: str, sources: list[list[int]], options: DecodingOptions) -> None:
        await batcher.submit(sources, options, deadline=math.inf)
        order.append(name)

    try:
        long = asyncio.create_task(request("long", sentences[:30], DecodingOptions(beam_size=5)))
        await asyncio.sleep(0.05)  # the long one is running
        await request("short", sentences[30:31], DecodingOptions())
        assert order == ["short"]
        await long
        # A cancelled request's sentences leave the running batch at the next step.
        cancelled = asyncio.create_task(
            request("cancelled", sentences[:30], DecodingOptions(beam_size=5))
        )
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        for _ in range(100):
            if not stepper.sentences:
                break
            await asyncio.sleep(0.01)
        assert stepper.sentences == 0
        stopped = metrics.registry.get_sample_value(
            "mt_stopped_segments_total", {"model": "m", "reason": "cancelled"}
        )
        assert stopped is not None and stopped > 0
    finally:
        assert await batcher.stop(10.0)
    assert order == ["short", "long"]


@pytest.mark.anyio
async def test_a_drain_finishes_the_running_sentences(
    engine: Engine, sentences: list[list[int]]
) -> None:
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=4096, max_wait_s=0, max_queue=100)
    stepper = engine.stepper(limits.max_batch_size)
    batcher = Batcher(engine.generate, model="m", limits=limits, metrics=Metrics(), stepper=stepper)
    batcher.start()
    # 12 sentences through 4 slots: most are queued when the drain starts.
    request = asyncio.create_task(
        batcher.submit(sentences[:12], DecodingOptions(beam_size=4), deadline=math.inf)
    )
    await asyncio.sleep(0.02)
    assert await batcher.stop(30.0)
    nbest = await request
    assert [n[0].ids for n in nbest] == [
        h[0].ids for h in engine.generate(sentences[:12], DecodingOptions(beam_size=4))
    ]
