"""service/scheduling/batcher.py alone, over a fake engine: batching, limits, cancellation,
deadlines, failures and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from service.bundle.decoding import Deadline, DecodingOptions, Hypothesis
from service.errors import ErrorType, ServiceError
from service.inference.running import Usage
from service.metrics import Metrics
from service.scheduling import batcher as batcher_module
from service.scheduling.batcher import STARVING_S, Batcher, BatchLimits
from tests.service.helpers import FakeModel, async_wait_for

pytestmark = pytest.mark.anyio

GREEDY = DecodingOptions()
FAR = float("inf")


def limits(**overrides: float) -> BatchLimits:
    values: dict[str, float] = dict(
        max_batch_size=64, max_batch_tokens=10_000, max_wait_s=0.05, max_queue=100
    )
    values.update(overrides)
    return BatchLimits(**values)  # type: ignore[arg-type]


@pytest.fixture
async def started(fake: FakeModel) -> AsyncIterator[tuple[Batcher, Metrics]]:
    metrics = Metrics()
    batcher = Batcher(fake.generate, model=fake.name, limits=limits(), metrics=metrics)
    batcher.start()
    yield batcher, metrics
    await batcher.stop(1.0)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text] + [2]


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_concurrent_submits_share_one_batch_and_keep_their_order(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    batcher, metrics = started
    requests = [[ids("ccc"), ids("a")], [ids("bb")], [ids("dddd"), ids("e"), ids("ff")]]
    results = await asyncio.gather(*(batcher.submit(r, GREEDY, deadline=FAR) for r in requests))
    assert fake.batch_sizes == [6]
    # Sorted by length for the engine, answered in each request's own order.
    assert [len(s) for s in fake.calls[0][0]] == sorted(len(s) for r in requests for s in r)
    for request, hypotheses in zip(requests, results, strict=True):
        assert [h[0].ids for h in hypotheses] == [s[:-1] for s in request]
    assert sample(metrics, "mt_batch_size_segments_count", model=fake.name) == 1
    assert sample(metrics, "mt_batch_size_segments_sum", model=fake.name) == 6
    assert sample(metrics, "mt_input_tokens_total", model=fake.name) == 19
    assert sample(metrics, "mt_generated_tokens_total", model=fake.name) == 13


async def test_one_request_with_options_of_its_own_per_sentence_is_queued_whole(
    fake: FakeModel,
) -> None:
    """A request's sentences may each have their options (markup asks some only for their
    alignment): one submission, queued whole or refused whole, batched by options, answered
    in order."""
    metrics = Metrics()
    batcher = Batcher(fake.generate, model=fake.name, limits=limits(max_queue=3), metrics=metrics)
    batcher.start()
    aligned = DecodingOptions(alignments=True)
    try:
        with pytest.raises(ServiceError) as refused:  # four of a queue of three: none queued
            await batcher.submit([ids("a")] * 4, [GREEDY, aligned] * 2, deadline=FAR)
        assert refused.value.type is ErrorType.INVALID_REQUEST and batcher.depth == 0
        sources = [ids("one"), ids("two"), ids("three")]
        nbest = await batcher.submit(sources, [GREEDY, aligned, GREEDY], deadline=FAR)
    finally:
        await batcher.stop(1.0)
    assert [h[0].ids for h in nbest] == [s[:-1] for s in sources]
    assert sorted((len(batch), options) for batch, options in fake.calls) == [
        (1, aligned),
        (2, GREEDY),
    ]


async def test_batch_size_and_token_budget_are_respected(fake: FakeModel) -> None:
    metrics = Metrics()
    batcher = Batcher(
        fake.generate,
        model="m",
        limits=limits(max_batch_size=3, max_batch_tokens=20),
        metrics=metrics,
    )
    batcher.start()
    try:
        sources = [ids("x" * 4)] * 7 + [ids("y" * 30)]  # 5 tokens each; one of 31
        await batcher.submit(sources, GREEDY, deadline=FAR)
    finally:
        await batcher.stop(1.0)
    # 3 x 5 <= 20 but 4 x 5 > 20 and size <= 3; the long one goes alone, over the budget.
    assert sorted(fake.batch_sizes) == [1, 1, 3, 3]
    for sources_, _ in fake.calls:
        assert len(sources_) == 1 or len(sources_) * max(map(len, sources_)) <= 20


async def test_different_options_are_never_mixed(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    batcher, _ = started
    beam = DecodingOptions(beam_size=2, num_hypotheses=2)
    greedy, nbest = await asyncio.gather(
        batcher.submit([ids("a"), ids("b")], GREEDY, deadline=FAR),
        batcher.submit([ids("c")], beam, deadline=FAR),
    )
    assert sorted(fake.batch_sizes) == [1, 2]
    assert {options for _, options in fake.calls} == {GREEDY, beam}
    assert [len(h) for h in greedy] == [1, 1]
    assert [len(h) for h in nbest] == [2]


async def test_a_full_queue_refuses_the_whole_request(fake: FakeModel) -> None:
    fake.gate = threading.Event()
    batcher = Batcher(fake.generate, model="m", limits=limits(max_queue=3), metrics=Metrics())
    batcher.start()
    try:
        running = asyncio.ensure_future(batcher.submit([ids("a")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)  # the engine holds "a"; queue empty
        queued = asyncio.ensure_future(batcher.submit([ids("b"), ids("c")], GREEDY, deadline=FAR))
        await async_wait_for(lambda: batcher.depth == 2)
        with pytest.raises(ServiceError) as refused:
            await batcher.submit([ids("d"), ids("e")], GREEDY, deadline=FAR)
        assert refused.value.type is ErrorType.QUEUE_FULL
        assert batcher.depth == 2  # nothing of the refused request was queued
        fake.gate.set()
        await asyncio.gather(running, queued)
    finally:
        fake.gate.set()
        await batcher.stop(1.0)


async def test_cancelled_waiters_are_dropped_before_decoding(fake: FakeModel) -> None:
    fake.gate = threading.Event()
    metrics = Metrics()
    batcher = Batcher(fake.generate, model="m", limits=limits(), metrics=metrics)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.submit([ids("first")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)
        gone = asyncio.ensure_future(
            batcher.submit([ids("gone"), ids("gone2")], GREEDY, deadline=FAR)
        )
        kept = asyncio.ensure_future(batcher.submit([ids("kept")], GREEDY, deadline=FAR))
        await async_wait_for(lambda: batcher.depth == 3)
        gone.cancel()  # what the API does when the client disconnects
        fake.gate.set()
        await first
        assert [h[0].ids for h in await kept] == [ids("kept")[:-1]]
    finally:
        fake.gate.set()
        await batcher.stop(1.0)
    decoded = [s for sources, _ in fake.calls for s in sources]
    assert ids("gone") not in decoded and ids("gone2") not in decoded
    assert sample(metrics, "mt_dropped_segments_total", reason="cancelled") == 2


async def test_segments_past_their_deadline_are_dropped(fake: FakeModel) -> None:
    fake.gate = threading.Event()
    metrics = Metrics()
    batcher = Batcher(fake.generate, model="m", limits=limits(), metrics=metrics)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.submit([ids("first")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)
        late = asyncio.ensure_future(
            batcher.submit([ids("late")], GREEDY, deadline=time.monotonic() + 0.01)
        )
        await asyncio.sleep(0.05)
        fake.gate.set()
        await first
        with pytest.raises(ServiceError) as expired:
            await late
    finally:
        fake.gate.set()
        await batcher.stop(1.0)
    assert expired.value.type is ErrorType.DEADLINE_EXCEEDED
    assert fake.batch_sizes == [1]
    assert sample(metrics, "mt_dropped_segments_total", reason="deadline") == 1


async def test_an_engine_failure_reaches_only_its_batch(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    batcher, _ = started
    with pytest.raises(ServiceError) as failed:
        await batcher.submit([ids("FAIL"), ids("ok")], GREEDY, deadline=FAR)
    assert failed.value.type is ErrorType.INTERNAL
    assert "exploded" not in failed.value.message  # no internals to the client
    results = await batcher.submit([ids("fine")], GREEDY, deadline=FAR)
    assert results[0][0].ids == ids("fine")[:-1]
    assert batcher.running


async def test_the_engine_runs_off_the_event_loop_one_call_at_a_time(fake: FakeModel) -> None:
    threads: set[str] = set()
    busy = threading.Lock()

    def generate(
        sources: list[list[int]],
        options: DecodingOptions,
        deadline: Deadline,
        prefixes: list[list[int]],
        constraints: list[tuple[tuple[int, ...], ...]],
    ) -> object:
        assert busy.acquire(blocking=False), "two engine calls at once"
        try:
            threads.add(threading.current_thread().name)
            time.sleep(0.01)
            return fake.generate(sources, options, deadline, prefixes)
        finally:
            busy.release()

    batcher = Batcher(generate, model="m", limits=limits(max_batch_size=1), metrics=Metrics())  # type: ignore[arg-type]
    batcher.start()
    try:
        await asyncio.gather(
            *(batcher.submit([ids(str(i))], GREEDY, deadline=FAR) for i in range(5))
        )
    finally:
        await batcher.stop(1.0)
    assert fake.batch_sizes == [1] * 5
    assert len(threads) == 1 and threading.main_thread().name not in threads


async def test_stop_finishes_queued_work_then_refuses(fake: FakeModel) -> None:
    batcher = Batcher(fake.generate, model="m", limits=limits(max_wait_s=0.2), metrics=Metrics())
    batcher.start()
    pending = asyncio.ensure_future(batcher.submit([ids("a"), ids("b")], GREEDY, deadline=FAR))
    await async_wait_for(lambda: batcher.depth == 2)
    assert await batcher.stop(5.0) is True  # does not wait for the 200 ms window
    assert len(await pending) == 2
    assert not batcher.running
    with pytest.raises(ServiceError) as refused:
        await batcher.submit([ids("c")], GREEDY, deadline=FAR)
    assert refused.value.type is ErrorType.UNAVAILABLE


async def test_stop_after_its_timeout_fails_what_is_left(fake: FakeModel) -> None:
    fake.gate = threading.Event()
    batcher = Batcher(fake.generate, model="m", limits=limits(max_batch_size=1), metrics=Metrics())
    batcher.start()
    first = asyncio.ensure_future(batcher.submit([ids("a")], GREEDY, deadline=FAR))
    await asyncio.to_thread(fake.entered.wait, 5)
    second = asyncio.ensure_future(batcher.submit([ids("b")], GREEDY, deadline=FAR))
    await async_wait_for(lambda: batcher.depth == 1)
    assert await batcher.stop(0.05) is False
    fake.gate.set()
    for waiter in (first, second):  # decoding and queued: both told, nobody waits forever
        with pytest.raises(ServiceError) as told:
            await waiter
        assert told.value.type is ErrorType.UNAVAILABLE


async def test_a_request_larger_than_the_queue_is_refused_for_good(fake: FakeModel) -> None:
    batcher = Batcher(fake.generate, model="m", limits=limits(max_queue=3), metrics=Metrics())
    batcher.start()
    try:
        with pytest.raises(ServiceError) as refused:  # on an idle server: never admissible
            await batcher.submit([ids(c) for c in "abcd"], GREEDY, deadline=FAR)
        assert refused.value.type is ErrorType.INVALID_REQUEST  # 422, no Retry-After
        assert "max_queue_segments" in refused.value.message and "3" in refused.value.message
        assert len(await batcher.submit([ids(c) for c in "abc"], GREEDY, deadline=FAR)) == 3
    finally:
        await batcher.stop(1.0)


async def test_a_cancelled_request_leaves_the_queue_at_once(fake: FakeModel) -> None:
    """While the engine is busy, the worker does not look at the queue: a cancelled request's
    segments must not keep counting against the limit (a false 429) nor in the gauge."""
    fake.gate = threading.Event()
    metrics = Metrics()
    batcher = Batcher(fake.generate, model="m", limits=limits(max_queue=3), metrics=metrics)
    batcher.start()
    try:
        busy = asyncio.ensure_future(batcher.submit([ids("busy")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)  # the engine holds "busy" until the gate
        full = asyncio.ensure_future(batcher.submit([ids(c) for c in "abc"], GREEDY, deadline=FAR))
        await async_wait_for(lambda: batcher.depth == 3)
        assert sample(metrics, "mt_queue_depth_segments", model="m") == 3
        full.cancel()
        await asyncio.wait({full})
        assert batcher.depth == 0
        assert sample(metrics, "mt_queue_depth_segments", model="m") == 0
        assert sample(metrics, "mt_dropped_segments_total", reason="cancelled") == 3
        again = asyncio.ensure_future(batcher.submit([ids(c) for c in "xyz"], GREEDY, deadline=FAR))
        await async_wait_for(lambda: batcher.depth == 3)  # accepted, not 429
        fake.gate.set()
        assert len(await again) == 3 and len(await busy) == 1
    finally:
        fake.gate.set()
        await batcher.stop(1.0)


async def test_expired_segments_do_not_hold_the_queue_while_the_engine_is_busy(
    fake: FakeModel,
) -> None:
    fake.gate = threading.Event()
    metrics = Metrics()
    batcher = Batcher(fake.generate, model="m", limits=limits(max_queue=2), metrics=metrics)
    batcher.start()
    try:
        busy = asyncio.ensure_future(batcher.submit([ids("busy")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)
        late = asyncio.ensure_future(
            batcher.submit([ids("a"), ids("b")], GREEDY, deadline=time.monotonic() + 0.01)
        )
        await async_wait_for(lambda: batcher.depth == 2)
        await asyncio.sleep(0.05)  # past its deadline, the engine still busy
        again = asyncio.ensure_future(batcher.submit([ids("c")], GREEDY, deadline=FAR))
        with pytest.raises(ServiceError) as expired:
            await late  # told now, not when the engine call ends
        assert expired.value.type is ErrorType.DEADLINE_EXCEEDED
        await async_wait_for(lambda: batcher.depth == 1)  # "c" alone
        fake.gate.set()
        assert len(await again) == 1 and len(await busy) == 1
    finally:
        fake.gate.set()
        await batcher.stop(1.0)
    assert sample(metrics, "mt_dropped_segments_total", reason="deadline") == 2


async def test_a_dead_worker_refuses_new_work_and_stop_still_cleans_up(
    fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher = Batcher(fake.generate, model="m", limits=limits(max_wait_s=5.0), metrics=Metrics())
    batcher.start()
    pending = asyncio.ensure_future(batcher.submit([ids("a")], GREEDY, deadline=FAR))
    await async_wait_for(lambda: batcher.depth == 1)

    def bug(options: DecodingOptions) -> bool:
        raise RuntimeError("a bug in the worker (test)")

    monkeypatch.setattr(batcher, "_batch_is_full", bug)
    batcher._arrived.set()  # wakes the worker, which now crashes
    with pytest.raises(ServiceError) as failed:
        await pending  # told, not left waiting
    assert failed.value.type is ErrorType.INTERNAL
    await async_wait_for(lambda: not batcher.running)
    with pytest.raises(ServiceError) as refused:  # not queued for a worker that is gone
        await asyncio.wait_for(batcher.submit([ids("b")], GREEDY, deadline=FAR), 5)
    assert refused.value.type is ErrorType.UNAVAILABLE
    assert batcher.depth == 0
    # Does not re-raise the worker's error, nor wait out its timeout for work that is gone.
    assert await asyncio.wait_for(batcher.stop(60), 10) is False
    assert batcher._executor._shutdown  # type: ignore[attr-defined]


async def test_a_cancelled_request_leaves_its_batch_and_the_others_are_answered(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    """Cancelling a request while its segments are decoded moves their deadline to the past:
    the engine drops them at its next step (counted), the batch's other segments go on."""
    batcher, metrics = started
    fake.gate = threading.Event()
    gone = asyncio.ensure_future(batcher.submit([ids("gone"), ids("too")], GREEDY, deadline=FAR))
    kept = asyncio.ensure_future(batcher.submit([ids("kept")], GREEDY, deadline=FAR))
    await asyncio.to_thread(fake.entered.wait, 5)
    await asyncio.sleep(0.01)  # both requests are in the running batch
    gone.cancel()
    await asyncio.wait({gone})  # its segments' deadlines moved before the engine reads them
    fake.gate.set()
    [[kept_hypothesis]] = await kept
    assert kept_hypothesis.ids == ids("kept")[:-1]
    assert gone.cancelled()
    assert fake.batch_sizes == [3]
    labels = {"model": fake.name, "reason": "cancelled"}
    await async_wait_for(lambda: sample(metrics, "mt_stopped_segments_total", **labels) == 2)


