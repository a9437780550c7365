"""The inference engine: a bundle's two ONNX Runtime graphs, its tokenizer, and the search.

`Engine.generate` sorts the sources by length, cuts them into batches of at most
`max_batch_size`, runs the encoder once per batch (memory and every layer's cross keys/values),
then lets `service.decoding.search` drive the decoder-step graph with a self-attention cache
that grows one position per step; beam search runs its first step on one row per sentence and
then expands the rows beam_size times, once. The cross keys/values and the source mask stay one
row per sentence throughout: the graph attends with a sentence's beams over its one copy. The
hypotheses come back in the input order.

Where the tensors live: with IO binding (`io_binding` "auto", the default, binds on CUDA only)
the cache and the cross keys/values are ONNX Runtime values on the provider's device, fed back
to the next step as they are, so on CUDA they stay on the GPU; only the step's top-k candidates
(B, k) come to the host for the search.
The decoder graph gathers its own cache by `cache_index`, so beams following their
back-pointers and finished rows leaving never move the cache through the host; only the cross
keys/values and the source mask change rows on the host, when a sentence finishes (ONNX
Runtime's Python API has no device-side gather without a graph for it: `_Placement.take`).
Without IO binding every tensor goes through numpy each step: on the CPU that is where they
live anyway, and `session.run` costs less Python per step than binding 20-odd values (15 % more
tokens/s at batch 1 greedy, 3-5 % at batch 32 or beam 4, so "auto" does not bind there).

Memory: every decoder step has new shapes (the cache grows, rows leave), so ONNX Runtime's
memory patterns, planned per shape and all kept, are switched off, and so is the CPU arena,
which would hold the largest batch's peak for the life of the process; on CUDA the arena grows
only by what is requested.

Thread-safety: `generate` (and `translate`) hold a lock for the whole call, so concurrent calls
are safe but run one at a time; the service calls it from one worker thread, and ONNX Runtime's
intra-op threads do the parallel work. `encode` and `decode` need no lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from service.bundle import (
    ATTENTION_MASK,
    CACHE_INDEX,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    Bundle,
    BundleError,
    Manifest,
    cross_names,
    load_bundle,
    past_key,
    past_names,
    present_names,
)
from service.decoding import DecodingOptions, FloatArray, Hypothesis, IntArray, search
from service.tokenizer import TextTokenizer, load_tokenizer

log = logging.getLogger(__name__)

Device = Literal["auto", "cpu", "cuda"]
IoBinding = Literal["auto", "on", "off"]  # auto: on with CUDA, off on the CPU
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# A graph input or output between runs: a numpy array on the host, or an ort.OrtValue that
# may live on the GPU (ONNX Runtime ships no type stubs, so this cannot be spelled closer).
Value = Any


class InputTooLongError(ValueError):
    """A source longer than the model's positions: rejected, never truncated."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(
            f"input has {length} tokens, more than the limit of {limit} tokens per segment "
            "(</s> included)"
        )
        self.length = length
        self.limit = limit


