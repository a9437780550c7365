"""One batch's decoder state over decoder_step.onnx (bundle format 4): the static key/value
cache, the cache indirection of beam search, and the graph's inputs and outputs, bound once.

The cache of each layer is one (R, H, C, Dh) buffer per key and value, R = N * G rows (G per
sentence: its beams), C positions. It is bound as both the step's past input and its present
output, so ONNX Runtime writes each step's key/value at position T in place: a step copies no
cache. When beams follow their back-pointers, only `cache_indirection` (N, G, C) changes: entry
[n, g, t] names the beam of sentence n whose row holds position t of beam g. The first step of
beam search runs each sentence's G rows on the same token (all beams start alike), then the
indirection points every beam at beam 0.

Finished sentences, two policies:
- compact (the CPU default): the live sentences' rows move to the front of the buffers and
  the graph runs on the live rows only, as the search sees them.
- padded (CUDA): rows stay where they are until the batch ends, the finished ones computed
  and ignored, so every step of a batch has the same shapes and buffer addresses (what CUDA
  graphs need; on a GPU a few more rows cost next to nothing). Batches are also padded to
  power-of-two sentences and to a multiple of `SOURCE_BUCKET` source positions, so few shapes
  ever occur and the buffers of each are allocated once and reused.

Where tensors live: on the CPU every buffer is a numpy array that its bound OrtValue aliases,
so the host writes the step's tokens and indirection in place and ONNX Runtime sees them. On
CUDA the buffers are device OrtValues; the tokens, position and indirection are copied into
them before each step (`OrtValue.update_inplace`), and only the top-k candidates come back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from service.bundle import (
    CACHE_INDIRECTION,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOG_PROBS,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    Manifest,
    cross_names,
    past_key,
    past_names,
    present_names,
)

# A graph input or output: a numpy array on the host, or an ort.OrtValue that may live on the
# GPU (ONNX Runtime ships no type stubs, so this cannot be spelled closer).
Value = Any

SOURCE_BUCKET = 8  # padded policy: source lengths are padded to a multiple of this
MIN_CAPACITY = 32  # compact policy: the cache starts with this many positions and doubles


def bucket(n: int) -> int:
    """The smallest power of two >= n: the padded policy's sentence count for n sentences."""
    return 1 << max(0, n - 1).bit_length()