async def test_a_request_past_its_deadline_is_answered_at_once_not_when_its_batch_ends(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    """Two requests decoded in one batch: the one whose deadline passes gets its 504 then,
    while the batch still runs for the other; the engine drops it at its next step."""
    batcher, metrics = started
    fake.gate = threading.Event()
    try:
        soon = asyncio.ensure_future(
            batcher.submit([ids("soon")], GREEDY, deadline=time.monotonic() + 0.3)
        )
        later = asyncio.ensure_future(batcher.submit([ids("later")], GREEDY, deadline=FAR))
        await asyncio.to_thread(fake.entered.wait, 5)
        with pytest.raises(ServiceError) as timed_out:
            await soon
        assert timed_out.value.type is ErrorType.DECODING_TIMEOUT
        assert not later.done() and fake.batch_sizes == [2]
    finally:
        fake.gate.set()
    [[hypothesis]] = await later
    assert hypothesis.ids == ids("later")[:-1]
    labels = {"model": fake.name, "reason": "deadline"}
    await async_wait_for(lambda: sample(metrics, "mt_stopped_segments_total", **labels) == 1)


async def test_a_segment_the_engine_stops_as_its_requests_timer_fires_counts_as_deadline(
    started: tuple[Batcher, Metrics], fake: FakeModel
) -> None:
    """The engine's answer (the segment stopped at its deadline) and the request's timer are
    due in the same turn of the event loop: the timer cancels the request's futures first, and
    its handler runs after the batch's. The stop is still counted as a deadline (it was counted
    as "cancelled", and CI's service test waiting for a deadline stop failed on it)."""
    batcher, metrics = started
    fake.gate = threading.Event()
    deadline = time.monotonic() + 0.2
    late = asyncio.ensure_future(batcher.submit([ids("late")], GREEDY, deadline=deadline))
    await asyncio.to_thread(fake.entered.wait, 5)
    # The event loop held past the deadline while the engine returns: when it looks again, the
    # engine's answer is queued before the timer.
    time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)
    fake.gate.set()
    time.sleep(0.2)
    with pytest.raises(ServiceError) as timed_out:
        await late
    assert timed_out.value.type is ErrorType.DECODING_TIMEOUT
    labels = {"model": fake.name}
    await async_wait_for(
        lambda: sample(metrics, "mt_stopped_segments_total", **labels, reason="deadline") == 1
    )
    assert sample(metrics, "mt_stopped_segments_total", **labels, reason="cancelled") == 0