class Engine:
    """One bundle ready to translate; build it with `Engine.load`."""

    def __init__(
        self,
        bundle: Bundle,
        tokenizer: TextTokenizer,
        encoder: ort.InferenceSession,
        decoder_step: ort.InferenceSession,
        *,
        io_binding: IoBinding,
        device_id: int,
        max_batch_size: int,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.manifest: Manifest = bundle.manifest
        checkpoint_name = Path(self.manifest.provenance.checkpoint).name
        # The checkpoint's name is shared by its fp32/fp16/int8 bundles.
        self.name: str = checkpoint_name or bundle.directory.resolve().name
        self.source_language: str = self.manifest.source_language
        self.target_languages: tuple[str, ...] = tuple(self.manifest.target_languages)
        # A multi-target model reads the target's token (">>fra<<") first: the source's prefix.
        self._prefixes: dict[str, list[int]] = {}
        for language, token in self.manifest.target_tokens.items():
            token_id = tokenizer.token_id(token)
            if token_id is None:
                raise BundleError(f"{bundle.directory}: the tokenizer has no token {token!r}")
            self._prefixes[language] = [token_id]
        self.max_input_tokens: int = self.manifest.model.max_positions
        self.provider: str = decoder_step.get_providers()[0]
        self.max_batch_size = max_batch_size
        self._tokenizer = tokenizer
        self._encoder = encoder
        self._decoder_step = decoder_step
        device_type = "cuda" if self.provider == CUDA_PROVIDER else "cpu"
        self.io_binding: bool = io_binding == "on" or (
            io_binding == "auto" and device_type == "cuda"
        )
        self._placement = _Placement(self.io_binding, device_type, device_id)
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls,
        bundle_dir: str | Path,
        *,
        device: Device = "auto",
        device_id: int = 0,
        intra_op_threads: int | None = None,
        intra_op_spinning: bool = False,
        io_binding: IoBinding = "auto",
        max_batch_size: int = 64,
    ) -> Engine:
        """Verify the bundle (hashes, tensor names) and open its graphs.

        device "auto" takes CUDA when this ONNX Runtime has it, else the CPU; "cuda" logs a
        warning when it must fall back to the CPU. `intra_op_threads` None lets ONNX Runtime
        choose (one per physical core). `intra_op_spinning` lets those threads spin between
        kernels instead of sleeping: off by default, because between two decoder steps this
        process runs the search in Python, and spinning threads take the cores it needs (on
        2 cores, spinning made greedy decoding 30-45 % slower). `io_binding` "auto" binds
        inputs and outputs on CUDA (the cache stays on the GPU) and not on the CPU, where it only
        adds overhead; "on" and "off" force it.
        """
        if io_binding not in ("auto", "on", "off"):  # before any file is read
            raise ValueError(f"io_binding must be 'auto', 'on' or 'off', got {io_binding!r}")
        bundle = load_bundle(bundle_dir)
        manifest = bundle.manifest
        tokenizer = load_tokenizer(bundle)
        options = session_options(intra_op_threads, intra_op_spinning)
        providers = _providers(device, device_id)
        sessions = [
            _open_graph(bundle, graph.file, options, providers)
            for graph in (manifest.encoder, manifest.decoder_step)
        ]
        for graph, session in zip((manifest.encoder, manifest.decoder_step), sessions, strict=True):
            bundle.check_graph_io(
                graph,
                [i.name for i in session.get_inputs()],
                [o.name for o in session.get_outputs()],
            )
        engine = cls(
            bundle,
            tokenizer,
            *sessions,
            io_binding=io_binding,
            device_id=device_id,
            max_batch_size=max_batch_size,
        )
        _log_placement(engine, device, manifest.dtype)
        return engine

    def encode(self, texts: Sequence[str], target: str | None = None) -> list[list[int]]:
        """Token ids + </s> per text, after the target's token for a multi-target model; [] for
        empty or whitespace-only text (nothing to run). `target` None: the only target."""
        if target is None and len(self.target_languages) == 1:
            target = self.target_languages[0]
        if target not in self.target_languages:
            raise ValueError(
                f"{self.name} translates into {', '.join(self.target_languages)}, not {target}"
            )
        prefix = self._prefixes.get(target, [])
        return [[*prefix, *ids] if ids else [] for ids in self._tokenizer.encode(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids)

    def generate(
        self, sources: Sequence[Sequence[int]], options: DecodingOptions
    ) -> list[list[Hypothesis]]:
        """n-best lists in the input order. An empty source gets one empty "eos" hypothesis
        without a model call; any source over `max_input_tokens` raises InputTooLongError, and
        a token id outside the vocabulary ValueError, before anything runs.

        Safe to call from several threads, but calls run one at a time (module docstring).
        """
        vocab = self.manifest.model.vocab_size
        for source in sources:
            if len(source) > self.max_input_tokens:
                raise InputTooLongError(len(source), self.max_input_tokens)
            unknown = [t for t in source if not 0 <= t < vocab]
            if unknown:
                raise ValueError(
                    f"token id {unknown[0]} is outside the vocabulary (0..{vocab - 1})"
                )
        # The decoder has max_positions positions: longer outputs cannot be produced.
        max_length = min(options.max_decoding_length, self.max_input_tokens)
        options = replace(
            options,
            max_decoding_length=max_length,
            min_decoding_length=min(options.min_decoding_length, max_length),
        )
        results = [[Hypothesis([], 0.0, "eos")] for _ in sources]
        # Similar lengths share a batch, so little of it is padding.
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        with self._lock:
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                nbest = self._generate_batch([sources[i] for i in chunk], options)
                for i, hyps in zip(chunk, nbest, strict=True):
                    results[i] = hyps
        return results

    def translate(
        self, texts: Sequence[str], options: DecodingOptions, target: str | None = None
    ) -> list[list[tuple[str, Hypothesis]]]:
        """encode -> generate -> decode: (text, hypothesis) n-best lists in the input order."""
        nbest = self.generate(self.encode(texts, target), options)
        return [[(self.decode(h.ids), h) for h in hyps] for hyps in nbest]

    def _generate_batch(
        self, sources: Sequence[Sequence[int]], options: DecodingOptions
    ) -> list[list[Hypothesis]]:
        manifest, placement = self.manifest, self._placement
        lengths = [len(s) for s in sources]
        input_ids = np.full((len(sources), max(lengths)), manifest.special_ids.pad, np.int64)
        attention_mask = np.zeros_like(input_ids)  # (B, S)
        for row, source in enumerate(sources):
            input_ids[row, : len(source)] = source
            attention_mask[row, : len(source)] = 1
        names = cross_names(manifest.model.decoder_layers)
        feeds = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
        cross = placement.run(self._encoder, feeds, names, to_host=())
        state = _OrtDecoderState(
            self._decoder_step,
            manifest,
            placement,
            dict(zip(names, cross, strict=True)),
            attention_mask,
        )
        ids = manifest.special_ids
        return search(state, len(sources), options, bos_id=ids.bos, eos_id=ids.eos)


class _Placement:
    """Where graph inputs and outputs live between runs.

    With IO binding, outputs stay ONNX Runtime values on the device and are bound as the next
    run's inputs; without it, `session.run` takes and returns numpy arrays.
    """

    def __init__(self, io_binding: bool, device_type: str, device_id: int) -> None:
        self.io_binding, self.device_type, self.device_id = io_binding, device_type, device_id

    def put(self, array: np.ndarray) -> Value:
        if not self.io_binding:
            return array
        return ort.OrtValue.ortvalue_from_numpy(array, self.device_type, self.device_id)

    def take(self, value: Value, rows: IntArray) -> Value:
        """value[rows] along the batch axis, through the host (a copy in and out on a GPU)."""
        array = value if isinstance(value, np.ndarray) else value.numpy()
        return self.put(array[rows])

    def run(
        self,
        session: ort.InferenceSession,
        feeds: Mapping[str, Value],
        outputs: Sequence[str],
        *,
        to_host: Collection[str],
    ) -> list[Value]:
        """Run `session` for `outputs`; those in `to_host` come back as numpy arrays."""
        if not self.io_binding:
            return list(session.run(list(outputs), dict(feeds)))
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for name in outputs:
            if name in to_host:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, self.device_type, self.device_id)
        session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return [v.numpy() if n in to_host else v for n, v in zip(outputs, values, strict=True)]


