"""The inference engine: a bundle's two ONNX Runtime graphs, its tokenizer, and the search.

`Engine.generate` sorts the sources by length, cuts them into batches of at most
`max_batch_size`, runs the encoder on each batch (every layer's cross keys/values; on the CPU
in groups of similar length, each padded to its own longest: encoder_chunks),
then lets `service.inference.search.search` drive the decoder-step graph through a
`StaticCacheState` (service/inference/step_state.py): a key/value cache of fixed size per batch that
each step writes in place, beams that follow their back-pointers through the cache indirection
instead of copying the cache, and inputs and outputs bound once per batch. The hypotheses come back
in the input order.

Two policies for the rows of a batch (step_state.py): on the CPU finished sentences leave the
batch (their rows are compacted away), so each step computes only live rows; on CUDA a batch
keeps its shapes until it ends (sentences padded to a power of two, sources to a multiple of
8, finished rows computed and ignored), so the buffers of each shape are allocated once and a
step's tensors stay on the GPU at fixed addresses; only the top-k candidates of each step come
to the host.

Memory: the cache and the step's outputs live in buffers pooled across batches (bounded by the
largest shapes seen, not by the number of batches); ONNX Runtime's memory patterns and CPU
arena stay off, as its intermediate shapes still change with the batch; on CUDA the arena grows
only by what is requested.

Thread-safety: `generate` (and `translate`) hold a lock for the whole call, so concurrent calls
are safe but run one at a time; the service calls it from one worker thread, and ONNX Runtime's
intra-op threads do the parallel work. `encode` and `decode` need no lock.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnxruntime as ort

from service.bundle.decoding import (
    NO_CONSTRAINTS,
    Constraints,
    Deadline,
    DecodingOptions,
    Hypothesis,
    Prefixes,
    nothing,
)
from service.bundle.manifest import (
    ATTENTION_MASK,
    INPUT_IDS,
    Bundle,
    BundleError,
    Manifest,
    cross_names,
    load_bundle,
)
from service.bundle.tokenizer import Span, TextTokenizer, load_tokenizer
from service.inference.cpus import physical_cores
from service.inference.running import Running
from service.inference.search import IntArray, search
from service.inference.shortlist import Shortlist, batch_inputs
from service.inference.step_state import (
    MAX_CUDA_GRAPHS,
    BufferPool,
    CudaGraphs,
    StaticCacheState,
    StepSessions,
    bucket,
    cross_inputs,
    initial_capacity,
    narrow_rows,
)

if TYPE_CHECKING:  # the engine alone does not load the service's settings (pydantic-settings)
    from service.settings import Device

log = logging.getLogger(__name__)

_ORT_ERROR = 3  # ONNX Runtime's log severity levels: 0 verbose .. 4 fatal
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# C0 and C1 control characters (category Cc: all below U+00A0) other than whitespace (tab, line
# breaks), dropped before tokenizing.
# A term's other spellings that the search counts as the term (Engine.spellings).
MAX_SPELLINGS = 8
# Texts whose ids, and token sequences whose texts, an engine remembers (Engine._ids,
# Engine._text): a few MB each.
TOKENIZED_MEMO = 8192
_CONTROL_CHARACTERS = dict.fromkeys(
    c for c in range(0xA0) if unicodedata.category(chr(c)) == "Cc" and not chr(c).isspace()
)


SOURCE_BUCKET = 8  # padded policy: source lengths are padded to a multiple of this
# Compact policy: the encoder runs over length-sorted groups of sources, each padded only to its
# own longest (encoder_chunks). A run's fixed cost, in source positions: one more run pays when
# it saves more padding than this (transformer-base, 2 cores: 0.4 ms a position, ~5 ms a run).
ENCODER_RUN_POSITIONS = 16


def source_bucket(length: int) -> int:
    return -(-length // SOURCE_BUCKET) * SOURCE_BUCKET


def encoder_chunks(
    lengths: Sequence[int], run_cost: int = ENCODER_RUN_POSITIONS
) -> list[tuple[int, int]]:
    """Cut ascending source lengths into consecutive groups [start, end), each to be encoded
    padded to its longest, minimising the positions computed (group size x its longest) plus
    `run_cost` per group: exact, by dynamic programming over the cut points (O(n^2), n is a
    batch). A batch of 32 Multi30k sentences (8 to 35 tokens) pads to 1,120 positions in one
    run and to 529 in four, which halves the encoder's time on the CPU."""
    if any(a > b for a, b in pairwise(lengths)):
        raise ValueError("encoder_chunks needs ascending lengths")
    n = len(lengths)
    cost = [0] * (n + 1)  # cost[j]: the least to encode the first j
    cut = [0] * (n + 1)  # cut[j]: where the last group of that best way starts
    for end in range(1, n + 1):
        cost[end], cut[end] = min(
            (cost[start] + (end - start) * lengths[end - 1] + run_cost, start)
            for start in range(end)
        )
    groups = []
    end = n
    while end:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


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
        device_id: int,
        max_batch_size: int,
        padded: bool | None = None,
        cuda_graphs: bool = False,
        max_cuda_graphs: int = MAX_CUDA_GRAPHS,
        narrow_step: ort.InferenceSession | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.manifest: Manifest = bundle.manifest
        checkpoint_name = Path(self.manifest.provenance.checkpoint).name
        # The checkpoint's name is shared by its fp32/fp16/int8 bundles.
        self.name: str = checkpoint_name or bundle.directory.resolve().name
        self.source_language: str = self.manifest.source_language
        self.source_languages: tuple[str, ...] = tuple(self.manifest.source_languages)
        self.target_languages: tuple[str, ...] = tuple(self.manifest.target_languages)

        def ids(tokens: Sequence[str]) -> list[int]:
            found = [tokenizer.token_id(token) for token in tokens]
            missing = [t for t, i in zip(tokens, found, strict=True) if i is None]
            if missing:
                raise BundleError(f"{bundle.directory}: the tokenizer has no token {missing[0]!r}")
            return [i for i in found if i is not None]

        # What the source starts with: a multilingual model's source-language token, then a
        # multi-target model's target token (">>fra<<"); and the tokens a multilingual model's
        # translation is forced to start with (its target-language token).
        self._source_prefixes = {
            language: ids([token]) for language, token in self.manifest.source_tokens.items()
        }
        self._target_prefixes = {
            language: ids([token]) for language, token in self.manifest.target_tokens.items()
        }
        self._decoder_prefixes = {
            language: ids(tokens) for language, tokens in self.manifest.decoder_prefixes.items()
        }
        self.max_input_tokens: int = self.manifest.model.max_positions
        # The ids each sentence may produce, with a vocabulary shortlist; None: every one.
        spec = self.manifest.shortlist
        language = None if spec is None else spec.target_language
        if (
            self._decoder_prefixes
            and language is not None
            and language not in self._decoder_prefixes
        ):
            raise BundleError(
                f"{bundle.directory}: its shortlist is for {language}, which the model does "
                "not translate into; export it again with --shortlist-target"
            )
        self.shortlist: Shortlist | None = Shortlist.load(
            bundle, self._decoder_prefixes.get(language or "", [])
        )
        # Hypotheses carry word alignments: the bundle's decoder step has the output.
        self.aligns: bool = self.manifest.alignment is not None
        # Its rows align the token each step reads (an aligner), not the one it picks.
        self._aligns_read = self.manifest.alignment is not None and self.manifest.alignment.aligner
        self.provider: str = decoder_step.get_providers()[0]
        self.device: Literal["cpu", "cuda"] = "cuda" if self.provider == CUDA_PROVIDER else "cpu"
        # What this model's translations are a function of, for the sentence cache's keys
        # (service/scheduling/cache.py): the manifest lists every file's sha256, so its text is
        # the bundle's content hash; the provider too (CUDA's kernels round differently).
        self.fingerprint: str = hashlib.sha256(
            f"{self.manifest.to_json()}\0{self.provider}".encode()
        ).hexdigest()
        self.dtype: str = self.manifest.dtype
        # What /status shows an operator: the card travels in the bundle (hash-verified).
        card = self.manifest.card
        self.card: str | None = None if card is None else bundle.path(card).read_text("utf-8")
        self.license: str | None = self.manifest.license
        self.max_batch_size = max_batch_size
        self._tokenizer = tokenizer
        # A text's ids, remembered for the texts seen last: traffic repeats its sentences (a
        # popular post, a help-centre page), and tokenizing one costs 13 us on an idle core,
        # more beside the engine, where a repeat costs 0.1. Thread-safe (the preparation thread
        # encodes too).
        self._ids = functools.lru_cache(maxsize=TOKENIZED_MEMO)(self._tokenized)
        # And a translation's text, for the token sequences decoded last: the sentence cache
        # answers a popular sentence's ids again and again (detokenizing them: 2 us on an
        # idle core, ~12 us of a cached request's time beside the engine).
        self._text = functools.lru_cache(maxsize=TOKENIZED_MEMO)(self._detokenized)
        self._encoder = encoder
        self.step_sessions = StepSessions(
            decoder_step, narrow_step, narrow_rows(self.manifest.model)
        )
        # Padded batches (step_state.py): CUDA's policy; on the CPU, for the tests' sake.
        self.padded: bool = self.device == "cuda" if padded is None else padded
        self._pool = BufferPool(self.device, device_id)
        # CUDA graphs replay on fixed shapes and addresses: padded batches only.
        self.cuda_graphs: bool = (
            cuda_graphs
            and self.device == "cuda"
            and self.padded
            and self.manifest.decoder_cache == "gather"
        )
        self._graphs = CudaGraphs(max_cuda_graphs) if self.cuda_graphs else None
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
        max_batch_size: int = 64,
        padded: bool | None = None,
        cuda_graphs: bool = False,
        max_cuda_graphs: int = MAX_CUDA_GRAPHS,
    ) -> Engine:
        """Verify the bundle (hashes, tensor names) and open its graphs.

        device "auto" takes CUDA when this ONNX Runtime has it and the bundle's decoder step can run
        there (its cache is "gather", service/bundle/manifest.py), else the CPU; "cuda" logs a
        warning when this ONNX Runtime has no CUDA, and refuses a bundle whose step runs on the CPU
        only, naming the export that makes one for CUDA. `intra_op_threads` None lets ONNX Runtime
        choose (one per physical core). `intra_op_spinning` lets the CPU decoder step's threads
        spin between kernels instead of sleeping, so that a kernel's parallel part starts at once
        (shipped model, fp32, 2 cores: 0.98-1.32x the tokens/s of sleeping ones, the step alone
        1.14-1.62x one thread's speed at 1-256 rows; int8 mixed, 0.82-1.26x); the encoder's never
        spin, as a second spinning pool would take the cores the step's need (spinning both made
        batch-1 decoding 24-31 % slower, benchmarks/RESULTS.md, issue 35's fifth part), nor do
        they on CUDA. Off by default: the threads of two engines decoding at once would take
        each other's cores (the service turns it on for a process of one model under no CPU
        quota, service/inference/models.py). A small model's encoder runs on one thread
        whatever `intra_op_threads` says (below). Where the threads
        sleep, are more than one and the model is small, the CPU's decoder step also opens on
        one thread, for steps of few rows, which waking threads would slow
        (step_state.StepSessions: on the shipped model, fewer than 61 rows).
        `padded` None pads batches on CUDA and compacts them on the
        CPU (step_state.py); True or False forces one policy. `cuda_graphs` captures each
        decoder-step shape as a CUDA graph and replays it (CUDA, padded batches and a gather cache
        only; ignored, with a warning, elsewhere), at most `max_cuda_graphs` shapes
        (step_state.CudaGraphs: each holds GPU memory).
        """
        bundle = load_bundle(bundle_dir)
        manifest = bundle.manifest
        cuda = device != "cpu" and CUDA_PROVIDER in ort.get_available_providers()
        if cuda and manifest.decoder_cache == "indirection":
            if device == "cuda":
                raise BundleError(
                    f"{bundle.directory}: its decoder step reads the cache through an "
                    "indirection, which ONNX Runtime's CUDA kernels do not; export it for CUDA "
                    "with `python -m export ... --cache gather` (or --dtype fp16), or run it "
                    "with device cpu"
                )
            log.info("%s: its decoder step runs on the CPU only; using the CPU", bundle.directory)
            device = "cpu"
            cuda = False
        # On CUDA the CPU's threads only wait for the GPU: spinning would burn them for nothing.
        intra_op_spinning = intra_op_spinning and not cuda
        tokenizer = load_tokenizer(bundle)
        # The encoder runs once a batch: its threads never spin, as a second spinning pool would
        # take the cores the step's threads and the search need; and a small model's (one whose
        # steps of few rows would run on one thread, `narrow_rows`) runs on one thread, which
        # waking a second costs more than it takes over (the shipped model, 2-core Xeon: 369
        # against 513 us for one sentence of 14 tokens, 5.26 against 5.63 ms for 32).
        small = narrow_rows(manifest.model) > 0
        options = _session_options(1 if small else intra_op_threads, spinning=False)
        step_options = _session_options(intra_op_threads, intra_op_spinning)
        if manifest.decoder_cache == "gather":
            # TensorScatter warns at every step that it copies the gathered cache into the
            # bound present (which is the point); errors still reach the log.
            step_options.log_severity_level = _ORT_ERROR
        sessions = [
            _open_graph(bundle, graph.file, graph_options, _providers(device, device_id, graphs))
            for graph, graph_options, graphs in (
                (manifest.encoder, options, False),
                (manifest.decoder_step, step_options, cuda_graphs),
            )
        ]
        for graph, session in zip((manifest.encoder, manifest.decoder_step), sessions, strict=True):
            bundle.check_graph_io(
                graph,
                [i.name for i in session.get_inputs()],
                [o.name for o in session.get_outputs()],
            )
        # Steps of few rows on one thread (step_state.StepSessions), where the others get more
        # (None: ONNX Runtime's default, one per physical core of the machine) and sleep.
        narrow = None
        on_cpu = sessions[1].get_providers()[0] == CPU_PROVIDER
        if (
            on_cpu
            and not intra_op_spinning
            and small
            and (intra_op_threads or physical_cores(range(os.cpu_count() or 1))) > 1
        ):
            narrow_options = _session_options(1, spinning=False)
            narrow_options.log_severity_level = step_options.log_severity_level
            narrow = _open_graph(bundle, manifest.decoder_step.file, narrow_options, [CPU_PROVIDER])
        engine = cls(
            bundle,
            tokenizer,
            *sessions,
            device_id=device_id,
            max_batch_size=max_batch_size,
            padded=padded,
            cuda_graphs=cuda_graphs,
            max_cuda_graphs=max_cuda_graphs,
            narrow_step=narrow,
        )
        _log_placement(engine, device, manifest.dtype)
        if cuda_graphs and not engine.cuda_graphs:
            log.warning(
                "%s: CUDA graphs need CUDA, padded batches and a gather cache; not used",
                engine.name,
            )
        return engine

    @property
    def cuda_graphs_captured(self) -> int:
        """Decoder-step shapes that have a CUDA graph (0 without CUDA graphs)."""
        return 0 if self._graphs is None else self._graphs.captured

    def stepper(self, slots: int) -> Running | None:
        """Step-level batching over this engine (service/inference/running.py) with `slots`
        sentences per running batch; None where it does not run: a bundle with the gather
        cache, or CUDA (there batches are padded for CUDA graphs and run whole)."""
        return Running(self, slots) if Running.runs_on(self) else None

    def encode(
        self, texts: Sequence[str], target: str | None = None, source: str | None = None
    ) -> list[list[int]]:
        """Token ids + </s> per text, after the source language's token for a multilingual
        model and the target's token for a multi-target model; [] for empty or whitespace-only
        text (nothing to run). `target` and `source` None: the only one."""
        target = self._language(target, self.target_languages, "translates into")
        source = self._language(source, self.source_languages, "translates from")
        prefix = [*self._source_prefixes.get(source, []), *self._target_prefixes.get(target, [])]
        return [[*prefix, *ids] if (ids := self._ids(text)) else [] for text in texts]

    def _tokenized(self, text: str) -> tuple[int, ...]:
        """A text's ids and </s>; () for empty or whitespace-only text."""
        # Control characters are not text: alone, they would be read as bytes the model then
        # "translates" into an invented sentence.
        (ids,) = self._tokenizer.encode([text.translate(_CONTROL_CHARACTERS)])
        return tuple(ids)

    def _language(self, language: str | None, languages: tuple[str, ...], verb: str) -> str:
        if language is None and len(languages) == 1:
            return languages[0]
        if language not in languages:
            raise ValueError(f"{self.name} {verb} {', '.join(languages)}, not {language}")
        return language

    def decoder_prefix(self, target: str | None = None) -> list[int]:
        """The ids a translation into `target` is forced to start with (a multilingual model's
        target-language token; none for other models): `generate`'s `prefixes`."""
        return list(
            self._decoder_prefixes.get(
                self._language(target, self.target_languages, "translates into"), []
            )
        )

    def decode(self, ids: Sequence[int]) -> str:
        return self._text(tuple(ids))

    def _detokenized(self, ids: tuple[int, ...]) -> str:
        return self._tokenizer.decode(ids)

    def source_spans(self, texts: Sequence[str]) -> list[list[Span]]:
        """The characters of each text each of its tokens stands for (`encode`'s ids without
        the target's token and </s>)."""
        cleaned = [text.translate(_CONTROL_CHARACTERS) for text in texts]
        spans = []
        for text, clean, own in zip(
            texts, cleaned, self._tokenizer.source_spans(cleaned), strict=True
        ):
            if len(clean) == len(text):
                spans.append(own)
                continue
            # Offsets in the cleaned text, mapped back to the text's own characters.
            kept = [i for i, c in enumerate(text) if ord(c) not in _CONTROL_CHARACTERS]
            kept.append(len(text))
            spans.append([(kept[a], kept[b - 1] + 1 if b > a else kept[a]) for a, b in own])
        return spans

    def target_spans(self, ids: Sequence[int]) -> list[Span]:
        """The characters of `decode(ids)` each id stands for."""
        return self._tokenizer.target_spans(ids)

    def target_ids(self, terms: Sequence[str]) -> list[list[int] | None]:
        """Each term's target ids as a word of a translation; None for one the vocabulary
        cannot spell: an unknown piece, a piece that is a byte of a character (byte-level BPE
        spells a character it has never seen so), or ids that decode to other text."""
        return [
            ids if ids and self._spells(term, ids) else None
            for term, ids in zip(terms, self._tokenizer.encode_target(terms), strict=True)
        ]

    @functools.cached_property
    def word_pieces(self) -> frozenset[int]:
        """The target ids that continue a word: decoded after a one-letter word, no space
        comes between them and it (made at the first use: a pass over the vocabulary, 30 ms
        for the shipped model's 8,000 ids)."""
        return frozenset(self._continuations)

    @functools.cached_property
    def _continuations(self) -> dict[int, str]:
        """Each word piece's text (`word_pieces`)."""
        anchor = self._tokenizer.encode_target(["a"])[0][-1:]
        start = len(self.decode(anchor))
        pieces = {}
        for i in range(self.manifest.model.output_vocab_size):
            text = self.decode([*anchor, i])
            if len(text) > start and text[start].isalnum():
                pieces[i] = text[start:]
        return pieces

    @functools.cached_property
    def _pieces_by_text(self) -> dict[str, list[int]]:
        by_text: dict[str, list[int]] = {}
        for i, text in self._continuations.items():
            by_text.setdefault(text, []).append(i)
        return by_text

    def spellings(self, ids: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """A term's other spellings (`target_ids`'s are the tokenizer's) that the model may
        write: one piece after a word's first split in two ("antikes" is "ant" + "ikes", the
        model writes "ant" + "ik" + "es") or two merged in one; at most `MAX_SPELLINGS`,
        fewest pieces first."""
        pieces, by_text = self._continuations, self._pieces_by_text
        found: dict[tuple[int, ...], None] = {}
        for j in range(1, len(ids)):
            if ids[j] not in pieces:
                continue
            head, text, tail = tuple(ids[:j]), pieces[ids[j]], tuple(ids[j + 1 :])
            if tail and tail[0] in pieces:
                for i in by_text.get(text + pieces[tail[0]], []):
                    found[(*head, i, *tail[1:])] = None
            for n in range(1, len(text)):
                for a in by_text.get(text[:n], []):
                    for b in by_text.get(text[n:], []):
                        found[(*head, a, b, *tail)] = None
        found.pop(tuple(ids), None)
        return tuple(sorted(found, key=len)[:MAX_SPELLINGS])

    def _spells(self, term: str, ids: list[int]) -> bool:
        unknown = {self.manifest.special_ids.unk, *self.manifest.model.suppressed_ids}
        return (
            not unknown & set(ids)
            and all("\ufffd" not in self.decode([i]) for i in ids)
            and self.decode(ids) == term
        )

    def generate(
        self,
        sources: Sequence[Sequence[int]],
        options: DecodingOptions,
        deadline: Deadline | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Constraints] | None = None,
    ) -> list[list[Hypothesis]]:
        """n-best lists in the input order, each of at most `options.limit(len(source))`
        tokens. An empty source gets one empty "eos" hypothesis without a model call; any
        source over `max_input_tokens` raises InputTooLongError, and a token id outside the
        vocabulary ValueError, before anything runs. `deadline(i)` is when source i must be
        done (time.monotonic()), read before every decoder step: a source past it leaves its
        batch there and gets one "deadline" hypothesis, the others go on undisturbed.
        `prefixes[i]`: the ids source i's translation is forced to start with
        (`decoder_prefix`), not in its hypotheses; sources with different ones share batches.
        `constraints[i]`: source i's terms, each in its translation exactly once (constrained
        beam search, service/inference/constraints.py); sources with and without share batches.

        Safe to call from several threads, but calls run one at a time (module docstring).
        """
        options = self.checked(sources, options)
        results = [[nothing()] for _ in sources]
        # Similar lengths share a batch, so little of it is padding.
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        with self._lock:
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                forced = Prefixes([() if prefixes is None else prefixes[i] for i in chunk])
                nbest = self._generate_batch(
                    [sources[i] for i in chunk],
                    options,
                    None if deadline is None else _within(chunk, deadline),
                    forced,
                    [NO_CONSTRAINTS if constraints is None else constraints[i] for i in chunk],
                )
                for row, (i, hyps) in enumerate(zip(chunk, nbest, strict=True)):
                    results[i] = self.hypotheses(hyps, len(sources[i]), forced, row)
        return results

    def checked(
        self, sources: Sequence[Sequence[int]], options: DecodingOptions
    ) -> DecodingOptions:
        """`options` within the model's positions (the decoder has max_positions: longer
        outputs cannot be produced), once every source is known to fit: InputTooLongError for
        one over `max_input_tokens`, ValueError for a token id outside the vocabulary."""
        vocab = self.manifest.model.vocab_size
        for source in sources:
            if len(source) > self.max_input_tokens:
                raise InputTooLongError(len(source), self.max_input_tokens)
            unknown = [t for t in source if not 0 <= t < vocab]
            if unknown:
                raise ValueError(
                    f"token id {unknown[0]} is outside the vocabulary (0..{vocab - 1})"
                )
        return options.within(self.max_input_tokens)

    def hypotheses(
        self, nbest: list[Hypothesis], source_length: int, prefixes: Prefixes, sentence: int
    ) -> list[Hypothesis]:
        """A search's n-best list as `generate` returns it: without the sentence's decoder
        prefix, alignments one row per token over the source's own positions."""
        return [
            _aligned(prefixes.strip(sentence, h), source_length, self._aligns_read) for h in nbest
        ]

    def encoded(self, sources: Sequence[Sequence[int]]) -> tuple[list[Any], IntArray]:
        """The encoder's cross keys/values of these sources on the host, each (N, H, S, Dh),
        S their longest (compact policy: encoded in length groups), and their (N, S) mask."""
        input_ids, attention_mask = self._inputs(sources, len(sources), max(map(len, sources)))
        names = cross_names(self.manifest.model.decoder_layers)
        return self._encode_chunked(names, input_ids, attention_mask), attention_mask

    def _inputs(
        self, sources: Sequence[Sequence[int]], slots: int, length: int
    ) -> tuple[IntArray, IntArray]:
        """The encoder's input_ids and attention_mask, (slots, length): the sources padded, and
        past them (the padded policy's extra slots) copies of the first, so no row is all
        padding."""
        input_ids = np.full((slots, length), self.manifest.special_ids.pad, np.int64)
        attention_mask = np.zeros_like(input_ids)
        for row in range(slots):
            source = sources[row if row < len(sources) else 0]
            input_ids[row, : len(source)] = source
            attention_mask[row, : len(source)] = 1
        return input_ids, attention_mask

    def _generate_batch(
        self,
        sources: Sequence[Sequence[int]],
        options: DecodingOptions,
        deadline: Deadline | None,
        prefixes: Prefixes,
        constraints: Sequence[Constraints],
    ) -> list[list[Hypothesis]]:
        manifest, pool, padded = self.manifest, self._pool, self.padded
        n = len(sources)
        # Padded: few shapes, each with its buffers (step_state.py); the extra sentences repeat
        # the first, so no row is all padding, and are never decoded.
        slots = bucket(n) if padded else n
        length = max(len(s) for s in sources)
        length = source_bucket(length) if padded else length
        input_ids, attention_mask = self._inputs(sources, slots, length)  # (N, S) each
        cross = self._encode(input_ids, attention_mask)
        limits = prefixes.limits(
            [options.limit(len(source)) for source in sources], self.max_input_tokens
        )
        limit = max(limits)
        shortlist = None
        if self.shortlist is not None:
            candidates = [
                self.shortlist.candidates(source, prefix, terms)
                for source, prefix, terms in zip(
                    sources, prefixes.prefixes, constraints, strict=True
                )
            ]
            candidates += candidates[:1] * (slots - n)  # the padded slots repeat the first
            shortlist = batch_inputs(candidates, padded)
        state = StaticCacheState(
            self.step_sessions,
            manifest,
            pool,
            cross,
            attention_mask,
            sentences=n,
            beam_size=options.beam_size,
            capacity=initial_capacity(limit, length, padded),
            limit=limit,
            padded=padded,
            graphs=self._graphs,
            shortlist=shortlist,
            aligned=options.alignments,
        )
        ids = manifest.special_ids
        return search(
            state, limits, options, bos_id=ids.bos, eos_id=ids.eos, deadline=deadline,
            prefixes=prefixes, constraints=constraints,
        )  # fmt: skip

    def _encode(self, input_ids: IntArray, attention_mask: IntArray) -> dict[str, Any]:
        """Every decoder layer's cross keys/values, (N, H, S, Dh) each: host arrays, or on a
        device pooled OrtValues, the same ones for the same shape."""
        names = cross_names(self.manifest.model.decoder_layers)
        if not self._pool.on_device and not self.padded:
            return cross_inputs(
                self.manifest, self._encode_chunked(names, input_ids, attention_mask)
            )
        feeds = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
        if not self._pool.on_device:
            return cross_inputs(self.manifest, self._encoder.run(names, feeds))
        binding = self._encoder.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        dims = self.manifest.model
        dtype = np.dtype(self.manifest.encoder.tensor(names[0]).dtype)
        shape = (input_ids.shape[0], dims.heads, input_ids.shape[1], dims.d_head)
        cross = {name: self._pool.buffer(name, shape, dtype) for name in names}
        for name, value in cross.items():
            binding.bind_ortvalue_output(name, value)
        self._encoder.run_with_iobinding(binding)
        return cross

    def _encode_chunked(
        self, names: list[str], input_ids: IntArray, attention_mask: IntArray
    ) -> list[Any]:
        """The compact policy's encoding (encoder_chunks): the sources in groups of
        similar length, each run padded to its own longest only, the results placed back into
        (N, H, S, Dh) host arrays, zero past each group's longest. The decoder masks every
        position past a source's end, so what is there is never read."""
        lengths = attention_mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        n, width = input_ids.shape
        cross: list[Any] = []
        for start, end in encoder_chunks(lengths[order].tolist()):
            rows = order[start:end]
            length = int(lengths[rows[-1]])
            feeds = {
                INPUT_IDS: input_ids[rows, :length],
                ATTENTION_MASK: attention_mask[rows, :length],
            }
            values = self._encoder.run(names, feeds)  # each (rows, H, length, Dh)
            if not cross:
                cross = [np.zeros((n, v.shape[1], width, v.shape[3]), v.dtype) for v in values]
            for whole, part in zip(cross, values, strict=True):
                whole[rows, :, :length] = part
        return cross