async def test_stop_without_time_to_drain_an_idle_batcher_has_drained(fake: FakeModel) -> None:
    batcher = Batcher(fake.generate, model="m", limits=limits(), metrics=Metrics())
    batcher.start()
    assert len(await batcher.submit([ids("a")], GREEDY, deadline=FAR)) == 1
    assert await batcher.stop(0) is True  # the drain time used up, but nothing was left


class FakeStepper:
    """Step-level batching over a fake engine: each admitted segment runs `steps` steps and
    translates to its own ids; `fail_at` makes that step raise."""

    slots = 4

    def __init__(self, steps: int = 3, fail_at: int | None = None) -> None:
        self.running: list[list[Any]] = []  # [segment, steps left]
        self.steps, self.fail_at, self.stepped = steps, fail_at, 0

    @property
    def sentences(self) -> int:
        return len(self.running)

    def load(self, beam_size: int) -> tuple[int, int]:
        return len(self.running), max((len(s.ids) for s, _ in self.running), default=0)

    def usage(self) -> Usage:
        return Usage(len(self.running), self.slots, 0)

    def admit(self, segments: Sequence[Any]) -> list[Any]:
        self.running += [[s, self.steps] for s in segments]
        return []

    def step(self) -> tuple[list[Any], int]:
        if not self.running:
            return [], 0
        self.stepped += 1
        if self.stepped == self.fail_at:
            raise RuntimeError("the engine broke")
        time.sleep(0.002)
        rows = len(self.running)
        for entry in self.running:
            entry[1] -= 1
        done = [e for e in self.running if not e[1]]
        self.running = [e for e in self.running if e[1]]
        return [(s, [Hypothesis(s.ids[:-1], 0.0, "eos")]) for s, _ in done], rows

    def clear(self) -> None:
        self.running = []