class _OrtDecoderState:
    """`service.decoding.DecoderState` over decoder_step.onnx: the self-attention cache grows
    one position per step and is gathered inside the graph by `cache_index`, so dropping rows
    and following beam back-pointers only compose an index on the host; cross keys/values and
    the source mask, one row per sentence, change rows on the host when sentences finish."""

    def __init__(
        self,
        session: ort.InferenceSession,
        manifest: Manifest,
        placement: _Placement,
        cross: dict[str, Value],
        attention_mask: IntArray,
    ) -> None:
        self.session, self.placement, self.cross = session, placement, cross
        self.vocab_size = manifest.model.output_vocab_size
        self.past_names = past_names(manifest.model.decoder_layers)
        # present i is fed back as past i: present_names lists them in past_names order.
        self.output_names = [TOP_LOG_PROBS, TOP_IDS, *present_names(manifest.model.decoder_layers)]
        self.mask = placement.put(attention_mask)  # (N, S), like the cross keys/values
        rows = self.sentences = attention_mask.shape[0]  # one row per sentence at the start
        dims = manifest.model
        dtype = np.dtype(manifest.decoder_step.tensor(past_key(0)).dtype)  # float16 in fp16
        empty = np.zeros((rows, dims.heads, 0, dims.d_head), dtype)
        self.past = {name: placement.put(empty) for name in self.past_names}  # (P, H, T, Dh)
        self.cache_index = np.arange(rows, dtype=np.int64)  # (R,): row r continues past row

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        feeds = {
            INPUT_IDS: tokens.reshape(-1, 1),  # (R, 1)
            ENCODER_ATTENTION_MASK: self.mask,
            CACHE_INDEX: self.cache_index,
            TOP_K: np.array([min(k, self.vocab_size)], dtype=np.int64),
            **self.past,
            **self.cross,
        }
        top_log_probs, top_ids, *present = self.placement.run(
            self.session, feeds, self.output_names, to_host={TOP_LOG_PROBS, TOP_IDS}
        )
        self.past = dict(zip(self.past_names, present, strict=True))
        self.cache_index = np.arange(len(tokens), dtype=np.int64)
        return top_log_probs, top_ids  # (R, k) each

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        self.cache_index = self.cache_index[rows]
        if len(sentences) == self.sentences:  # beam search's expansion: all sentences stay
            return
        take = self.placement.take
        self.mask = take(self.mask, sentences)
        self.cross = {name: take(v, sentences) for name, v in self.cross.items()}
        self.sentences = len(sentences)

    def reorder(self, rows: IntArray) -> None:
        self.cache_index = self.cache_index[rows]


