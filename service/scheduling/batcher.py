"""The batching room: an asyncio queue of segments in front of one engine.

Requests submit their segments (token ids) with their decoding options and a deadline; one
worker task takes the oldest segment, lets it wait at most `max_wait_s` for company, forms a
batch of segments with the same options under a size and a token budget, runs the engine in a
single worker thread (never on the event loop, never two calls at once) and resolves each
waiter. Segments whose waiter is gone (client disconnected) or whose deadline passed are dropped
before decoding and counted; while decoding, the engine reads each segment's deadline before
every step, so such a segment leaves its batch at the next step (504 decoding_timeout past the
deadline; a cancelled request's segments are moved past theirs), and the rest of the batch goes
on. An engine failure fails that batch's waiters and nothing else.

It knows nothing of HTTP or ONNX Runtime: `generate` is any function with the engine's
signature, which is how the tests drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from service.bundle.decoding import Deadline, DecodingOptions, Hypothesis
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics

log = logging.getLogger(__name__)

# The engine's generate: sources, options, each source's deadline and decoder prefix.
Generate = Callable[
    [list[list[int]], DecodingOptions, Deadline, list[list[int]]], list[list[Hypothesis]]
]


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int  # segments per engine call
    max_batch_tokens: int  # padded source tokens per engine call: size x longest segment
    max_wait_s: float  # how long the oldest segment may wait for the batch to fill
    max_queue: int  # queued segments; a request that would exceed it is refused whole


@dataclass(eq=False)
class _Pending:
    ids: list[int]
    prefix: list[int]  # the ids its translation is forced to start with (Engine.decoder_prefix)
    options: DecodingOptions
    future: asyncio.Future[list[Hypothesis]]
    enqueued: float  # time.monotonic()
    deadline: float  # time.monotonic(); -inf once nobody wants the segment (read while decoding)
    decoding: bool = False  # taken into a batch
    # Why nobody wants it any more, once so: its request's deadline passed, or it went away.
    reason: Literal["deadline", "cancelled"] = "cancelled"


# A request still being decoded when its deadline passes.
_DECODING_TIMEOUT = (
    "the translation was not done within the request's deadline (request_timeout_s); send "
    "less text at once"
)


class Batcher:
    def __init__(
        self, generate: Generate, *, model: str, limits: BatchLimits, metrics: Metrics
    ) -> None:
        self._generate = generate
        self._model = model
        self._limits = limits
        self._metrics = metrics
        self._queue: deque[_Pending] = deque()
        self._arrived = asyncio.Event()  # set on every submit
        self._idle = asyncio.Event()  # queue empty and no engine call running
        self._idle.set()
        self._closed = False
        self._worker: asyncio.Task[None] | None = None
        # One thread: the engine is called by one thread at a time (it creates it lazily).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{model}")

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name=f"batcher-{self._model}")

    async def submit(
        self,
        sources: Sequence[list[int]],
        options: DecodingOptions,
        *,
        deadline: float,
        prefix: Sequence[int] = (),
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each source, in order; `prefix`: the ids their translations are
        forced to start with (a multilingual model's target: requests with different ones
        share batches). All sources are queued or none is: a request is never half-admitted.
        Cancelling the caller takes its segments still queued out of the queue at once."""
        if self._closed:
            raise ServiceError(ErrorType.UNAVAILABLE, "the service is shutting down")
        if not self.running:
            # The worker died (a bug; logged): nobody would ever answer.
            raise ServiceError(ErrorType.UNAVAILABLE, "the translation worker is not running")
        if not sources:
            return []
        if len(sources) > self._limits.max_queue:
            # Never admissible, even on an idle server: not a 429 the client would retry.
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"{len(sources)} sentences in one request; the limit is {self._limits.max_queue} "
                "(max_queue_segments)",
            )
        self._drop_dead()  # expired segments must not keep this request out
        if len(self._queue) + len(sources) > self._limits.max_queue:
            raise ServiceError(
                ErrorType.QUEUE_FULL,
                f"the queue is full ({len(self._queue)} of {self._limits.max_queue} segments "
                f"waiting); retry later",
            )
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        pending = [
            _Pending(list(ids), list(prefix), options, loop.create_future(), now, deadline)
            for ids in sources
        ]
        self._queue.extend(pending)
        self._queue_changed()
        self._idle.clear()
        self._arrived.set()
        futures = [p.future for p in pending]
        try:
            # The whole request's deadline: answered when it passes, whatever the batch its
            # segments are in still has to decode for others (they leave it at its next step).
            async with asyncio.timeout_at(loop.time() + deadline - now):
                return list(await asyncio.gather(*futures))
        except TimeoutError:
            self._abandon(pending, "deadline")
            if any(item.decoding for item in pending):
                raise ServiceError(ErrorType.DECODING_TIMEOUT, _DECODING_TIMEOUT) from None
            raise ServiceError(
                ErrorType.DEADLINE_EXCEEDED,
                "the request waited longer than its deadline; retry later",
            ) from None
        except BaseException:
            # One segment failed or the caller went away: its other segments are not wanted.
            self._abandon(pending, "cancelled")
            raise

    def _abandon(self, items: list[_Pending], reason: Literal["deadline", "cancelled"]) -> None:
        """Nobody waits for these segments any more: those queued leave the queue now (not at
        the worker's next look, which waits for the engine call running), those being decoded
        leave their batch at its next step (their deadline moves to the past)."""
        for item in items:
            item.reason = reason
            item.future.cancel()
            item.deadline = -math.inf
        mine = set(items)
        kept = deque(item for item in self._queue if item not in mine)
        if len(kept) < len(self._queue):
            for item in self._queue:
                if item in mine:
                    self._metrics.dropped.labels(reason=item.reason).inc()
            self._queue = kept
            self._queue_changed()

    async def stop(self, timeout: float) -> bool:
        """Refuse new work, finish what is queued within `timeout` seconds, then stop. Segments
        still queued after that fail with 503. True when everything finished in time."""
        self._closed = True
        self._arrived.set()
        drained = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            drained = False
            log.warning("%s: %d segments not finished at shutdown", self._model, self.depth)
        try:
            worker = self._worker
            if worker is not None:
                worker.cancel()
                # Not `await worker`: a worker that died re-raises its error (logged when it
                # died), which must not skip what follows.
                await asyncio.wait({worker})
                if not worker.cancelled() and worker.exception() is not None:
                    drained = False
        finally:
            self._fail_queued(ErrorType.UNAVAILABLE, "the service shut down before decoding")
            self._executor.shutdown(wait=False, cancel_futures=True)
        return drained

    # --- The worker -------------------------------------------------------------------------

    async def _work(self) -> None:
        try:
            await self._loop()
        except Exception:
            # A bug, not an engine failure: nobody may wait forever; /ready now reports it.
            log.exception("%s: batcher worker stopped", self._model)
            self._fail_queued(ErrorType.INTERNAL, "the batcher failed")
            raise

    async def _loop(self) -> None:
        while True:
            self._drop_dead()
            if not self._queue:
                self._idle.set()
                self._arrived.clear()
                await self._arrived.wait()
                continue
            oldest = self._queue[0]
            wait = oldest.enqueued + self._limits.max_wait_s - time.monotonic()
            if wait > 0 and not self._closed and not self._batch_is_full(oldest.options):
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
                continue
            await self._run(self._take(oldest.options))

    def _drop_dead(self) -> None:
        """Remove queued segments nobody waits for any more, or that are past their deadline."""
        now = time.monotonic()
        alive: deque[_Pending] = deque()
        for item in self._queue:
            if item.future.cancelled():
                self._metrics.dropped.labels(reason="cancelled").inc()
            elif now > item.deadline:
                self._metrics.dropped.labels(reason="deadline").inc()
                item.future.set_exception(
                    ServiceError(
                        ErrorType.DEADLINE_EXCEEDED,
                        "the request waited longer than its deadline; retry later",
                    )
                )
            else:
                alive.append(item)
        if len(alive) != len(self._queue):
            self._queue = alive
            self._queue_changed()

    def _batch_is_full(self, options: DecodingOptions) -> bool:
        count, longest = 0, 0
        for item in self._queue:
            if item.options == options:
                count, longest = count + 1, max(longest, len(item.ids))
                if count >= self._limits.max_batch_size:
                    return True
                if count * longest >= self._limits.max_batch_tokens:
                    return True
        return False

    def _take(self, options: DecodingOptions) -> list[_Pending]:
        """The oldest segments with these options that fit the limits, in queue order; the
        oldest is always taken even if alone it exceeds the token budget."""
        batch: list[_Pending] = []
        rest: deque[_Pending] = deque()
        longest = 0
        limits = self._limits
        for item in self._queue:
            longer = max(longest, len(item.ids))
            fits = len(batch) < limits.max_batch_size and (len(batch) + 1) * longer <= (
                limits.max_batch_tokens
            )
            if item.options == options and (fits or not batch):
                batch.append(item)
                longest = longer
            else:
                rest.append(item)
        self._queue = rest
        self._queue_changed()
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        # Similar lengths side by side: the engine pads less when it splits or reorders.
        batch.sort(key=lambda item: len(item.ids))
        options = batch[0].options
        sources = [item.ids for item in batch]
        model = self._model
        start = time.monotonic()
        for item in batch:
            item.decoding = True
            self._metrics.queue_wait_seconds.labels(model).observe(start - item.enqueued)
        self._metrics.batch_segments.labels(model).observe(len(batch))
        self._metrics.batch_tokens.labels(model).observe(sum(len(s) for s in sources))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self._executor,
                self._generate,
                sources,
                options,
                _deadlines(batch),
                [item.prefix for item in batch],
            )
            if len(results) != len(batch):
                raise RuntimeError(f"engine returned {len(results)} results for {len(batch)}")
        except asyncio.CancelledError:
            _fail(batch, ErrorType.UNAVAILABLE, "the service stopped during decoding")
            raise
        except Exception:
            log.exception("%s: engine call failed for a batch of %d segments", model, len(batch))
            _fail(batch, ErrorType.INTERNAL, "the translation engine failed")
            return
        finally:
            self._metrics.engine_seconds.labels(model).observe(time.monotonic() - start)
        self._metrics.input_tokens.labels(model).inc(sum(len(s) for s in sources))
        self._metrics.generated_tokens.labels(model).inc(
            sum(len(nbest[0].ids) for nbest in results if nbest and not _stopped(nbest))
        )
        for item, nbest in zip(batch, results, strict=True):
            if _stopped(nbest):  # the engine took it out of its batch between two steps
                reason = item.reason if item.future.done() else "deadline"
                self._metrics.stopped.labels(model, reason).inc()
                if not item.future.done():  # past its deadline before the request's timer ran
                    item.future.set_exception(
                        ServiceError(ErrorType.DECODING_TIMEOUT, _DECODING_TIMEOUT)
                    )
            elif not item.future.done():
                item.future.set_result(nbest)

    def _fail_queued(self, type: ErrorType, message: str) -> None:
        _fail(self._queue, type, message)
        self._queue.clear()
        self._queue_changed()

    def _queue_changed(self) -> None:
        self._metrics.queue_depth.labels(self._model).set(len(self._queue))


def _stopped(nbest: list[Hypothesis]) -> bool:
    """Whether the engine stopped this segment at its deadline (a "deadline" hypothesis)."""
    return any(h.finish_reason == "deadline" for h in nbest)


def _deadlines(batch: list[_Pending]) -> Deadline:
    """The engine's view of the batch's deadlines: read live, from its thread."""
    return lambda sentence: batch[sentence].deadline


def _fail(items: Iterable[_Pending], type: ErrorType, message: str) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(ServiceError(type, message))