async def test_step_level_a_long_segment_is_not_passed_over_by_short_ones() -> None:
    """The long one does not fit the token budget beside the running short ones; the short
    ones that keep arriving must not take every slot it waits for."""
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=8, max_wait_s=0, max_queue=1000)
    batcher = Batcher(
        FakeModel().generate, model="m", limits=limits, metrics=Metrics(), stepper=FakeStepper()
    )
    batcher.start()
    stop = False
    sent: list[asyncio.Task[Any]] = []

    async def shorts() -> None:
        while not stop:
            short = batcher.submit([ids("")], GREEDY, deadline=time.monotonic() + 10)
            sent.append(asyncio.create_task(short))
            await asyncio.sleep(0.002)

    task = asyncio.create_task(shorts())
    try:
        await asyncio.sleep(0.05)
        [nbest] = await batcher.submit([ids("long")], GREEDY, deadline=time.monotonic() + 2)
        assert nbest[0].ids == ids("long")[:-1]
    finally:
        stop = True
        await task
        assert await batcher.stop(5)
        shorts_answered = await asyncio.gather(*sent, return_exceptions=True)
        assert not [r for r in shorts_answered if isinstance(r, BaseException)]


async def test_step_level_an_engine_failure_fails_the_running_segments_and_goes_on() -> None:
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=100, max_wait_s=0, max_queue=100)
    stepper = FakeStepper(steps=5, fail_at=3)
    metrics = Metrics()
    batcher = Batcher(
        FakeModel().generate, model="m", limits=limits, metrics=metrics, stepper=stepper
    )
    batcher.start()
    try:
        results = await asyncio.gather(
            *(batcher.submit([ids("ab"), ids("c")], GREEDY, deadline=FAR) for _ in range(2)),
            return_exceptions=True,
        )
        assert all(isinstance(r, ServiceError) and r.type is ErrorType.INTERNAL for r in results), (
            results
        )
        assert not batcher._decoding  # nothing counted as running
        [nbest] = await batcher.submit([ids("d")], GREEDY, deadline=FAR)  # the worker goes on
        assert nbest[0].ids == ids("d")[:-1]
        assert sample(metrics, "mt_running_segments", model="m") == 0
    finally:
        assert await batcher.stop(5)