def _within(chunk: list[int], deadline: Deadline) -> Deadline:
    """The deadline of a batch's sentences, numbered within the batch (`chunk`: their
    indices among the call's sources)."""
    return lambda sentence: deadline(chunk[sentence])


def _aligned(hypothesis: Hypothesis, length: int, reads: bool) -> Hypothesis:
    """A hypothesis's alignment as one row per token, cut to its source's positions (the
    batch's are padded). The search keeps a row for every step the hypothesis ran; a token's
    row is the step that picked it, or with `reads` the step that read it, the next one (a
    hypothesis cut by the length limit never read its last token: that row is zeros, no link)."""
    if hypothesis.alignment is None:
        return hypothesis
    tokens = len(hypothesis.ids)
    rows = hypothesis.alignment[1 if reads else 0 :][:tokens, :length]
    if len(rows) < tokens:
        rows = np.concatenate([rows, np.zeros((tokens - len(rows), length), rows.dtype)])
    return replace(hypothesis, alignment=rows)


def _session_options(intra_op_threads: int | None, spinning: bool) -> ort.SessionOptions:
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


@functools.cache
def _load_cuda_libraries() -> None:
    """Load CUDA's and cuDNN's libraries before the CUDA provider needs them, once a process:
    from the nvidia-* wheels that onnxruntime-gpu's `cuda` and `cudnn` extras install (the
    image's way: no CUDA base image), else from the system's library path. The provider links
    them by name with no search path of its own, so without this it finds only a system CUDA."""
    ort.preload_dlls()