def source_bucket(length: int) -> int:
    return -(-length // SOURCE_BUCKET) * SOURCE_BUCKET


@dataclass
class BufferPool:
    """The buffers of past batches, reused by the next ones of the same shapes.

    CPU: one flat numpy array per name, grown to the largest request; a buffer is a view of its
    prefix, so any shape up to the largest reuses the same memory. CUDA: one OrtValue per name
    and shape, so a shape always gets the same device address (CUDA graphs replay on fixed
    addresses). Either way the memory held is bounded by the shapes that occur, not by the
    number of batches.
    """

    device_type: str = "cpu"
    device_id: int = 0
    _flat: dict[str, np.ndarray] = field(default_factory=dict)
    _device: dict[tuple[str, tuple[int, ...], str], Value] = field(default_factory=dict)

    def host(self, name: str, shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
        """A host array of `shape` on the pooled memory of `name` (contents undefined)."""
        size = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.size < size or flat.dtype != dtype:
            flat = self._flat[name] = np.empty(size, dtype)
        return flat[:size].reshape(shape)

    def device(self, name: str, shape: Sequence[int], dtype: np.dtype[Any]) -> Value:
        """A device OrtValue of `shape` for `name`, the same one for the same shape."""
        key = (name, tuple(shape), dtype.name)
        value = self._device.get(key)
        if value is None:
            value = ort.OrtValue.ortvalue_from_shape_and_type(
                list(shape), dtype.type, self.device_type, self.device_id
            )
            self._device[key] = value
        return value

    @property
    def on_device(self) -> bool:
        return self.device_type != "cpu"

    def nbytes(self) -> int:
        """Bytes held (host arrays, and device values by their shapes)."""
        host = sum(a.nbytes for a in self._flat.values())
        device = sum(
            int(np.prod(shape)) * np.dtype(dtype).itemsize for _, shape, dtype in self._device
        )
        return host + device


class StaticCacheState:
    """`service.decoding.DecoderState` over decoder_step.onnx with a static, in-place cache.

    Rows as the search sees them: one per live sentence before beam search expands them, then
    G per live sentence, in the order of `self.live` (the sentences' slots in the buffers).
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        manifest: Manifest,
        pool: BufferPool,
        cross: Mapping[str, Value],
        attention_mask: np.ndarray,
        *,
        sentences: int,
        beam_size: int,
        capacity: int,
        padded: bool,
        graph_ids: dict[tuple[int, ...], int] | None = None,
    ) -> None:
        """`cross` and `attention_mask` (N, S) have one row per slot, N >= `sentences` (the
        padded policy's extra slots are never live). `capacity` is the cache's positions: the
        padded policy never grows it, so it must cover every step of the batch.

        `graph_ids` (CUDA graphs, padded policy): one CUDA graph per step shape and position,
        numbered in this map, which the engine keeps across batches. A captured step replays
        what ONNX Runtime's kernels read on the host when it was captured (the attention's
        past_sequence_length, TopK's k), so the position is part of the key; the device
        buffers of a shape are always the same ones (BufferPool)."""
        if pool.on_device and not padded:
            raise ValueError("a device cache is padded: rows move between steps on the host only")
        if graph_ids is not None and not padded:
            raise ValueError("CUDA graphs replay fixed shapes: the batch must be padded")
        dims = manifest.model
        self.session, self.pool, self.padded = session, pool, padded
        self._graph_ids = graph_ids
        self.vocab_size = dims.vocab_size
        self.beam_size = beam_size
        self.live = np.arange(sentences)  # slot of each live sentence, in the search's order
        self.beams = 1  # rows per sentence the search sees: beam_size once expanded
        self.position = 0  # positions cached so far: the next step's position T
        self._slots = attention_mask.shape[0]
        self._capacity = capacity
        self._layers = dims.decoder_layers
        self._cache_shape = (dims.heads, dims.d_head)
        self._cache_dtype = np.dtype(manifest.decoder_step.tensor(past_key(0)).dtype)
        # Host arrays the step reads: written in place before each run.
        self._ids = np.zeros((self._slots, beam_size), np.int64)  # (N, G)
        self._position = np.zeros(1, np.int64)
        self._past_length = np.zeros(1, np.int32)  # bound on the host on every device
        self._indirection = np.zeros((self._slots, beam_size, capacity), np.int32)  # (N, G, C)
        self._top_k = np.zeros(1, np.int64)
        self._mask = np.ascontiguousarray(attention_mask, np.int32)  # (N, S)
        self._cross = dict(cross)
        self._k = 0  # candidates per row the outputs are bound for
        self._binding = session.io_binding()
        self._outputs: dict[str, Value] = {}
        self._cache: dict[str, Value] = {}
        self._bind_all()

    # --- DecoderState ------------------------------------------------------------------------

    def step(self, tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        t = self.position
        if t >= self._capacity:
            self._grow(2 * self._capacity)
        g = self.beam_size
        if self.beams == 1 and g > 1:
            # Beam search's first step: each sentence's G rows start alike.
            self._ids[self.live] = tokens.reshape(-1, 1)
        else:
            self._ids[self.live] = tokens.reshape(-1, g)
        self._position[0] = self._past_length[0] = t
        k = min(k, self.vocab_size)
        if k != self._k:
            self._bind_outputs(k)
        self._push(INPUT_IDS, self._ids)
        self._push(POSITION, self._position)
        self.session.run_with_iobinding(self._binding, self._run_options(t, k))
        self.position = t + 1
        self._indirection[:, :, t] = np.arange(g)  # each beam wrote position T in its own row
        rows = self._rows()
        return self._host(TOP_LOG_PROBS)[rows], self._host(TOP_IDS)[rows]  # (R, k) copies

    def select(self, rows: np.ndarray, sentences: np.ndarray) -> None:
        kept = len(sentences)
        beams = len(rows) // kept
        # The beam of its sentence each kept row continues (rows are grouped by sentence).
        parents = rows.reshape(kept, beams) - (sentences * self.beams)[:, None]  # (n, beams)
        self.live = self.live[sentences]
        self.beams = beams
        self._follow(parents)
        if not self.padded and len(self.live) < self._slots:
            self._compact()

    def reorder(self, rows: np.ndarray) -> None:
        n = len(self.live)
        self._follow(rows.reshape(n, self.beams) - (np.arange(n) * self.beams)[:, None])

    def _run_options(self, t: int, k: int) -> ort.RunOptions | None:
        if self._graph_ids is None:
            return None
        shape = (self._slots, self.beam_size, self._mask.shape[1], self._capacity, k, t)
        graph = self._graph_ids.setdefault(shape, len(self._graph_ids))
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph))
        return options

    # --- What the parity checks read ----------------------------------------------------------

    def log_probs(self) -> np.ndarray:
        """The last step's log-probs of the live rows, (R, V)."""
        return np.asarray(self._host(LOG_PROBS)[self._rows()])

    def cache(self, name: str) -> np.ndarray:
        """The keys or values (`past_key(i)` / `past_value(i)`) of the live rows, as each one
        sees them through the indirection: (R, H, T, Dh), T the positions cached."""
        t, g = self.position, self.beam_size
        buffer = self._host_cache(name)  # (N * G, H, C, Dh)
        beams = self._indirection[self.live, : self.beams, :t]  # (n, beams, T)
        rows = self.live[:, None, None] * g + beams  # (n, beams, T): the row holding each position
        positions = np.arange(t)[None, None, :]
        gathered = buffer[rows, :, positions]  # (n, beams, T, H, Dh)
        rows_seen = len(self.live) * self.beams
        return np.asarray(gathered.reshape(rows_seen, t, *self._cache_shape).transpose(0, 2, 1, 3))

    # --- Internals ----------------------------------------------------------------------------

    def _rows(self) -> np.ndarray:
        """Buffer rows of the rows the search sees."""
        beams = np.arange(self.beams)
        return (self.live[:, None] * self.beam_size + beams[None, :]).reshape(-1)

    def _follow(self, parents: np.ndarray) -> None:
        """Beam b of each live sentence now continues beam parents[., b]: it reads every cached
        position where its parent did (`step` pointed the last one at each beam's own row)."""
        if self.beam_size == 1:
            return  # one beam reads its own row: the indirection stays zero
        t = self.position
        ours = self._indirection[self.live, :, :t]  # (n, G, T) copy
        ancestors = np.take_along_axis(ours, parents[:, :, None], axis=1)  # (n, G, T)
        self._indirection[self.live, :, :t] = ancestors
        self._push(CACHE_INDIRECTION, self._indirection)

    def _compact(self) -> None:
        """Move the live sentences to the front: slots 0 .. n - 1, and run on those alone
        (compact policy: host buffers)."""
        live, n, g, t = self.live, len(self.live), self.beam_size, self.position
        rows = (live[:, None] * g + np.arange(g)[None, :]).reshape(-1)
        for name in past_names(self._layers):
            old = self._host_cache(name)
            new = self.pool.host(name, (n * g, *self._cache_dims()), self._cache_dtype)
            new[:, :, :t] = old[rows, :, :t]  # a copy first: old and new share memory
        self._ids = self._ids[live]
        self._indirection = self._indirection[live]
        self._mask = self._mask[live]
        self._cross = {name: value[live] for name, value in self._cross.items()}
        self._slots = n
        self.live = np.arange(n)
        self._bind_all()

    def _grow(self, capacity: int) -> None:
        """More positions (compact policy only): the cached ones are copied over."""
        if self.padded:
            raise RuntimeError(f"the padded cache holds {self._capacity} positions, no more")
        t = self.position
        rows = self._slots * self.beam_size
        for name in past_names(self._layers):
            cached = self._host_cache(name)[:, :, :t].copy()
            heads, d_head = self._cache_shape
            grown = self.pool.host(name, (rows, heads, capacity, d_head), self._cache_dtype)
            grown[:, :, :t] = cached
        indirection = np.zeros((self._slots, self.beam_size, capacity), np.int32)
        indirection[:, :, :t] = self._indirection[:, :, :t]
        self._indirection = indirection
        self._capacity = capacity
        self._bind_all()

    def _cache_dims(self) -> tuple[int, int, int]:
        heads, d_head = self._cache_shape
        return heads, self._capacity, d_head

    def _host_cache(self, name: str) -> np.ndarray:
        return _on_host(self._cache[name])

    def _host(self, name: str) -> np.ndarray:
        return _on_host(self._outputs[name])

    def _bind_all(self) -> None:
        """(Re)bind every input, the cache as past and present, and the outputs."""
        binding, pool = self._binding, self.pool
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        rows = self._slots * self.beam_size
        shape = (rows, *self._cache_dims())
        for past, present in zip(
            past_names(self._layers), present_names(self._layers), strict=True
        ):
            if pool.on_device:
                buffer = pool.device(past, shape, self._cache_dtype)
            else:
                buffer = self._cache.get(past)
                if buffer is None or buffer.shape != shape:
                    buffer = pool.host(past, shape, self._cache_dtype)
            self._cache[past] = buffer
            value = self._value(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self._inputs: dict[str, Value] = {}
        for name, array in (
            (INPUT_IDS, self._ids),
            (POSITION, self._position),
            (ENCODER_ATTENTION_MASK, self._mask),
            (CACHE_INDIRECTION, self._indirection),
        ):
            self._inputs[name] = self._mirror(name, array)
        # Read by the kernels on the host, whatever the device: aliases of the host arrays.
        for name, array in ((PAST_SEQUENCE_LENGTH, self._past_length), (TOP_K, self._top_k)):
            self._inputs[name] = ort.OrtValue.ortvalue_from_numpy(array)
        for name, value in self._cross.items():
            self._inputs[name] = self._value(value)
        for name, value in self._inputs.items():
            binding.bind_ortvalue_input(name, value)
        self._k = 0

    def _bind_outputs(self, k: int) -> None:
        """Outputs into buffers of their own (log_probs too: never read by the search, but
        left unbound ONNX Runtime would allocate (R, V) floats at every step)."""
        self._top_k[0] = k
        rows = self._slots * self.beam_size
        binding = self._binding
        binding.clear_binding_outputs()
        for past, present in zip(
            past_names(self._layers), present_names(self._layers), strict=True
        ):
            binding.bind_ortvalue_output(present, self._value(self._cache[past]))
        for name, shape, dtype in (
            (LOG_PROBS, (rows, self.vocab_size), np.dtype(np.float32)),
            (TOP_LOG_PROBS, (rows, k), np.dtype(np.float32)),
            (TOP_IDS, (rows, k), np.dtype(np.int64)),
        ):
            buffer = (
                self.pool.device(name, shape, dtype)
                if self.pool.on_device
                else self.pool.host(name, shape, dtype)
            )
            self._outputs[name] = buffer
            binding.bind_ortvalue_output(name, self._value(buffer))
        self._k = k

    def _mirror(self, name: str, array: np.ndarray) -> Value:
        """The bound value of a host array the step reads: an alias of the array on the CPU,
        a pooled device copy on CUDA (refreshed by `_push`)."""
        if not self.pool.on_device:
            return ort.OrtValue.ortvalue_from_numpy(array)
        value = self.pool.device(name, array.shape, array.dtype)
        value.update_inplace(array)
        return value

    def _push(self, name: str, array: np.ndarray) -> None:
        if self.pool.on_device:
            self._inputs[name].update_inplace(array)

    @staticmethod
    def _value(buffer: Value) -> Value:
        if isinstance(buffer, np.ndarray):
            return ort.OrtValue.ortvalue_from_numpy(buffer)
        return buffer


def _on_host(value: Value) -> np.ndarray:
    """A host array as it is; a device OrtValue copied to the host."""
    return value if isinstance(value, np.ndarray) else np.asarray(value.numpy())


def cross_inputs(manifest: Manifest, values: Sequence[Value]) -> dict[str, Value]:
    """The encoder's cross keys/values by decoder input name (the encoder's outputs after
    memory, in `cross_names` order)."""
    return dict(zip(cross_names(manifest.model.decoder_layers), values, strict=True))
