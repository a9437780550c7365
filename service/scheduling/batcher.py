"""The batching room: an asyncio queue of segments in front of one engine.

Requests submit their segments (token ids) with their decoding options and a deadline. Two
schedulers take them from there, in one worker task, running the engine in a single worker
thread (never on the event loop, never two calls at once):
- step-level (a `Stepper`: service/inference/running.py; `scheduler: step`): at every
  decoder-step boundary the worker admits the queued segments that fit into the running
  batches (new requests first, then the oldest), runs the next steps, and answers each segment
  the step its sentence finishes. A short request never waits for a long batch to end.
- whole batches (`generate`): the worker takes the oldest segment, lets it wait at most
  `max_wait_s` for company, forms a batch of segments with the same options under a size and a
  token budget, runs it to its end and resolves each waiter.
Background work (a document's sentences: `submit(background=True)`) goes behind interactive
requests, never in their batches. Where the engine runs step-level batching (a CPU bundle),
background sentences have a running batch of their own (`background`, a second `Stepper` of
`background_batch_size` slots): it steps only while no interactive segment is queued or being
decoded, and pauses at the next decoder step when one arrives, its sentences kept where they
are (nothing decoded twice), to go on BACKGROUND_GRACE_S after the interactive work is done
(and for one turn, TURN_S, every BACKGROUND_PAUSE_S under interactive work that never ends, so
that a document still moves). It is refilled a whole batch of one options at a time, when it
has emptied: sentences that start together share their steps' cache span, which keeps a
document's throughput that of whole batches. Elsewhere (CUDA's bundles) whole batches hold
either kind, a background batch of at most `background_batch_size` segments is taken only
when no interactive segment waits, and an interactive request that arrives while background
sentences are being decoded preempts them: they leave their batch at the next decoder step
(as a segment past its deadline does) and go back to the queue, to start again later; a
segment is preempted at most MAX_PREEMPTIONS times (then it runs to its end), so a document
still moves under a steady stream of requests and wastes a bounded share of its work.
Segments whose waiter is gone (client disconnected) or whose deadline passed are dropped before
decoding and counted; while decoding, the engine reads each segment's deadline before every
step, so such a segment leaves its batch at the next step (504 decoding_timeout past the
deadline; a cancelled request's segments are moved past theirs), and the rest of the batch goes
on. An engine failure fails the segments it was decoding and nothing else.

It knows nothing of HTTP or ONNX Runtime: `generate` is any function with the engine's
signature and a `Stepper` any object with its methods, which is how the tests drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from service.bundle.decoding import (
    NO_CONSTRAINTS,
    Constraints,
    Deadline,
    DecodingOptions,
    Hypothesis,
)
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics

if TYPE_CHECKING:  # the batcher itself loads no engine
    from service.inference.running import Finished, Segment, Usage

log = logging.getLogger(__name__)

# The engine's generate: sources, options, each source's deadline, decoder prefix and terms.
Generate = Callable[
    [list[list[int]], DecodingOptions, Deadline, list[list[int]], list[Constraints]],
    list[list[Hypothesis]],
]


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int  # segments per engine call
    max_batch_tokens: int  # padded source tokens per engine call: size x longest segment
    max_wait_s: float  # how long the oldest segment may wait for the batch to fill
    max_queue: int  # queued segments; a request that would exceed it is refused whole
    # Background segments per batch (whole batches), or running at once (step-level).
    background_batch_size: int = 8


class Stepper(Protocol):
    """Step-level batching (service.inference.running.Running, or a test's): sentences join a
    running batch between decoder steps and leave it as they finish."""

    slots: int  # sentences per running batch (one batch per beam size)

    @property
    def sentences(self) -> int: ...

    def load(self, beam_size: int) -> tuple[int, int]: ...

    def usage(self) -> Usage: ...

    def admit(self, segments: Sequence[Segment]) -> Finished: ...

    def step(self) -> tuple[Finished, int]: ...

    def clear(self) -> None: ...


@dataclass(eq=False)
class _Pending:
    ids: list[int]
    prefix: list[int]  # the ids its translation is forced to start with (Engine.decoder_prefix)
    options: DecodingOptions
    future: asyncio.Future[list[Hypothesis]]
    enqueued: float  # time.monotonic()
    deadline: float  # time.monotonic(); -inf once nobody wants the segment (read while decoding)
    request: object = None  # the same for the segments of one request (fair admission)
    constraints: Constraints = NO_CONSTRAINTS  # its terms (constrained beam search)
    background: bool = False  # bulk work (a document): behind every interactive segment
    preemptions: int = 0  # times it left its batch for an interactive request
    # While preempted (leaving its batch at the next step): its deadline, put back when it
    # returns to the queue (`deadline` is -inf meanwhile, which is what stops it).
    held_deadline: float | None = None
    decoding: bool = False  # taken into a batch
    # Step-level: since when it has been its request's next segment to admit (when its request
    # submitted it or last had a segment admitted): how long it has waited its turn, STARVING_S.
    next_since: float = field(init=False)
    # Why nobody wants it any more, as its request said (Batcher._abandon); None until then.
    reason: Literal["deadline", "cancelled"] | None = None

    def __post_init__(self) -> None:
        self.next_since = self.enqueued

    def why(self) -> Literal["deadline", "cancelled"]:
        """Why nobody wants it (or why the engine stopped it): as its request said, or, where
        its future went before the request could say (a client gone cancels the futures its
        request gathers at once; the request's handler runs a turn of the event loop later),
        whether its deadline has passed."""
        if self.reason is not None:
            return self.reason
        return "deadline" if time.monotonic() > self.deadline else "cancelled"


# Step-level: the longest one call into the engine's thread steps without a reason to return.
TURN_S = 0.02
# Step-level: the further segments of a running request join when this fraction of the slots is
# free (an encoder run and a search each cost ~1 ms whatever the sentences: 240 sentences at
# beam 5 through 32 slots took 3.13 s refilled one at a time, 2.75 s eight at a time).
REFILL_FRACTION = 4
# Step-level: a running request's next segment that has waited this long since the request's
# last admission joins like a new request's (one segment: the next one waits anew).
STARVING_S = 0.5

# The background running batch waits this long after interactive work before it steps again:
# a client's next request, sent as soon as its answer came, finds the engine free (its parsing
# and tokenizing not slowed by background steps beside them).
BACKGROUND_GRACE_S = 0.01
# The longest the background running batch stays paused (then it steps for one turn, TURN_S):
# a sixth of the engine's time at most, under interactive work that never ends.
BACKGROUND_PAUSE_S = 0.1

# Times a background segment may be taken out of its batch for an interactive request.
MAX_PREEMPTIONS = 2

# A request still being decoded when its deadline passes.
DECODING_TIMEOUT_MESSAGE = (
    "the translation was not done within the request's deadline (request_timeout_s); send "
    "less text at once"
)


class Batcher:
    def __init__(
        self,
        generate: Generate,
        *,
        model: str,
        limits: BatchLimits,
        metrics: Metrics,
        stepper: Stepper | None = None,
        background: Stepper | None = None,
    ) -> None:
        """`stepper`: schedule at decoder-step granularity through it (module docstring);
        None: whole batches through `generate`. `background`: the running batch of
        background work, paused for interactive work (module docstring); None: background
        batches are preempted instead."""
        self._generate = generate
        self._stepper = stepper
        self._background = background
        self._paused = 0.0  # time.monotonic() at the background running batch's last turn
        self._interactive_at = 0.0  # time.monotonic() when interactive work last came or ran
        self._decoding: set[_Pending] = set()  # taken into a batch, not finished
        self._wake = threading.Event()  # step-level: something arrived (read between steps)
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
        options: DecodingOptions | Sequence[DecodingOptions],
        *,
        deadline: float,
        prefix: Sequence[int] = (),
        constraints: Sequence[Constraints] | None = None,
        background: bool = False,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each source, in order, decoded with `options` (or `options[i]`: the
        sources of one request may differ, as markup asks some only for alignments; the batches
        group them by options); `prefix`: the ids their translations are
        forced to start with (a multilingual model's target: requests with different ones
        share batches); `constraints[i]`: source i's terms (they share batches too);
        `background`: bulk work, decoded behind interactive requests (module docstring). All
        sources are queued or none is: a request is never half-admitted. Cancelling the caller
        takes its segments still queued out of the queue at once."""
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
        request = object()
        terms = constraints or [NO_CONSTRAINTS] * len(sources)
        each = [options] * len(sources) if isinstance(options, DecodingOptions) else options
        pending = [
            _Pending(
                list(ids),
                list(prefix),
                own_options,
                loop.create_future(),
                now,
                deadline,
                request,
                own,
                background,
            )
            for ids, own, own_options in zip(sources, terms, each, strict=True)
        ]
        self._queue.extend(pending)
        self._queue_changed()
        if not background:
            self._interactive_at = now
            self._preempt()
        self._idle.clear()
        self._arrived.set()
        self._wake.set()
        # The whole request's deadline: when it passes, its segments are abandoned at once, as
        # late (why before their futures are cancelled, so that a batch answered in the same
        # turn of the event loop counts them so), whatever the batch they are in still has to
        # decode for others (they leave it at its next step).
        timer = loop.call_at(loop.time() + deadline - now, self._abandon, pending, "deadline")
        try:
            return list(await asyncio.gather(*(p.future for p in pending)))
        except BaseException:
            # Past the deadline: the timer's, or first the engine's clock (a segment stopped at
            # a step) or the worker's (a queued one dropped). Else one segment failed or the
            # caller went away: the other segments are not wanted either.
            late = pending[0].reason == "deadline" or time.monotonic() > deadline
            self._abandon(pending, "deadline" if late else "cancelled")
            task = asyncio.current_task()
            if not late or (task is not None and task.cancelling()):
                raise
            if any(item.decoding for item in pending):
                raise ServiceError(ErrorType.DECODING_TIMEOUT, DECODING_TIMEOUT_MESSAGE) from None
            raise ServiceError(
                ErrorType.DEADLINE_EXCEEDED,
                "the request waited longer than its deadline; retry later",
            ) from None
        finally:
            timer.cancel()

    def _preempt(self) -> None:
        """Background segments being decoded leave their batch at its next step, for the
        interactive segments just queued (module docstring); with a background running batch,
        that batch pauses instead (the worker's next turn is the interactive work's)."""
        if self._background is not None:
            return
        for item in self._decoding:
            if (
                item.background
                and item.held_deadline is None
                and item.preemptions < (MAX_PREEMPTIONS)
            ):
                item.preemptions += 1
                item.held_deadline, item.deadline = item.deadline, -math.inf

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
                    self._metrics.dropped.labels(reason=reason).inc()
            self._queue = kept
            self._queue_changed()

    def give_up(self, message: str) -> None:
        """The drain's time is up: every segment queued or being decoded fails now with 503
        (`message`), so that its request is answered before the server closes its connection;
        those being decoded leave their batch at its next step. New segments are refused."""
        self._closed = True
        for item in self._decoding:
            item.reason, item.deadline = "cancelled", -math.inf
        _fail(self._decoding, ErrorType.UNAVAILABLE, message)
        self._fail_queued(ErrorType.UNAVAILABLE, message)

    async def stop(self, timeout: float) -> bool:
        """Refuse new work, finish what is queued within `timeout` seconds, then stop. Segments
        still queued after that fail with 503. True when everything finished in time."""
        self._closed = True
        self._arrived.set()
        drained = await set_within(self._idle, timeout)
        if not drained:
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
            for stepper in (self._stepper, self._background):
                if stepper is not None:
                    self._fail_running(stepper, [], ErrorType.INTERNAL, "the batcher failed")
            self._idle.set()  # nothing left: a drain need not wait out its timeout
            raise

    async def _loop(self) -> None:
        if self._stepper is not None:
            await self._step_loop(self._stepper)
            return
        while True:
            self._drop_dead()
            if await self._idle_or_background(None):
                continue
            # The oldest interactive segment; background work when there is none.
            oldest = next((item for item in self._queue if not item.background), self._queue[0])
            wait = oldest.enqueued + self._limits.max_wait_s - time.monotonic()
            if wait > 0 and not self._closed and not self._batch_is_full(oldest):
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
                continue
            await self._run(self._take(oldest))

    async def _step_loop(self, stepper: Stepper) -> None:
        """Step-level scheduling: at every step boundary, admit what fits (`_admit`), run the
        next decoder steps in the engine's thread (`_iterate`), answer each segment as soon as
        its sentence finishes."""
        while True:
            self._drop_dead()
            if not await self._idle_or_background(stepper):
                await self._turn(stepper, self._admit(stepper))

    async def _idle_or_background(self, stepper: Stepper | None) -> bool:
        """Whether the worker's turn went to waiting (nothing to do) or to the background
        running batch (no interactive work queued, or running in `stepper`); False: the turn
        is the interactive work's, or, without a background running batch, the queue's."""
        background = self._background
        if background is not None:
            interactive = (stepper is not None and stepper.sentences) or any(
                not item.background for item in self._queue
            )
            waiting = background.sentences or any(item.background for item in self._queue)
            now = time.monotonic()
            # Under interactive work that never ends, a paused batch still gets a turn now and
            # then: a document moves, however slowly.
            starved = now - self._paused >= BACKGROUND_PAUSE_S
            grace = self._interactive_at + BACKGROUND_GRACE_S - now
            if waiting and not interactive and grace > 0 and not starved:
                self._arrived.clear()
                await set_within(self._arrived, grace)
                return True
            if waiting and (not interactive or starved):
                await self._turn(background, self._admit_background(background))
                self._paused = time.monotonic()
                return True
        if self._queue or (stepper is not None and stepper.sentences):
            return False
        self._idle.set()
        self._arrived.clear()
        await self._arrived.wait()
        return True

    async def _turn(self, stepper: Stepper, admitted: list[_Pending]) -> None:
        """Admit `admitted` into `stepper` and run its next steps in the engine's thread
        (`_iterate`), answering the segments that finished."""
        loop = asyncio.get_running_loop()
        self._wake.clear()
        try:
            # Background sentences are answered at the end of a turn, not one turn each.
            answer = stepper is not self._background
            turn = await loop.run_in_executor(
                self._executor, _iterate, stepper, admitted, self._wake, TURN_S, answer
            )
        except asyncio.CancelledError:
            self._fail_running(
                stepper, admitted, ErrorType.UNAVAILABLE, "the service stopped during decoding"
            )
            raise
        except Exception:
            log.exception("%s: a decoder step failed", self._model)
            self._fail_running(
                stepper, admitted, ErrorType.INTERNAL, "the translation engine failed"
            )
            return
        if turn.refused is not None:
            log.error("%s: admission failed", self._model, exc_info=turn.refused)
            self._fail_running(None, admitted, ErrorType.INTERNAL, "the translation engine failed")
            admitted = []
        self._stepped(admitted, turn)
        if stepper is not self._background:
            self._interactive_at = time.monotonic()

    def _admit(self, stepper: Stepper) -> list[_Pending]:
        """Take from the queue what the running batches have room for, while a segment's beam
        size has a slot and the running batch's padded source tokens stay within
        max_batch_tokens: first one segment of each request that has none running, oldest
        first (a short request does not queue behind the sentences of a long one), then the
        segments of the oldest requests (first come, first finished, as whole batches
        would). The further segments of a request already running join when a fraction of
        the slots (1 / REFILL_FRACTION) is free; its next one that has waited STARVING_S
        since the request's last admission joins like a new request's (that one: the one
        after it waits anew, so a long request cannot take the turns of new ones). The
        first segment of a beam size that does not fit holds that beam size back for the
        round: a long one is not passed over by shorter ones that keep arriving."""
        if not self._queue:
            return []
        now = time.monotonic()
        waiting: dict[object, deque[_Pending]] = {}
        for item in self._queue:
            waiting.setdefault(item.request, deque()).append(item)
        running = {item.request for item in self._decoding}  # requests with segments running
        loads: dict[int, tuple[int, int]] = {}  # beam size: running sentences, longest
        load: dict[int, tuple[int, int]] = {}  # the same with this round's admissions
        full: set[int] = set()  # beam sizes whose next segment did not fit
        refill = max(1, stepper.slots // REFILL_FRACTION)

        def rank(i: int, request: object) -> tuple[bool, bool, int, object]:
            """(background, waits its turn, arrival rank, request): interactive requests
            first, of each kind new or starving requests first."""
            first = waiting[request][0]
            starving = now - first.next_since >= STARVING_S
            return (first.background, request in running and not starving, i, request)

        order = [rank(i, r) for i, r in enumerate(waiting)]
        heapq.heapify(order)
        # Background sentences running: at most background_batch_size at once, and none while
        # an interactive one is queued or running.
        background = sum(item.background for item in self._decoding)
        interactive = any(not item.background for item in (*self._queue, *self._decoding))
        taken: list[_Pending] = []
        while order:
            _, waits, i, request = heapq.heappop(order)
            item = waiting[request][0]
            beam = item.options.beam_size
            if beam in full:
                continue
            if item.background and (
                self._background is not None
                or interactive
                or background >= self._limits.background_batch_size
            ):
                continue
            if beam not in loads:
                loads[beam] = stepper.load(beam)
            n, longest = load.get(beam, loads[beam])
            longest = max(longest, len(item.ids))
            if n >= stepper.slots or (n and (n + 1) * longest > self._limits.max_batch_tokens):
                full.add(beam)
                continue
            running_before, _ = loads[beam]
            if waits and running_before and stepper.slots - running_before < refill:
                # A request already running refills its batch a few slots at a time: one
                # encoder run and one search for several sentences, not one each.
                continue  # its request waits for the next round; others may still fit
            load[beam] = (n + 1, longest)
            background += item.background
            taken.append(waiting[request].popleft())
            running.add(request)
            if waiting[request]:
                waiting[request][0].next_since = now
                heapq.heappush(order, rank(i, request))
        return self._taken(taken, now)

    def _admit_background(self, stepper: Stepper) -> list[_Pending]:
        """Queued background segments into their running batch, oldest first, once it has
        emptied: a whole batch at once (module docstring), of one options as a whole batch
        is (sentences that want no alignment do not pay for the aligner's steps beside ones
        that do), within its slots and max_batch_tokens."""
        if stepper.sentences:
            return []
        taken: list[_Pending] = []
        longest = 0
        for item in self._queue:
            if not item.background or (taken and item.options != taken[0].options):
                continue
            longer = max(longest, len(item.ids))
            if taken and (len(taken) + 1) * longer > self._limits.max_batch_tokens:
                break
            taken.append(item)
            longest = longer
            if len(taken) == stepper.slots:
                break
        return self._taken(taken, time.monotonic())

    def _taken(self, taken: list[_Pending], now: float) -> list[_Pending]:
        """`taken` out of the queue and being decoded."""
        if taken:
            chosen = set(taken)
            self._queue = deque(item for item in self._queue if item not in chosen)
            self._queue_changed()
            for item in taken:
                item.decoding = True
                self._decoding.add(item)
                self._metrics.queue_wait_seconds.labels(self._model).observe(now - item.enqueued)
        return taken

    def _stepped(self, admitted: list[_Pending], turn: _Turn) -> None:
        model, metrics = self._model, self._metrics
        for rows, seconds in turn.steps:
            metrics.step_seconds.labels(model).observe(seconds)
            metrics.step_rows.labels(model).observe(rows)
        for item in admitted:
            metrics.first_step_seconds.labels(model).observe(turn.first_step_end - item.enqueued)
        if admitted:
            metrics.input_tokens.labels(model).inc(sum(len(item.ids) for item in admitted))
        for segment, nbest in turn.finished:
            assert isinstance(segment, _Pending)
            self._decoding.discard(segment)
            if _stopped(nbest):
                self._stop(segment)
                continue
            metrics.generated_tokens.labels(model).inc(len(nbest[0].ids) if nbest else 0)
            if not segment.future.done():
                segment.future.set_result(nbest)
        usages = [s.usage() for s in (self._stepper, self._background) if s is not None]
        sentences = sum(usage.sentences for usage in usages)
        metrics.running_segments.labels(model).set(sentences)
        metrics.slots.labels(model, "used").set(sentences)
        metrics.slots.labels(model, "free").set(sum(usage.slots for usage in usages) - sentences)
        metrics.cache_bytes.labels(model).set(sum(usage.cache_bytes for usage in usages))

    def _stop(self, item: _Pending) -> None:
        """A segment the engine took out of its batch between two steps: preempted, it goes
        back to the queue (unless nobody wants it any more); else it was late or cancelled."""
        if item.held_deadline is not None:
            item.deadline, item.held_deadline = item.held_deadline, None
            item.decoding = False
            if item.reason is None and not item.future.done():
                self._queue.append(item)
                self._queue_changed()
                self._idle.clear()
                self._arrived.set()
                return
        self._metrics.stopped.labels(self._model, item.why()).inc()
        if not item.future.done():  # past its deadline before the request's timer ran
            item.future.set_exception(
                ServiceError(ErrorType.DECODING_TIMEOUT, DECODING_TIMEOUT_MESSAGE)
            )

    def _fail_running(
        self, stepper: Stepper | None, admitted: list[_Pending], type: ErrorType, message: str
    ) -> None:
        """An engine failure: the admitted segments fail, and with a `stepper` every segment
        it was decoding (its batches are cleared); those it had answered stay answered."""
        failed = set(admitted)
        if stepper is not None:
            stepper.clear()
            failed |= {item for item in self._decoding if self._stepper_of(item) is stepper}
        self._decoding -= failed
        _fail(failed, type, message)

    def _stepper_of(self, item: _Pending) -> Stepper | None:
        """The running batches a segment being decoded is in (None: a whole batch)."""
        if item.background and self._background is not None:
            return self._background
        return self._stepper

    def _drop_dead(self) -> None:
        """Remove queued segments nobody waits for any more, or that are past their deadline."""
        now = time.monotonic()
        alive: deque[_Pending] = deque()
        for item in self._queue:
            if item.future.cancelled():
                self._metrics.dropped.labels(reason=item.why()).inc()
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

    def _batch_size(self, background: bool) -> int:
        limits = self._limits
        return limits.background_batch_size if background else limits.max_batch_size

    def _batch_is_full(self, oldest: _Pending) -> bool:
        count, longest = 0, 0
        size = self._batch_size(oldest.background)
        for item in self._queue:
            if item.options == oldest.options and item.background == oldest.background:
                count, longest = count + 1, max(longest, len(item.ids))
                if count >= size:
                    return True
                if count * longest >= self._limits.max_batch_tokens:
                    return True
        return False

    def _take(self, oldest: _Pending) -> list[_Pending]:
        """The oldest segments of `oldest`'s kind (interactive or background) with its options
        that fit the limits, in queue order; `oldest` is always taken even if alone it exceeds
        the token budget."""
        batch: list[_Pending] = []
        rest: deque[_Pending] = deque()
        longest = 0
        size = self._batch_size(oldest.background)
        for item in self._queue:
            longer = max(longest, len(item.ids))
            fits = len(batch) < size and (len(batch) + 1) * longer <= self._limits.max_batch_tokens
            same = item.options == oldest.options and item.background == oldest.background
            if same and (fits or (not batch and item is oldest)):
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
        self._decoding.update(batch)
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
                [item.constraints for item in batch],
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
            self._decoding.difference_update(batch)
            end = time.monotonic()
            self._metrics.engine_seconds.labels(model).observe(end - start)
            if not batch[0].background:
                self._interactive_at = end
        self._metrics.input_tokens.labels(model).inc(sum(len(s) for s in sources))
        self._metrics.generated_tokens.labels(model).inc(
            sum(len(nbest[0].ids) for nbest in results if nbest and not _stopped(nbest))
        )
        for item, nbest in zip(batch, results, strict=True):
            if _stopped(nbest):  # the engine took it out of its batch between two steps
                self._stop(item)
            elif not item.future.done():
                item.future.set_result(nbest)

    def _fail_queued(self, type: ErrorType, message: str) -> None:
        _fail(self._queue, type, message)
        self._queue.clear()
        self._queue_changed()

    def _queue_changed(self) -> None:
        self._metrics.queue_depth.labels(self._model).set(len(self._queue))


@dataclass
class _Turn:
    """What one call into the engine's thread did (`_iterate`)."""

    finished: Finished = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)  # rows, seconds of each step
    first_step_end: float = 0.0  # time.monotonic()
    refused: Exception | None = None  # the admission's failure (it admitted nothing)


async def set_within(event: asyncio.Event, timeout: float) -> bool:
    """Whether `event` is set, or gets set within `timeout` seconds (`wait_for(..., 0)` alone
    times out even on an event already set)."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


def _iterate(
    stepper: Stepper,
    admitted: list[_Pending],
    wake: threading.Event,
    budget_s: float,
    answer: bool = True,
) -> _Turn:
    """In the engine's thread: admit, then step until a sentence finishes (`answer`), a
    segment arrives (`wake`), nothing runs any more, or `budget_s` has passed (each call is a
    thread hop of the event loop: one per step would cost ~0.1 ms a step). An admission that
    fails is returned, not raised: the running sentences go on."""
    turn = _Turn()
    try:
        turn.finished = stepper.admit(admitted)
    except Exception as e:
        turn.refused = e
    end = time.monotonic() + budget_s
    while True:
        start = time.monotonic()
        stepped, rows = stepper.step()
        done = time.monotonic()
        turn.first_step_end = turn.first_step_end or done
        turn.finished += stepped
        if not rows:
            break
        turn.steps.append((rows, done - start))
        if (answer and turn.finished) or wake.is_set() or done >= end:
            break
    return turn


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
