"""Step-level (continuous) batching: one running batch per beam size that sentences join and
leave between any two decoder steps.

`Running` holds an engine's running sentences: `admit` encodes new ones (batched with the others
admitted at that step boundary) and gives each a slot of the batch of its beam size; `step`
runs one decoder step over every sentence of one batch and returns the n-best lists of those
that finished, at the step they finish. Sentences of any options share a batch: each group of
sentences admitted together with the same options is one search (service/inference/search.py,
driven a step at a time), and a step asks the graph for the most candidates any search wants.
Searches of different beam sizes are in different batches (the graph's beams per sentence are
one number); `step` takes the batch that has had the least decoder time so far, so a greedy
sentence is not slowed to the pace of a beam-5 batch of many rows.

A batch's memory is a pool of `slots` sentence slots, allocated once per batch: each slot holds
its sentence's G rows of the static self-attention cache (bundle format 7, the "indirection"
cache), its cache indirection, and its one copy of the encoder's cross keys/values. The graph
runs over the first n slots: a sentence that joins takes slot n (nothing of the running batch
moves), one that leaves is replaced by the last (one slot's copy). The cache has one clock for
the batch: at each step every row writes cache position T; a sentence that joined at T0 reads
positions T0 .. T only (`self_attention_mask`) and its positional encoding is T - T0. When T
reaches the cache's positions, or the oldest running sentence's T0 is SHIFT_POSITIONS or more,
every row moves down by that T0 (when it is 0, the cache doubles instead); an empty batch starts
again at 0. `slots` is the admission
bound: a sentence waits for a free slot.

The CPU's bundles ("indirection" cache) run here; a bundle with the "gather" cache (CUDA's)
is served by whole batches (service/scheduling/batcher.py), as before.

Not thread-safe: one thread calls `admit` and `step` (the batcher's engine thread).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnxruntime as ort

from service.bundle.decoding import Constraints, DecodingOptions, Hypothesis, Prefixes
from service.bundle.manifest import (
    ALIGNMENT,
    ALIGNMENT_WANTED,
    CACHE_INDIRECTION,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOG_PROBS,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    SELF_ATTENTION_MASK,
    SHORTLIST,
    SHORTLIST_MASK,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    cross_names,
    past_key,
    past_names,
    present_names,
)
from service.inference.search import FloatArray, IntArray, StepCall, Steps, search_steps
from service.inference.shortlist import batch_inputs
from service.inference.step_state import (
    MIN_CAPACITY,
    BufferPool,
    beam_parents,
    bucket,
    follow_indirection,
    log_probs_of,
    wanted_alignment,
)

if TYPE_CHECKING:
    from service.inference.engine import Engine

SOURCE_WIDTH = 16  # a batch's cross keys/values start with this many source positions
# Every row attends to every cache position from the oldest running sentence's start on (the
# kernel's cost grows with them: 160 rows, 13.4 ms a step at T = 20, 20.6 ms at T = 120), so
# once the oldest starts this many positions in, the rows move down (a copy of the cached span).
SHIFT_POSITIONS = 16


class Segment(Protocol):
    """A sentence to translate, as the scheduler queues it."""

    ids: list[int]  # its token ids (Engine.encode), not empty
    prefix: list[int]  # the ids its translation is forced to start with (Engine.decoder_prefix)
    constraints: Constraints  # its terms' target ids (constrained beam search)
    options: DecodingOptions
    deadline: float  # time.monotonic(); read before every step: past it, the sentence stops


Finished = list[tuple[Segment, list[Hypothesis]]]


@dataclass(frozen=True)
class Usage:
    """What the running batches hold, for the metrics."""

    sentences: int  # running
    slots: int  # allocated, in use or free
    cache_bytes: int  # the slots' memory: caches, indirections, cross keys/values


class Running:
    """The running sentences of one engine: a `_Batch` per beam size (module docstring)."""

    def __init__(self, engine: Engine, slots: int) -> None:
        if not Running.runs_on(engine):
            raise ValueError("step-level batching runs a CPU bundle (indirection cache)")
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.engine = engine
        self.slots = slots
        self._batches: dict[int, _Batch] = {}

    @staticmethod
    def runs_on(engine: Engine) -> bool:
        """Whether the engine can run step-level batching: a bundle with the indirection cache
        on the CPU, batches compacted (CUDA pads its batches for CUDA graphs: whole batches)."""
        cpu = engine.device == "cpu" and not engine.padded
        return cpu and engine.manifest.decoder_cache == "indirection"

    @property
    def sentences(self) -> int:
        return sum(batch.n for batch in self._batches.values())

    def room(self, beam_size: int) -> int:
        """Free slots for sentences of this beam size."""
        batch = self._batches.get(beam_size)
        return self.slots - (0 if batch is None else batch.n)

    def load(self, beam_size: int) -> tuple[int, int]:
        """The running sentences of this beam size and the longest of their sources."""
        batch = self._batches.get(beam_size)
        return (0, 0) if batch is None else (batch.n, batch.longest())

    def usage(self) -> Usage:
        batches = self._batches.values()
        return Usage(
            sentences=self.sentences,
            slots=self.slots * len(self._batches),
            cache_bytes=sum(batch.nbytes() for batch in batches),
        )

    def admit(self, segments: Sequence[Segment]) -> Finished:
        """Encode these sentences (one encoder pass for all, in length groups) and let them
        join the batch of their beam size at the next step, those with the same options as
        one search. At most `room(beam size)` of each beam size (else ValueError, nothing
        admitted). Returns those that finished at once (past their deadline already)."""
        if not segments:
            return []
        by_options: dict[DecodingOptions, list[Segment]] = {}
        for segment in segments:
            by_options.setdefault(segment.options, []).append(segment)
        wanted: dict[int, int] = {}
        for options, group in by_options.items():
            wanted[options.beam_size] = wanted.get(options.beam_size, 0) + len(group)
        for beam_size, count in wanted.items():
            if count > self.room(beam_size):
                raise ValueError(f"{count} sentences of beam {beam_size}: no room")
        engine = self.engine
        # Checked before anything runs: a bad sentence admits none.
        checked = {o: engine.checked([s.ids for s in g], o) for o, g in by_options.items()}
        order = sorted(segments, key=lambda s: len(s.ids))
        cross, mask = engine.encoded([s.ids for s in order])
        row_of = {id(segment): row for row, segment in enumerate(order)}
        finished: Finished = []
        started: list[_Search] = []
        try:
            for options, group in by_options.items():
                rows = np.array([row_of[id(s)] for s in group])
                batch = self._batches.get(options.beam_size)
                if batch is None:
                    batch = self._batches[options.beam_size] = _Batch(
                        engine, options.beam_size, self.slots
                    )
                if not batch.n:  # a batch waking up is no further ahead than the others
                    batch.served = min((b.served for b in self._live()), default=0.0)
                search, done = batch.admit(
                    group, checked[options], [c[rows] for c in cross], mask[rows]
                )
                started.append(search)
                finished += done
        except Exception:
            for search in started:  # all or nothing
                search.batch.drop(search)
            raise
        return finished

    def step(self) -> tuple[Finished, int]:
        """One decoder step of the batch that has had the least decoder time -> the sentences
        that finished, with their n-best lists, and the rows the step ran (0: none running)."""
        batch = min(self._live(), key=lambda b: b.served, default=None)
        if batch is None:
            return [], 0
        rows = batch.n * batch.beam_size
        start = time.perf_counter()
        finished = batch.step()
        batch.served += time.perf_counter() - start
        return finished, rows

    def clear(self) -> None:
        """Drop every running sentence (after an engine failure). New batches replace the old
        ones, which a step still running in another thread may finish with."""
        self._batches = {}

    def _live(self) -> list[_Batch]:
        return [batch for batch in self._batches.values() if batch.n]


class _Search:
    """One search over the sentences admitted together with the same options: the
    `DecoderRows` its search moves (`slots`: the slot of each live sentence, in the search's
    order), and the search itself, waiting for its next step (`call`)."""

    def __init__(
        self, batch: _Batch, segments: list[Segment], options: DecodingOptions, slots: IntArray
    ) -> None:
        engine = batch.engine
        self.batch = batch
        self.segments = segments
        self.slots = slots
        self.beams = 1  # rows per sentence the search sees: beam_size once expanded
        self.aligned = options.alignments  # it keeps each step's alignment rows
        self.width = max(len(s.ids) for s in segments)  # its alignment rows' positions
        self.prefixes = Prefixes([tuple(s.prefix) for s in segments])
        self.answered: set[int] = set()
        self._alignment: FloatArray | None = None
        self.stepped: IntArray = np.zeros(0, np.int64)  # the batch rows of its last step
        limits = self.prefixes.limits(
            [options.limit(len(s.ids)) for s in segments], engine.max_input_tokens
        )
        ids = engine.manifest.special_ids
        self.steps: Steps = search_steps(
            self, limits, options, bos_id=ids.bos, eos_id=ids.eos,
            deadline=lambda sentence: segments[sentence].deadline, prefixes=self.prefixes,
            constraints=[s.constraints for s in segments],
        )  # fmt: skip
        self.call: StepCall | None = None

    def rows(self) -> IntArray:
        """Batch rows of the rows the search sees."""
        g = self.batch.beam_size
        rows: IntArray = (self.slots[:, None] * g + np.arange(self.beams)[None, :]).reshape(-1)
        return rows

    # --- DecoderRows --------------------------------------------------------------------------

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        parents = beam_parents(rows, sentences, self.beams, self.batch.beam_size)
        leaving = np.setdiff1d(self.slots, self.slots[sentences])
        self.slots = self.slots[sentences]
        self.beams = len(rows) // len(sentences)
        self.batch.follow(self.slots, parents)
        self.batch.release(leaving)

    def reorder(self, rows: IntArray) -> None:
        parents = beam_parents(rows, np.arange(len(self.slots)), self.beams, self.batch.beam_size)
        self.batch.follow(self.slots, parents)

    def alignment(self) -> FloatArray | None:
        return self._alignment

    def log_probs_of(self, ids: IntArray) -> FloatArray:
        return self.batch.log_probs_of(self.stepped, ids)

    # --- Driven by the batch ------------------------------------------------------------------

    def start(self) -> Finished:
        """Run the search to its first step -> the sentences it finished (stopped already)."""
        return self._resume(None)

    def advance(self, log_probs: FloatArray, ids: IntArray) -> Finished:
        """Send the search its step's candidates -> the sentences it finished. A search that
        ends releases its slots."""
        return self._resume((log_probs, ids))

    def _resume(self, stepped: tuple[FloatArray, IntArray] | None) -> Finished:
        try:
            self.call = next(self.steps) if stepped is None else self.steps.send(stepped)
        except StopIteration as done:
            self.call = None
            self.batch.release(self.slots)
            self.slots = self.slots[:0]
            return self._answer(dict(enumerate(done.value)))
        return self._answer(self.call.finished)

    def _answer(self, nbest: dict[int, list[Hypothesis]]) -> Finished:
        engine, finished = self.batch.engine, []
        for sentence, hyps in nbest.items():
            if sentence in self.answered:
                continue
            self.answered.add(sentence)
            segment = self.segments[sentence]
            finished.append(
                (segment, engine.hypotheses(hyps, len(segment.ids), self.prefixes, sentence))
            )
        return finished


class _Batch:
    """The running batch of one beam size G over `slots` sentence slots (module docstring)."""

    def __init__(self, engine: Engine, beam_size: int, slots: int) -> None:
        manifest = engine.manifest
        dims = manifest.model
        self.engine = engine
        self.beam_size = g = beam_size
        self.n = 0  # slots in use: 0 .. n - 1
        self.clock = 0  # the cache position the next step writes
        self.served = 0.0  # decoder seconds so far (Running.step's fairness)
        self._sessions = engine.step_sessions
        self._session = self._sessions.wide  # the one bound: _bind picks it by rows
        self._pool = BufferPool()
        self._slots = slots
        self._layers = dims.decoder_layers
        self._heads, self._d_head = dims.heads, dims.d_head
        self._vocab = dims.output_vocab_size
        self._dtype = np.dtype(manifest.decoder_step.tensor(past_key(0)).dtype)
        self._capacity = min(MIN_CAPACITY, engine.max_input_tokens)
        self._limit = engine.max_input_tokens  # no sentence takes more steps
        self._width = SOURCE_WIDTH
        self._aligned = manifest.alignment is not None
        # The step's alignment_wanted (None: the graph computes the alignment at every step):
        # true while a running search keeps alignment rows.
        self._gate = wanted_alignment(manifest, False)
        self._cache = {
            name: np.zeros((slots * g, self._heads, self._capacity, self._d_head), self._dtype)
            for name in past_names(self._layers)
        }
        self._indirection = np.zeros((slots, g, self._capacity), np.int32)
        self._cross = {
            name: np.zeros((slots, self._heads, self._width, self._d_head), self._dtype)
            for name in cross_names(self._layers)
        }
        self._mask = np.zeros((slots, self._width), np.int32)  # the encoder's, per slot
        self._ids = np.zeros((slots, g), np.int64)
        self._position = np.zeros(slots * g, np.int64)
        self._start = np.zeros(slots, np.int64)  # the clock when each slot's sentence joined
        self._past_length = np.zeros(1, np.int32)
        self._top_k = np.zeros(1, np.int64)
        self._owner: list[_Search | None] = [None] * slots
        # A vocabulary shortlist: each slot's ids (Shortlist.candidates), the step's inputs over
        # the first n slots, and the count of slot changes they were made at.
        self._shortlist = engine.shortlist
        self._candidates: list[IntArray] = [np.zeros(0, np.int64)] * slots
        self._shortlist_inputs: tuple[IntArray, FloatArray] | None = None
        self._members = 0  # slot changes so far
        self._shortlisted = -1  # the count _shortlist_inputs were made at
        self._searches: list[_Search] = []
        self._binding = self._session.io_binding()
        self._bound: tuple[int, ...] = ()  # (n, layout, k, alignment wanted) of the binding
        self._layout = 0  # counts the buffers' replacements (_grow, _resize): a binding's age
        self._outputs: dict[str, np.ndarray] = {}

    def longest(self) -> int:
        """The longest running source, in tokens."""
        return int(self._mask[: self.n].sum(axis=1).max(initial=0))

    def drop(self, search: _Search) -> None:
        """Take a search out, its sentences unanswered, its slots freed."""
        if search in self._searches:
            self.release(search.slots)
            search.slots = search.slots[:0]
            self._searches.remove(search)

    def nbytes(self) -> int:
        arrays = [*self._cache.values(), *self._cross.values(), self._indirection, self._mask]
        return sum(a.nbytes for a in arrays)

    def admit(
        self, segments: list[Segment], options: DecodingOptions, cross: list[Any], mask: IntArray
    ) -> tuple[_Search, Finished]:
        """Slots n .. n + k - 1 for these sentences, with their cross keys/values (k, H, S, Dh)
        and encoder mask (k, S); their search starts (its first step is the batch's next)."""
        k, width = len(segments), mask.shape[1]
        if self.n + k > self._slots:
            raise ValueError(f"{k} sentences, {self._slots - self.n} free slots")
        if not self.n:
            self.clock = 0
        if width > self._width:
            self._resize(bucket(width))
        new = slice(self.n, self.n + k)
        for name, values in zip(cross_names(self._layers), cross, strict=True):
            self._cross[name][new] = 0
            self._cross[name][new, :, :width] = values
        self._mask[new] = 0
        self._mask[new, :width] = mask
        self._start[new] = self.clock
        if self._shortlist is not None:
            self._candidates[new] = [
                self._shortlist.candidates(s.ids, s.prefix, s.constraints) for s in segments
            ]
            self._members += 1
        search = _Search(self, segments, options, np.arange(self.n, self.n + k))
        self._owner[new] = [search] * k
        self.n += k
        self._searches.append(search)
        try:
            started = search.start()
        except Exception:
            self.drop(search)  # Running.admit's all or nothing: its slots free again
            raise
        return search, self._drop_ended(started, search)

    def step(self) -> Finished:
        """One decoder step over every running sentence -> those that finished."""
        g, n = self.beam_size, self.n
        if self.clock >= self._capacity or self._start[:n].min() >= SHIFT_POSITIONS:
            self._make_room()
        longest = self.longest()
        if self._width > SOURCE_WIDTH and 2 * longest < self._width:  # long ones have left
            self._resize(max(SOURCE_WIDTH, bucket(longest)))
        t = self.clock
        k = 0
        for search in self._searches:
            call = search.call
            assert call is not None
            if search.beams == 1 and g > 1:  # beam search's first step: G rows alike
                self._ids[search.slots] = call.tokens[:, None]
            else:
                self._ids[search.slots] = call.tokens.reshape(-1, g)
            k = max(k, call.k)
        if self._shortlist is not None and self._shortlisted != self._members:
            self._shortlist_inputs = batch_inputs(self._candidates[:n])
            self._shortlisted = self._members
            self._layout += 1  # new inputs to bind
        k = min(k, self._width_scored())
        starts = np.repeat(self._start[:n], g)  # (R,)
        self._position[: n * g] = t - starts
        self._past_length[0] = t
        aligned = self._aligned and any(search.aligned for search in self._searches)
        if self._bound != (n, self._layout, k, aligned):
            self._bind(k, aligned)
        attend = (np.arange(t + 1)[None, :] >= starts[:, None]).astype(np.int32)  # (R, T + 1)
        self._binding.bind_cpu_input(SELF_ATTENTION_MASK, attend)
        self._session.run_with_iobinding(self._binding)
        self._indirection[:n, :, t] = np.arange(g)  # each beam wrote T in its own row
        self.clock = t + 1
        # Every search's candidates first: their moves change which slot is whose.
        top_log_probs, top_ids = self._outputs[TOP_LOG_PROBS], self._outputs[TOP_IDS]
        alignment = self._outputs.get(ALIGNMENT)
        stepped = []
        for search in self._searches:
            assert search.call is not None
            rows, wanted = search.rows(), search.call.k
            search.stepped = rows
            search._alignment = (
                _width(alignment[rows], search.width)
                if alignment is not None and search.aligned
                else None
            )
            stepped.append((search, top_log_probs[rows, :wanted], top_ids[rows, :wanted]))
        finished: Finished = []
        for search, log_probs, ids in stepped:
            finished += self._drop_ended(search.advance(log_probs, ids), search)
        return finished

    def log_probs_of(self, rows: IntArray, ids: IntArray) -> FloatArray:
        """The last step's log-probs of `ids` (R, W) in these batch rows (a search's, as they
        were at the step: its moves since change its slots, not the step's outputs)."""
        inputs = self._shortlist_inputs
        shortlist = None if inputs is None else inputs[0]
        return log_probs_of(
            self._outputs[LOG_PROBS][rows],
            ids,
            shortlist,
            self.engine.manifest.model.suppressed_ids,
        )

    def follow(self, slots: IntArray, parents: IntArray | None) -> None:
        """Beam b of each of these slots now continues beam parents[., b] of the same slot
        (`beam_parents`; None: one beam continues itself)."""
        if parents is not None:
            follow_indirection(self._indirection, slots, parents, self.clock)

    def release(self, slots: IntArray) -> None:
        """Free these slots: each is filled by the last slot in use (one slot's copy)."""
        g, t = self.beam_size, self.clock
        for slot in sorted(slots.tolist(), reverse=True):
            last = self.n - 1
            if slot != last:
                for buffer in self._cache.values():
                    buffer[slot * g : (slot + 1) * g, :, :t] = buffer[
                        last * g : (last + 1) * g, :, :t
                    ]
                for buffer in (*self._cross.values(), self._mask, self._indirection, self._start):
                    buffer[slot] = buffer[last]
                owner = self._owner[last]
                assert owner is not None
                owner.slots[owner.slots == last] = slot
                self._owner[slot] = owner
                self._candidates[slot] = self._candidates[last]
            self._owner[last] = None
            self.n = last
            self._members += 1

    def _drop_ended(self, finished: Finished, search: _Search) -> Finished:
        if search.call is None:
            self._searches.remove(search)
        return finished

    def _make_room(self) -> None:
        """The clock is at the cache's last position, or far past the oldest running
        sentence's start: every row moves down by that start, or, when that is 0, the cache
        doubles."""
        n, g, t = self.n, self.beam_size, self.clock
        oldest = int(self._start[:n].min())
        if oldest == 0:
            self._grow(min(2 * self._capacity, self._limit + 1))
            return
        kept = t - oldest
        for buffer in self._cache.values():
            buffer[: n * g, :, :kept] = buffer[: n * g, :, oldest:t].copy()
        self._indirection[:n, :, :kept] = self._indirection[:n, :, oldest:t].copy()
        self._start[:n] -= oldest
        self.clock = kept

    def _grow(self, capacity: int) -> None:
        t = self.clock
        for name, old in self._cache.items():
            new = np.zeros((*old.shape[:2], capacity, old.shape[3]), self._dtype)
            new[:, :, :t] = old[:, :, :t]
            self._cache[name] = new
        indirection = np.zeros((self._slots, self.beam_size, capacity), np.int32)
        indirection[:, :, :t] = self._indirection[:, :, :t]
        self._indirection = indirection
        self._capacity = capacity
        self._layout += 1

    def _resize(self, width: int) -> None:
        """Cross keys/values for `width` source positions, at least the longest running."""
        kept = min(width, self._width)
        for name, old in self._cross.items():
            new = np.zeros((*old.shape[:2], width, old.shape[3]), self._dtype)
            new[:, :, :kept] = old[:, :, :kept]
            self._cross[name] = new
        mask = np.zeros((self._slots, width), np.int32)
        mask[:, :kept] = self._mask[:, :kept]
        self._mask = mask
        self._width = width
        self._layout += 1

    def _width_scored(self) -> int:
        """The ids a step scores: the decoder's vocabulary, or the running shortlist's."""
        inputs = self._shortlist_inputs
        return self._vocab if inputs is None else len(inputs[0])

    def _bind(self, k: int, aligned: bool) -> None:
        """Bind the first n slots' buffers (views: contiguous prefixes) and outputs for k, the
        alignment with them when `aligned` (or where the graph computes it anyway)."""
        n, g = self.n, self.beam_size
        rows = n * g
        session = self._sessions.for_rows(rows)
        if session is not self._session:
            self._session, self._binding = session, session.io_binding()
        binding = self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        self._top_k[0] = k
        inputs: dict[str, np.ndarray] = {
            INPUT_IDS: self._ids[:n],
            POSITION: self._position[:rows],
            ENCODER_ATTENTION_MASK: self._mask[:n],
            CACHE_INDIRECTION: self._indirection[:n],
            PAST_SEQUENCE_LENGTH: self._past_length,
            TOP_K: self._top_k,
            **{name: value[:n] for name, value in self._cross.items()},
            **{name: value[:rows] for name, value in self._cache.items()},
        }
        if self._shortlist_inputs is not None:
            inputs[SHORTLIST], inputs[SHORTLIST_MASK] = self._shortlist_inputs
        if self._gate is not None:
            self._gate[0] = aligned
            inputs[ALIGNMENT_WANTED] = self._gate
        for name, array in inputs.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for past, present in zip(
            past_names(self._layers), present_names(self._layers), strict=True
        ):
            binding.bind_ortvalue_output(
                present, ort.OrtValue.ortvalue_from_numpy(self._cache[past][:rows])
            )
        shapes: dict[str, tuple[tuple[int, int], Any]] = {
            LOG_PROBS: ((rows, self._width_scored()), np.float32),
            TOP_LOG_PROBS: ((rows, k), np.float32),
            TOP_IDS: ((rows, k), np.int64),
        }
        if aligned or (self._gate is None and self._aligned):
            shapes[ALIGNMENT] = ((rows, self._width), np.float32)
        for name, (shape, dtype) in shapes.items():
            self._outputs[name] = self._pool.host(name, shape, np.dtype(dtype))
            binding.bind_ortvalue_output(
                name, ort.OrtValue.ortvalue_from_numpy(self._outputs[name])
            )
        self._bound = (n, self._layout, k, aligned)
        if ALIGNMENT not in shapes:
            self._outputs.pop(ALIGNMENT, None)


def _width(alignment: FloatArray, width: int) -> FloatArray:
    """A search's alignment rows over its own sources' width: the batch's grows and shrinks
    with the sentences it runs (what lies past a running sentence's source is 0)."""
    if alignment.shape[1] >= width:
        return alignment[:, :width]
    padded = np.zeros((len(alignment), width), alignment.dtype)
    padded[:, : alignment.shape[1]] = alignment
    return padded
