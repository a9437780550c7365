"""One batch's decoder state over decoder_step.onnx (bundle format 7): the static key/value
cache, how beams follow their back-pointers through it, and the graph's inputs and outputs,
bound once per batch.

The cache of each layer is one (R, H, C, Dh) buffer per key and value, R = N * G rows (G per
sentence: its beams), C positions. It is bound as both the step's past input and its present
output, so each step writes its key/value at position T in place. How beams follow their
back-pointers depends on the bundle's `decoder_cache` (service/bundle/manifest.py):
- "indirection": only `cache_indirection` (N, G, C) changes: entry [n, g, t] names the beam of
  sentence n whose row holds position t of beam g. No step copies the cache.
- "gather": `beam_rows` (R,) names the row each row continues; the next step gathers the cache
  by it inside the graph (identity when no beam moved).
The first step of beam search runs each sentence's G rows on the same token (all beams start
alike); the expansion that follows points every beam at beam 0.

Finished sentences, two policies:
- compact (the CPU default): once an eighth of the rows have finished, the live sentences'
  rows move to the front of the buffers and the graph runs on those alone.
- padded (CUDA): rows stay where they are until the batch ends, the finished ones computed and
  ignored, so every step of a batch has the same shapes and buffer addresses (what CUDA graphs
  need; on a GPU a few more rows cost next to nothing). The engine also pads batches to
  power-of-two sentences and to a multiple of `engine.SOURCE_BUCKET` source positions, so few shapes
  ever occur and the buffers of each are allocated once and reused.

Where tensors live: on the CPU every buffer is a numpy array that its bound OrtValue aliases,
so the host writes the step's tokens, position and beam bookkeeping in place and ONNX Runtime
reads them. On CUDA the buffers are device OrtValues; those inputs are copied into them before a
step (`OrtValue.update_inplace`), and only the top-k candidates come back. Buffers are zeroed
when allocated: the gather cache attends over positions it has not written yet (masked), and
masked garbage must still be finite.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from service.bundle.manifest import (
    ALIGNMENT,
    ALIGNMENT_WANTED,
    BEAM_ROWS,
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
    Manifest,
    ModelDims,
    cross_names,
    past_key,
    past_names,
    present_names,
)

# A graph input or output: a numpy array on the host, or an ort.OrtValue that may live on the
# GPU (ONNX Runtime ships no type stubs, so this cannot be spelled closer).
Value = Any

MIN_CAPACITY = 16  # the cache starts with at least this many positions, and doubles
# Compact policy: finished rows are moved out once they are this fraction of the batch. A
# compaction copies the live rows' cache and rebinds the step (1.5 ms at 32 rows on 2 cores,
# about 15 row-steps); a finished row left in costs one row-step per step.
COMPACT_FRACTION = 1 / 8


# A decoder step of fewer multiply-adds than this runs on one intra-op thread where the others
# sleep between kernels (StepSessions; where they spin there is no such session: on the
# shipped model two spinning threads ran a step of 1-256 rows 1.14-1.62x as fast as one).
# Measured on the shipped model (1.9 M multiply-adds a row), 2-core Intel Xeon, the step alone
# (benchmarks/step_threads.py): one thread against two, 1.10x at 1 row, 1.17x at 8, 1.09x at
# 32, 0.92x at 64, 0.78x at 128; int8 1.41x, 1.34x, 1.25x, 0.99x, 0.95x.
NARROW_STEP_MACS = 120_000_000
# Only a model whose steps of this many rows are still that few gets the one-thread session. A
# larger one's step streams more weights than one core's caches hold, which two threads read
# faster even at one row (benchmarks/marian_bench's OPUS-MT-base-size model, 38 M a row: 103
# against 142-151 tokens/s at batch 1, greedy), and a second session would hold a second copy
# of them (about +280 MB there).
MIN_NARROW_ROWS = 16


def step_macs_per_row(dims: ModelDims) -> int:
    """About how many multiply-adds a decoder step costs a row: each layer's self-attention
    (q, k, v and out: 4 d^2), cross-attention (q and out: 2 d^2) and feed-forward (taken as
    4 d wide: 8 d^2), and the output projection (d V)."""
    d = dims.d_model
    return dims.decoder_layers * 14 * d * d + d * dims.output_vocab_size


def narrow_rows(dims: ModelDims) -> int:
    """The rows under which a step of this model runs on one thread (StepSessions.narrow):
    those NARROW_STEP_MACS buys, or 0 (never) for a model where that is under MIN_NARROW_ROWS."""
    rows = NARROW_STEP_MACS // step_macs_per_row(dims)
    return rows if rows >= MIN_NARROW_ROWS else 0


@dataclass(frozen=True)
class StepSessions:
    """The decoder step's sessions: `wide` on the engine's intra-op threads and, where those
    are several and sleep between kernels, `narrow` on one thread for steps of fewer than
    `narrow_rows` rows. A step of a
    few rows is microseconds of arithmetic per node, which waking threads costs more than it
    saves (NARROW_STEP_MACS); a step of many rows is work they share. Both sessions compute
    the same values (their kernels split rows and columns across threads, not sums: the same
    tokens and scores in the tests and benchmarks), so which one runs a step does not change
    a translation."""

    wide: ort.InferenceSession
    narrow: ort.InferenceSession | None = None
    narrow_rows: int = 0

    @property
    def all(self) -> tuple[ort.InferenceSession, ...]:
        return (self.wide,) if self.narrow is None else (self.wide, self.narrow)

    def for_rows(self, rows: int) -> ort.InferenceSession:
        """The session for a step over this many rows."""
        if self.narrow is not None and rows < self.narrow_rows:
            return self.narrow
        return self.wide


def bucket(n: int) -> int:
    """The smallest power of two >= n: the padded policy's sentence count for n sentences."""
    return 1 << max(0, n - 1).bit_length()