async def test_step_level_a_long_request_waiting_its_turn_does_not_go_before_new_ones() -> None:
    """A long request's sentences have waited since it came, longer than STARVING_S: that
    lets one of them in at a time when the running ones keep its turn from it, not all of
    them before a request that arrives with nothing running."""
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=100, max_wait_s=0, max_queue=2000)
    batcher = Batcher(
        FakeModel().generate, model="m", limits=limits, metrics=Metrics(), stepper=FakeStepper()
    )
    batcher.start()
    try:
        long = asyncio.ensure_future(batcher.submit([ids("ab")] * 1500, GREEDY, deadline=FAR))
        await asyncio.sleep(STARVING_S + 0.2)
        assert batcher.depth > 0, "the long request must still be queued (a faster machine?)"
        [nbest] = await batcher.submit([ids("c")], GREEDY, deadline=FAR)
        assert nbest[0].ids == ids("c")[:-1]
        assert batcher.depth > 0  # answered before the long request's queue ran out
        assert len(await long) == 1500
    finally:
        assert await batcher.stop(5)


async def test_background_segments_batch_apart_and_give_way_to_interactive_ones() -> None:
    """A document's sentences (background) never share a batch with a request's and come in
    batches of at most background_batch_size; an interactive request that arrives while they
    are decoded preempts them (their batch stops, they are queued again) and goes next."""
    fake = FakeModel()
    fake.gate = threading.Event()
    batcher = Batcher(
        fake.generate,
        model="m",
        limits=limits(max_wait_s=0, background_batch_size=4),
        metrics=Metrics(),
    )
    batcher.start()
    try:
        document = asyncio.ensure_future(
            batcher.submit([ids(f"d{i}") for i in range(12)], GREEDY, deadline=FAR, background=True)
        )
        await async_wait_for(fake.entered.is_set)  # the first background batch is decoding
        interactive = asyncio.ensure_future(
            batcher.submit([ids("q1"), ids("q2")], GREEDY, deadline=FAR)
        )
        await asyncio.sleep(0.01)
        fake.gate.set()
        translated, _ = await asyncio.gather(document, interactive)
    finally:
        await batcher.stop(1.0)
    batches = [sorted("".join(map(chr, s[:-1])) for s in sources) for sources, _ in fake.calls]
    assert batches[0] == ["d0", "d1", "d2", "d3"]  # preempted
    assert batches[1] == ["q1", "q2"]
    assert [len(b) for b in batches[2:]] == [4, 4, 4]
    assert sorted(d for b in batches[2:] for d in b) == sorted(f"d{i}" for i in range(12))
    assert ["".join(map(chr, n[0].ids)) for n in translated] == [f"d{i}" for i in range(12)]