def session_options(intra_op_threads: int | None, spinning: bool) -> ort.SessionOptions:
    """The engine's ONNX Runtime session options (see the module docstring and `Engine.load`)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    # Shapes change every step: a memory pattern per shape would be planned, kept, never reused.
    options.enable_mem_pattern = False
    # The arena would keep the largest batch's peak (rounded up to a power of two) forever.
    options.enable_cpu_mem_arena = False
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1  # sequential graphs: the threads go to intra-op work
    if intra_op_threads is not None:
        if intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be at least 1, got {intra_op_threads}")
        options.intra_op_num_threads = intra_op_threads
    return options


def _providers(device: Device, device_id: int) -> list[Any]:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device != "cpu" and CUDA_PROVIDER in ort.get_available_providers():
        cuda_options = {"device_id": device_id, "arena_extend_strategy": "kSameAsRequested"}
        return [(CUDA_PROVIDER, cuda_options), CPU_PROVIDER]
    return [CPU_PROVIDER]


def _open_graph(
    bundle: Bundle,
    file: str,
    options: ort.SessionOptions,
    providers: list[Any],
) -> ort.InferenceSession:
    path = bundle.path(file)
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # ORT raises its own untyped errors for unreadable graphs
        raise BundleError(f"{path}: ONNX Runtime cannot load it: {e}") from e


def _log_placement(engine: Engine, device: Device, dtype: str) -> None:
    """Say where the model runs, loudly when it is not where it was asked to run."""
    if device == "cuda" and engine.provider != CUDA_PROVIDER:
        log.warning(
            "%s: device 'cuda' was asked for, but ONNX Runtime cannot use CUDA here "
            "(available providers: %s); running on the CPU",
            engine.name,
            ", ".join(ort.get_available_providers()),
        )
    if dtype == "fp16" and engine.provider == CPU_PROVIDER:
        log.warning("%s: an fp16 bundle on the CPU is slow; use the fp32 or int8 one", engine.name)
    if dtype == "int8" and engine.provider == CUDA_PROVIDER:
        log.warning("%s: int8 bundles are made for the CPU; use fp16 on CUDA", engine.name)
    log.info(
        "%s (%s, %s -> %s) on %s, IO binding %s",
        engine.name,
        dtype,
        engine.source_language,
        ", ".join(engine.target_languages),
        engine.provider,
        "on" if engine.io_binding else "off",
    )