def _providers(device: Device, device_id: int, cuda_graphs: bool) -> list[Any]:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device != "cpu" and CUDA_PROVIDER in ort.get_available_providers():
        _load_cuda_libraries()
        cuda_options: dict[str, Any] = {"arena_extend_strategy": "kSameAsRequested"}
        if device_id:
            # ONNX Runtime >= 1.26 looks for a plugin EP device first and warns, at every
            # session, that none is registered for a device_id it is given: device 0 is its
            # default, so it is left out (seen on an H100 with 1.31.1).
            cuda_options["device_id"] = device_id
        if cuda_graphs:
            cuda_options["enable_cuda_graph"] = "1"
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
    elif engine.manifest.decoder_cache == "gather" and engine.provider == CPU_PROVIDER:
        log.warning(
            "%s: a gather cache on the CPU copies the cache at every step; export with "
            "--cache indirection for the CPU",
            engine.name,
        )
    if dtype == "int8" and engine.provider == CUDA_PROVIDER:
        log.warning("%s: int8 bundles are made for the CPU; use fp16 on CUDA", engine.name)
    log.info(
        "%s (%s, %s -> %s) on %s, %s batches",
        engine.name,
        dtype,
        engine.source_language,
        ", ".join(engine.target_languages),
        engine.provider,
        "padded" if engine.padded else "compacted",
    )