async def test_step_level_admits_background_only_when_no_request_runs_and_at_most_its_share() -> (
    None
):
    limits = BatchLimits(
        max_batch_size=4, max_batch_tokens=100, max_wait_s=0, max_queue=100, background_batch_size=1
    )
    stepper = FakeStepper(steps=2)
    admitted: list[list[bool]] = []
    admit = stepper.admit

    def spy(segments: Sequence[Any]) -> list[Any]:
        admitted.append([s.background for s in segments])
        return admit(segments)

    stepper.admit = spy  # type: ignore[method-assign]
    batcher = Batcher(
        FakeModel().generate, model="m", limits=limits, metrics=Metrics(), stepper=stepper
    )
    batcher.start()
    try:
        document = batcher.submit([ids("d")] * 3, GREEDY, deadline=FAR, background=True)
        request = batcher.submit([ids("q")] * 2, GREEDY, deadline=FAR)
        await asyncio.gather(document, request)
    finally:
        assert await batcher.stop(5)
    first = next(a for a in admitted if a)
    assert first == [False, False]  # the request's, no background sentence beside them
    assert all(sum(a) <= 1 for a in admitted)
    assert sum(sum(a) for a in admitted) == 3


class LoggingStepper(FakeStepper):
    """A FakeStepper that logs what it admits and every step it runs."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps=steps)
        self.admitted: list[list[Any]] = []
        self.steps_run = 0

    def admit(self, segments: Sequence[Any]) -> list[Any]:
        if segments:
            self.admitted.append(list(segments))
        return super().admit(segments)

    def step(self) -> tuple[list[Any], int]:
        finished, rows = super().step()
        self.steps_run += bool(rows)
        return finished, rows


async def test_background_running_batch_pauses_for_a_request_and_keeps_its_sentences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a background running batch, a document's sentences are never in a request's batch,
    are admitted a whole batch of one options at a time once the batch has emptied, and a
    request that arrives while they run finds them paused, not preempted: none is decoded
    twice, and none steps again before the grace after the request."""
    monkeypatch.setattr(batcher_module, "BACKGROUND_GRACE_S", 0.3)
    fake = FakeModel()
    background = LoggingStepper(steps=40)  # 2 ms a step: a batch runs ~80 ms
    batcher = Batcher(
        fake.generate, model="m", limits=limits(max_wait_s=0), metrics=Metrics(),
        background=background,
    )  # fmt: skip
    beam = DecodingOptions(beam_size=2)
    batcher.start()
    try:
        document = asyncio.ensure_future(
            batcher.submit([ids(f"d{i}") for i in range(6)], GREEDY, deadline=FAR, background=True)
        )
        other = asyncio.ensure_future(
            batcher.submit([ids(f"e{i}") for i in range(2)], beam, deadline=FAR, background=True)
        )
        await async_wait_for(lambda: background.steps_run >= 3)
        [nbest] = await batcher.submit([ids("q")], GREEDY, deadline=FAR)
        answered, paused_at = time.monotonic(), background.steps_run
        assert background.sentences == 4  # kept in their batch, not queued again
        await asyncio.sleep(0.15)
        assert background.steps_run == paused_at  # within the grace after the request
        translated, others = await asyncio.gather(document, other)
        assert time.monotonic() - answered >= 0.3
    finally:
        assert await batcher.stop(5)
    assert nbest[0].ids == ids("q")[:-1]
    assert [s for sources, _ in fake.calls for s in sources] == [ids("q")]
    texts = ["".join(map(chr, s.ids[:-1])) for group in background.admitted for s in group]
    assert texts == ["d0", "d1", "d2", "d3", "d4", "d5", "e0", "e1"]  # each once
    assert [len(group) for group in background.admitted] == [4, 2, 2]  # slots, one options
    assert [n[0].ids for n in translated] == [ids(f"d{i}")[:-1] for i in range(6)]
    assert len(others) == 2


async def test_background_running_batch_moves_under_requests_that_never_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Interactive requests one after another without a pause: the document still finishes
    (a turn every BACKGROUND_PAUSE_S), and the requests are answered meanwhile."""
    monkeypatch.setattr(batcher_module, "BACKGROUND_PAUSE_S", 0.05)
    fake = FakeModel()
    background = LoggingStepper(steps=5)
    batcher = Batcher(
        fake.generate, model="m", limits=limits(max_wait_s=0), metrics=Metrics(),
        background=background,
    )  # fmt: skip
    batcher.start()
    stop = asyncio.Event()
    answered = 0

    async def requests() -> None:
        nonlocal answered
        while not stop.is_set():
            await batcher.submit([ids("q")], GREEDY, deadline=FAR)
            answered += 1

    client = asyncio.ensure_future(requests())
    try:
        await asyncio.sleep(0.05)
        document = batcher.submit([ids("d")] * 8, GREEDY, deadline=FAR, background=True)
        assert len(await asyncio.wait_for(document, 10)) == 8
    finally:
        stop.set()
        await client
        assert await batcher.stop(5)
    assert answered > 20