def initial_capacity(limit: int, source_length: int, padded: bool) -> int:
    """Cache positions for a batch, at most `limit` (the most steps it may take); a batch that
    outgrows them doubles them, copying what is cached. The attention kernels work over every
    position of the buffer (the CPU's cost 3.7 times as many instructions at 256 positions as
    at 32, for the same 21 cached: callgrind, 128 rows), so a compacted batch (the CPU: a
    growth is a cheap host copy) starts at its longest source's power of two; a padded one
    (a GPU: a growth goes through the host and makes a new graph shape) covers twice the source
    and 16 more, which a translation seldom outruns. At least MIN_CAPACITY either way."""
    wanted = 2 * source_length + 16 if padded else source_length
    return min(limit, max(MIN_CAPACITY, bucket(wanted)))


MAX_CUDA_GRAPHS = 64  # an engine's CUDA graphs by default (CudaGraphs)


class CudaGraphs:
    """The decoder-step shapes an engine runs as CUDA graphs, each under its own ONNX Runtime
    `gpu_graph_id`: ONNX Runtime runs an id's first run plainly (its warm-up), captures the
    second and replays every later one. It keeps a captured graph and the memory its capture
    took for the session's life, so
    GPU memory grows with every shape captured (an H100 soak: 1,249 -> 2,053 MiB over 210 s,
    the last growth after 86,000 requests, benchmarks/RESULTS.md); at most `limit` shapes get a
    graph, in the order they come, and the later ones run without."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the CUDA graph limit must be at least 1, got {limit}")
        self.limit = limit
        self._ids: dict[tuple[int, ...], int] = {}
        self._options: dict[int, ort.RunOptions] = {}  # by graph id, -1 included: made once

    @property
    def captured(self) -> int:
        """Shapes given a graph id (each captured at its second run under it)."""
        return len(self._ids)

    def id_for(self, shape: tuple[int, ...]) -> int:
        """The `gpu_graph_id` of a step of this shape, its memory allocated by an earlier plain
        run: the shape's graph, a new one while fewer than `limit` exist, else -1 (none)."""
        graph = self._ids.get(shape)
        if graph is None:
            if len(self._ids) >= self.limit:
                return -1
            graph = self._ids[shape] = len(self._ids) + 1  # 0: ONNX Runtime's default, reserved
        return graph

    def run_options(self, graph: int) -> ort.RunOptions:
        """The options of a step under this `gpu_graph_id` (-1: none)."""
        options = self._options.get(graph)
        if options is None:
            options = self._options[graph] = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph))
        return options


@dataclass
class BufferPool:
    """The buffers of past batches, reused by the next ones of the same shapes.

    CPU: one flat numpy array per name, grown to the largest request; a buffer is a view of its
    prefix, so any shape up to the largest reuses the same memory. CUDA: one OrtValue per name
    and shape, so a shape always gets the same device address (CUDA graphs replay on fixed
    addresses). Either way the memory held is bounded by the shapes that occur, not by the
    number of batches. New memory is zeroed.
    """

    device_type: str = "cpu"
    device_id: int = 0
    _flat: dict[str, np.ndarray] = field(default_factory=dict)
    _device: dict[tuple[str, tuple[int, ...], str], Value] = field(default_factory=dict)

    @property
    def on_device(self) -> bool:
        return self.device_type != "cpu"

    def host(self, name: str, shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
        """A host array of `shape` on the pooled memory of `name` (what earlier views left)."""
        size = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.size < size or flat.dtype != dtype:
            flat = self._flat[name] = np.zeros(size, dtype)
        return flat[:size].reshape(shape)

    def buffer(self, name: str, shape: Sequence[int], dtype: np.dtype[Any]) -> Value:
        """A buffer the graph reads or writes: a host array, or the device OrtValue of this
        name and shape (always the same one)."""
        if not self.on_device:
            return self.host(name, shape, dtype)
        key = (name, tuple(shape), dtype.name)
        value = self._device.get(key)
        if value is None:
            zeros = np.zeros(shape, dtype)
            value = ort.OrtValue.ortvalue_from_numpy(zeros, self.device_type, self.device_id)
            self._device[key] = value
        return value

    def nbytes(self) -> int:
        """Bytes held (host arrays, and device values by their shapes)."""
        host = sum(a.nbytes for a in self._flat.values())
        device = sum(
            int(np.prod(shape)) * np.dtype(dtype).itemsize for _, shape, dtype in self._device
        )
        return host + device


class StaticCacheState:
    """`service.inference.search.DecoderState` over decoder_step.onnx with a static, in-place cache.

    Rows as the search sees them: one per live sentence before beam search expands them, then
    G per live sentence, in the order of `self.live` (the sentences' slots in the buffers).
    """

    def __init__(
        self,
        sessions: StepSessions,
        manifest: Manifest,
        pool: BufferPool,
        cross: Mapping[str, Value],
        attention_mask: np.ndarray,
        *,
        sentences: int,
        beam_size: int,
        capacity: int,
        limit: int,
        padded: bool,
        graphs: CudaGraphs | None = None,
        shortlist: tuple[np.ndarray, np.ndarray] | None = None,
        aligned: bool = True,
    ) -> None:
        """`cross` and `attention_mask` (N, S) have one row per slot, N >= `sentences` (the
        padded policy's extra slots are never live); so has the mask of `shortlist` (a bundle
        with one: the step's `shortlist` (V',) and `shortlist_mask` (N, V') inputs,
        service/inference/shortlist.py). `capacity` is the cache's positions to
        start with (`initial_capacity`); a step past them doubles it, up to `limit`, the most
        steps the batch may take (at most the model's positions).

        `graphs` (CUDA graphs; padded policy and gather cache only): the engine's CUDA graphs
        of step shapes, kept across batches. A shape's first step in a batch runs plainly (its
        memory is allocated then, not during a capture), the later ones under the shape's
        graph id where `graphs` has room for it (ONNX Runtime runs a new id once plainly,
        captures it at the next run and replays it after that). What a kernel reads on the host is
        replayed as it was captured: top_k is part of the shape; nothing else is read on the
        host.

        `aligned`: `alignment` returns each step's rows (a model with an alignment output);
        without, a graph with `alignment_wanted` skips the aligner's nodes."""
        if pool.on_device and not padded:
            raise ValueError("a device cache is padded: rows move between steps on the host only")
        if graphs is not None and not (padded and manifest.decoder_cache == "gather"):
            raise ValueError("CUDA graphs replay fixed shapes: a padded batch, a gather cache")
        dims = manifest.model
        self.pool, self.padded = pool, padded
        self._sessions = sessions
        # Ids a step scores: the decoder's (a separate target one), or the shortlist's.
        self.vocab_size = dims.output_vocab_size if shortlist is None else len(shortlist[0])
        self._shortlist = shortlist
        self._output_vocab = dims.output_vocab_size
        self._suppressed = dims.suppressed_ids
        self.beam_size = beam_size
        self.indirection = manifest.decoder_cache == "indirection"
        self.live = np.arange(sentences)
        self._beam_index = np.arange(beam_size, dtype=np.int32)
        self.beams = 1  # rows per sentence the search sees: beam_size once expanded
        self.position = 0  # positions cached so far: the next step's position T
        self._graphs = graphs
        self._warm: set[tuple[int, ...]] = set()
        self._slots = attention_mask.shape[0]
        self._capacity = capacity
        self._limit = limit
        self._layers = dims.decoder_layers
        self._cache_shape = (dims.heads, dims.d_head)
        self._cache_dtype = np.dtype(manifest.decoder_step.tensor(past_key(0)).dtype)
        # Host arrays the step reads: written in place before each run.
        rows = self._slots * beam_size
        self._ids = np.zeros((self._slots, beam_size), np.int64)  # (N, G)
        self._position = np.zeros(rows, np.int64)  # (R,)
        self._past_length = np.zeros(1, np.int32)  # indirection: read on the host
        # Indirection: the memory of the self-attention mask, (R, T + 1) ones at step T.
        self._attend = np.ones(rows * (limit + 1) if self.indirection else 0, np.int32)
        self._indirection = np.zeros((self._slots, beam_size, capacity), np.int32)  # (N, G, C)
        self._beam_rows = np.arange(rows, dtype=np.int64)  # gather: (R,)
        self._top_k = np.zeros(1, np.int64)
        self._mask = np.ascontiguousarray(attention_mask, np.int32)  # (N, S)
        self._cross = dict(cross)
        self._k = 0  # candidates per row the outputs are bound for
        self._has_alignment = manifest.alignment is not None
        self._aligned = aligned and self._has_alignment
        # Where the graph can skip the alignment (an If on this input), it is asked to exactly
        # when wanted; elsewhere it is computed (and bound) at every step.
        self._gate = wanted_alignment(manifest, self._aligned)
        self.session = sessions.for_rows(self._slots * beam_size)  # the one bound
        self._binding = self.session.io_binding()
        self._inputs: dict[str, Value] = {}
        self._outputs: dict[str, Value] = {}
        self._cache: dict[str, Value] = {}
        self._stepped = np.zeros(0, np.int64)  # the buffer rows of the last step's rows
        self._bind_inputs()

    # --- DecoderState ------------------------------------------------------------------------

    def step(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        t, g = self.position, self.beam_size
        if t >= self._capacity:
            self._grow(min(2 * self._capacity, self._limit))
        if self.beams == 1 and g > 1:
            # Beam search's first step: each sentence's G rows start alike.
            self._ids[self.live] = tokens.reshape(-1, 1)
        else:
            self._ids[self.live] = tokens.reshape(-1, g)
        self._position[:] = t
        self._past_length[0] = t
        k = min(k, self.vocab_size)
        if k != self._k:
            self._bind_outputs(k)
        for name, array in ((INPUT_IDS, self._ids), (POSITION, self._position)):
            self._push(name, array)
        if self.indirection:
            # Every row attends to every position cached (all its own: the batch started
            # together), (R, T + 1) ones.
            self._binding.bind_cpu_input(
                SELF_ATTENTION_MASK, self._attend[: self._slots * g * (t + 1)].reshape(-1, t + 1)
            )
        else:
            self._push(BEAM_ROWS, self._beam_rows)
        self.session.run_with_iobinding(self._binding, self._run_options(k))
        self.position = t + 1
        if self.indirection:
            self._indirection[:, :, t] = self._beam_index  # each beam wrote T in its own row
        else:
            self._beam_rows[:] = np.arange(len(self._beam_rows))  # the gather is applied
        rows = self._stepped = self._rows()
        return self._host(TOP_LOG_PROBS)[rows], self._host(TOP_IDS)[rows]  # (R, k) copies

    @property
    def live(self) -> np.ndarray:
        """The slot of each live sentence, in the search's order."""
        return self._live

    @live.setter
    def live(self, slots: np.ndarray) -> None:
        self._live = slots
        self._row_index: np.ndarray | None = None  # _rows, made again at the next step

    def select(self, rows: np.ndarray, sentences: np.ndarray) -> None:
        parents = beam_parents(rows, sentences, self.beams, self.beam_size)
        self.live = self.live[sentences]
        self.beams = len(rows) // len(sentences)
        self._follow(parents)
        finished = self._slots - len(self.live)
        if not self.padded and finished and finished >= COMPACT_FRACTION * self._slots:
            self._compact()

    def reorder(self, rows: np.ndarray) -> None:
        self._follow(beam_parents(rows, np.arange(len(self.live)), self.beams, self.beam_size))

    def alignment(self) -> np.ndarray | None:
        if not self._aligned:
            return None
        rows: np.ndarray = self._host(ALIGNMENT)[self._stepped]  # (R, S) copy
        return rows

    def log_probs_of(self, ids: np.ndarray) -> np.ndarray:
        shortlist = None if self._shortlist is None else self._shortlist[0]
        log_probs = self._host(LOG_PROBS)[self._stepped]
        return log_probs_of(log_probs, ids, shortlist, self._suppressed)

    # --- What the parity checks read ----------------------------------------------------------

    def log_probs(self) -> np.ndarray:
        """The last step's log-probs of the live rows as a search sees them, (R, V): the
        suppressed ids at -inf (the graph leaves them out of its top-k only); with a
        shortlist, every id outside it too."""
        log_probs = np.array(self._host(LOG_PROBS)[self._rows()])
        if self._shortlist is None:
            log_probs[:, list(self._suppressed)] = -np.inf
            return log_probs
        full = np.full((len(log_probs), self._output_vocab), -np.inf, np.float32)
        # Each id's first column: a padded shortlist repeats its last id, masked.
        ids, first = np.unique(self._shortlist[0], return_index=True)
        full[:, ids] = log_probs[:, first]
        return full

    def cache(self, name: str) -> np.ndarray:
        """The keys or values (`past_key(i)` / `past_value(i)`) of the live rows, as each one
        will see them at the next step: (R, H, T, Dh), T the positions cached."""
        t, g = self.position, self.beam_size
        buffer = _on_host(self._cache[name])  # (N * G, H, C, Dh)
        if self.indirection:
            beams = self._indirection[self.live, : self.beams, :t]  # (n, beams, T)
            rows = self.live[:, None, None] * g + beams  # the row holding each position
        else:
            rows = np.broadcast_to(
                self._beam_rows[self._rows()].reshape(len(self.live), -1, 1),
                (len(self.live), self.beams, t),
            )
        gathered = buffer[rows, :, np.arange(t)[None, None, :]]  # (n, beams, T, H, Dh)
        seen = len(self.live) * self.beams
        return np.asarray(gathered.reshape(seen, t, *self._cache_shape).transpose(0, 2, 1, 3))

    # --- Internals ----------------------------------------------------------------------------

    def _rows(self) -> np.ndarray:
        """Buffer rows of the rows the search sees (kept until `live` changes, which `beams`
        changes with: every step asks)."""
        if self._row_index is None:
            beams = np.arange(self.beams)
            self._row_index = (self.live[:, None] * self.beam_size + beams[None, :]).reshape(-1)
        return self._row_index

    def _follow(self, parents: np.ndarray | None) -> None:
        """Beam b of each live sentence now continues beam parents[., b] of that sentence."""
        if parents is None:
            return  # one beam continues itself
        if self.indirection:
            follow_indirection(self._indirection, self.live, parents, self.position)
            self._push(CACHE_INDIRECTION, self._indirection)
        else:
            # Its row of the next gather is its parent's (composed with any pending move).
            g = self.beam_size
            base = (self.live * g)[:, None]
            self._beam_rows[base + np.arange(g)] = self._beam_rows[base + parents]

    def _compact(self) -> None:
        """Move the live sentences to the front: slots 0 .. n - 1, and run on those alone
        (compact policy: host buffers). A pending gather is applied on the way."""
        live, n, g, t = self.live, len(self.live), self.beam_size, self.position
        rows = (live[:, None] * g + np.arange(g)[None, :]).reshape(-1)
        sources = rows if self.indirection else self._beam_rows[rows]
        for name in past_names(self._layers):
            old = self._cache[name]
            new = self.pool.host(name, (n * g, *self._cache_dims()), self._cache_dtype)
            new[:, :, :t] = old[sources, :, :t]  # a copy first: old and new share memory
            self._cache[name] = new
        self._ids = self._ids[live]
        self._indirection = self._indirection[live]
        self._mask = self._mask[live]
        if self._shortlist is not None:
            ids, by_sentence = self._shortlist
            self._shortlist = ids, by_sentence[live]
        self._cross = {name: value[live] for name, value in self._cross.items()}
        self._slots = n
        self._position = self._position[: n * g].copy()
        self._beam_rows = np.arange(n * g, dtype=np.int64)
        self.live = np.arange(n)
        self._bind_inputs()

    def _grow(self, capacity: int) -> None:
        """More positions: the cached ones are copied over (through the host on a device; rare,
        see `initial_capacity`)."""
        t, rows = self.position, self._slots * self.beam_size
        heads, d_head = self._cache_shape
        shape = (rows, heads, capacity, d_head)
        for name in past_names(self._layers):
            cached = _on_host(self._cache[name])[:, :, :t].copy()
            grown = self.pool.buffer(name, shape, self._cache_dtype)
            if isinstance(grown, np.ndarray):
                grown[:, :, :t] = cached
            else:
                host = np.zeros(shape, self._cache_dtype)
                host[:, :, :t] = cached
                grown.update_inplace(host)
            self._cache[name] = grown
        indirection = np.zeros((self._slots, self.beam_size, capacity), np.int32)
        indirection[:, :, :t] = self._indirection[:, :, :t]
        self._indirection = indirection
        self._capacity = capacity
        self._bind_inputs()

    def _cache_dims(self) -> tuple[int, int, int]:
        heads, d_head = self._cache_shape
        return heads, self._capacity, d_head

    def _host(self, name: str) -> np.ndarray:
        return _on_host(self._outputs[name])

    def _bind_inputs(self) -> None:
        """(Re)bind every input, and the cache as past and present; the outputs follow at the
        next step."""
        pool = self.pool
        rows = self._slots * self.beam_size
        session = self._sessions.for_rows(rows)  # compacted, a batch may move to `narrow`
        if session is not self.session:
            self.session, self._binding = session, session.io_binding()
        binding = self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        shape = (rows, *self._cache_dims())
        for past in past_names(self._layers):
            buffer = self._cache.get(past)
            if buffer is None or buffer.shape != shape:  # the pool gives views on its memory
                buffer = self._cache[past] = pool.buffer(past, shape, self._cache_dtype)
        arrays: list[tuple[str, np.ndarray]] = [
            (INPUT_IDS, self._ids),
            (POSITION, self._position),
            (ENCODER_ATTENTION_MASK, self._mask),
        ]
        if self._shortlist is not None:
            arrays += zip((SHORTLIST, SHORTLIST_MASK), self._shortlist, strict=True)
        if self.indirection:
            arrays.append((CACHE_INDIRECTION, self._indirection))
            # Read by the attention kernel on the host, whatever the device.
            self._inputs[PAST_SEQUENCE_LENGTH] = ort.OrtValue.ortvalue_from_numpy(self._past_length)
        else:
            arrays.append((BEAM_ROWS, self._beam_rows))
        for name, array in arrays:
            self._inputs[name] = self._bind_host(name, array)
        self._inputs[TOP_K] = ort.OrtValue.ortvalue_from_numpy(self._top_k)  # read on the host
        if self._gate is not None:  # read on the host by the If
            self._inputs[ALIGNMENT_WANTED] = ort.OrtValue.ortvalue_from_numpy(self._gate)
        for name, value in self._cross.items():
            self._inputs[name] = _value(value)
        for name, value in self._inputs.items():
            binding.bind_ortvalue_input(name, value)
        for past in past_names(self._layers):
            binding.bind_ortvalue_input(past, _value(self._cache[past]))
        self._k = 0

    def _bind_outputs(self, k: int) -> None:
        """The cache as each layer's present, and the other outputs into buffers of their own
        (log_probs too: never read by the search, but left unbound ONNX Runtime would allocate
        (R, V) floats at every step)."""
        self._top_k[0] = k
        rows = self._slots * self.beam_size
        binding = self._binding
        binding.clear_binding_outputs()
        for past, present in zip(
            past_names(self._layers), present_names(self._layers), strict=True
        ):
            binding.bind_ortvalue_output(present, _value(self._cache[past]))
        outputs: list[tuple[str, tuple[int, int], np.dtype[Any]]] = [
            (LOG_PROBS, (rows, self.vocab_size), np.dtype(np.float32)),
            (TOP_LOG_PROBS, (rows, k), np.dtype(np.float32)),
            (TOP_IDS, (rows, k), np.dtype(np.int64)),
        ]
        if self._aligned or (self._gate is None and self._has_alignment):
            outputs.append((ALIGNMENT, (rows, self._mask.shape[1]), np.dtype(np.float32)))
        for name, shape, dtype in outputs:
            self._outputs[name] = self.pool.buffer(name, shape, dtype)
            binding.bind_ortvalue_output(name, _value(self._outputs[name]))
        self._k = k

    def _bind_host(self, name: str, array: np.ndarray) -> Value:
        """The bound value of a host array the step reads: an alias of the array on the CPU
        (bound again whenever the array is replaced), a pooled device copy on CUDA (refreshed
        by `_push`)."""
        if not self.pool.on_device:
            return ort.OrtValue.ortvalue_from_numpy(array)
        value = self.pool.buffer(name, array.shape, array.dtype)
        value.update_inplace(array)
        return value

    def _push(self, name: str, array: np.ndarray) -> None:
        if self.pool.on_device:
            self._inputs[name].update_inplace(array)

    def _run_options(self, k: int) -> ort.RunOptions | None:
        if self._graphs is None:
            return None
        shape = (
            self._slots,
            self.beam_size,
            self._mask.shape[1],
            self._capacity,
            k,
            self.vocab_size,
        )
        if shape in self._warm:
            graph = self._graphs.id_for(shape)
        else:
            self._warm.add(shape)
            graph = -1
        return self._graphs.run_options(graph)


def log_probs_of(
    log_probs: np.ndarray,
    ids: np.ndarray,
    shortlist: np.ndarray | None,
    suppressed: Collection[int],
) -> np.ndarray:
    """The log-probs (R, W) of `ids` (R, W) in a step's `log_probs` (R, V') of the same rows,
    whose columns are the vocabulary's or a shortlist's ids (`shortlist`, ascending, its last
    perhaps repeated); -inf for an id outside the shortlist, or suppressed (the graph leaves
    those out of its top-k only)."""
    columns, valid = ids, np.ones(ids.shape, bool)
    if shortlist is not None:
        columns = np.minimum(np.searchsorted(shortlist, ids), len(shortlist) - 1)
        valid = shortlist[columns] == ids
    scored = np.take_along_axis(log_probs, columns, axis=1).astype(np.float32)
    scored[~valid | np.isin(ids, list(suppressed))] = -np.inf
    return scored


def wanted_alignment(manifest: Manifest, wanted: bool) -> np.ndarray | None:
    """The step's `alignment_wanted` input, (1,) bool, where its graph has one (bundle format
    7, the indirection cache); None where the graph computes the alignment at every step."""
    if ALIGNMENT_WANTED not in manifest.decoder_step.input_names:
        return None
    return np.array([wanted])


def beam_parents(
    rows: np.ndarray, sentences: np.ndarray, beams: int, beam_size: int
) -> np.ndarray | None:
    """A search's move (`DecoderRows.select` of `sentences`, or `reorder` with all of them) as
    the beam of its sentence each of the beam_size beams of each kept sentence continues,
    (n, beam_size); `rows` are grouped by sentence, `beams` per sentence before the move. After
    the first step (one row per sentence before) every beam continues beam 0. None with one
    beam: it continues itself."""
    if beam_size == 1:
        return None
    if beams < beam_size:
        return np.zeros((len(sentences), beam_size), np.int64)
    parents: np.ndarray = rows.reshape(len(sentences), -1) - (sentences * beams)[:, None]
    return parents


def follow_indirection(
    indirection: np.ndarray, slots: np.ndarray, parents: np.ndarray, positions: int
) -> None:
    """In place: beam b of each of `slots` now reads each of the first `positions` cached
    positions where beam parents[., b] of its slot did; the cache itself never moves."""
    ours = indirection[slots, :, :positions]  # (n, G, T) copy
    indirection[slots, :, :positions] = ours[np.arange(len(slots))[:, None], parents]


def _on_host(value: Value) -> np.ndarray:
    """A host array as it is; a device OrtValue copied to the host."""
    return value if isinstance(value, np.ndarray) else np.asarray(value.numpy())


def _value(buffer: Value) -> Value:
    if isinstance(buffer, np.ndarray):
        return ort.OrtValue.ortvalue_from_numpy(buffer)
    return buffer


def cross_inputs(manifest: Manifest, values: Sequence[Value]) -> dict[str, Value]:
    """The encoder's cross keys/values by decoder input name (the encoder's outputs after
    memory, in `cross_names` order)."""
    return dict(zip(cross_names(manifest.model.decoder_layers), values, strict=True))
