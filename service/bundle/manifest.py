"""The bundle contract: manifest schema, file names and every graph tensor name.

The exported bundle is the only thing the PyTorch side hands to the serving side, so its consumer
owns the contract: `export/` imports this module to write a bundle, `service/` imports it to read
one. It must stay importable with the serving image's packages only (no torch, no onnx, no
`model/`): checking that the ONNX graphs really carry the listed tensors is done by the caller,
which already holds ONNX Runtime sessions, through `Bundle.check_graph_io`.

Layout of a bundle directory (format version 7):

    manifest.json      this schema, written last by the exporter
    MODEL_CARD.md      the checkpoint's model card, when it has one (the manifest's `card`)
    tokenizer.json     Hugging Face tokenizers file (this project's models), or, for Marian
                       (OPUS-MT) models, source.spm, target.spm and vocab.json (target_vocab.json
                       with separate vocabularies): see service/bundle/tokenizer.py
    encoder.onnx       input_ids, attention_mask (N, S) int64 -> memory (N, S, d_model),
                       cross_key.{i} / cross_value.{i} (N, H, S, Dh) for every decoder layer i
    decoder_step.onnx  one token for each of R = N * G rows: G per sentence (its beams), and a
                       static key/value cache of C positions per row, bound as both the past
                       input and the present output (ONNX Runtime IO binding), so each step
                       writes its key/value in place:
                       input_ids (N, G) int64: row (n, g) is beam g of sentence n,
                       position (R,) int64: each row's position, the number of tokens it has
                       read before this one (its positional encoding),
                       encoder_attention_mask (N, S) int32, 1 on tokens and 0 on padding,
                       top_k (1,) int64,
                       alignment_wanted (1,) bool, on the "indirection" cache: whether the
                       step computes `alignment` (false: the aligner's nodes do not run and
                       the output is empty, (0, 0)),
                       past_key.{i} / past_value.{i} (R, H, C, Dh),
                       cross_key.{i} / cross_value.{i} (N, H, S, Dh), one row per sentence,
                       shared by its G rows (never copied per beam),
                       and, by the manifest's `decoder_cache`:
                       "indirection" (ONNX Runtime's CPU kernels): past_sequence_length (1,)
                         int32, the cache position T every row writes at this step (read on
                         the host by the attention kernel), cache_indirection (N, G, C) int32:
                         entry [n, g, t] names the beam of sentence n whose row holds position
                         t of beam g (t < T), and self_attention_mask (R, T + 1) int32: 1 on
                         the cache positions a row attends to (its own: a row that joined a
                         running batch at cache position s reads s .. T; position = T - s).
                         Beams that follow their back-pointers rewrite only the indirection;
                         the cache never moves. Positions > T are never read.
                       "gather" (portable: the CUDA choice): beam_rows (R,) int64, the row of
                         the past each row continues; the graph gathers the cache by it,
                         writes position T (TensorScatter) and attends over every position
                         with positions > T masked. All of a step's inputs but top_k are read
                         on the device, so a step can be captured as one CUDA graph per
                         shape. Positions >= T must hold finite values (the engine zeroes the
                         buffers it allocates).
                       and, in a bundle with a vocabulary shortlist (the manifest's `shortlist`):
                       shortlist (V',) int64: the ids the batch's sentences may produce,
                         ascending, and shortlist_mask (N, V') float32: 0 where sentence n may
                         produce that id, -inf where not. The output projection covers these
                         V' ids only, each row's log-softmax its sentence's own candidates, so
                         a sentence's scores do not depend on the others in its batch.
                       -> log_probs (R, V) float32: the log-softmax of every token (of the
                          shortlist, (R, V'), in a bundle with one); the
                          manifest's suppressed_ids are -inf only in a model that renormalizes
                          without them (see `ModelDims.suppressed_ids`),
                          top_log_probs (R, k) float32 / top_ids (R, k) int64: the top_k most
                          probable next tokens, best first, ties by lower id, a suppressed one
                          only past all the others (at -inf),
                          present_key.{i} / present_value.{i} (R, H, C, Dh): the past with each
                          row's new key/value at position T.
    encoder.onnx.data, decoder_step.onnx.data
                       a graph's weights (those of 1 KiB and more) as ONNX external data, all
                       of the graph's in one file named after it (`external_data_file`), which
                       ONNX Runtime maps into memory from beside the graph: pages no step reads
                       stay on disk. Listed in `files` like every other file. A graph that
                       holds its weights itself (an export before 2026-11-27) loads the same.

Older formats are refused: re-export. Version 1 had no cache_index, top_k, top_log_probs and
top_ids; version 2 took the cross keys/values and the source mask per row (B), not per sentence;
version 3 grew the cache by one position per step and gathered it by a cache_index; version 4
set log_probs to -inf at every suppressed id (a pass over the (R, V) log-probs at every step)
and had no suppressed_ids in the manifest; version 5 had no self_attention_mask; version 6
computed the alignment at every step (no alignment_wanted).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

FORMAT_VERSION = 7
SUPPORTED_FORMAT_VERSIONS = frozenset({FORMAT_VERSION})

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
ENCODER_FILE = "encoder.onnx"
DECODER_STEP_FILE = "decoder_step.onnx"
CARD_FILE = "MODEL_CARD.md"  # a checkpoint's model card, copied into its bundles
SHORTLIST_FILE = "shortlist.npz"  # a bundle's vocabulary shortlist (ShortlistSpec)


def external_data_file(graph_file: str) -> str:
    """The file of a graph's weights when they are written as ONNX external data."""
    return graph_file + ".data"


Dtype = Literal["fp32", "fp16", "int8"]
# How the decoder step's static cache follows beams (module docstring).
DecoderCache = Literal["indirection", "gather"]

# --- Tensor names: the one place they are spelled --------------------------------------------

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"  # encoder input, (N, S) int64, 1 on tokens and 0 on padding
ENCODER_ATTENTION_MASK = "encoder_attention_mask"  # the same mask as int32, for every step
MEMORY = "memory"
LOG_PROBS = "log_probs"
POSITION = "position"  # decoder input, (R,) int64: the step's position
PAST_SEQUENCE_LENGTH = "past_sequence_length"  # decoder input, (1,) int32: the same position
CACHE_INDIRECTION = "cache_indirection"  # decoder input, (N, G, C) int32: see the docstring
SELF_ATTENTION_MASK = "self_attention_mask"  # decoder input, (R, T + 1) int32: the same
BEAM_ROWS = "beam_rows"  # decoder input, (R,) int64: the past row each row continues
TOP_K = "top_k"  # decoder input, (1,) int64: how many candidates per row
# decoder input, (1,) bool, on the "indirection" cache: whether the step computes `alignment`
ALIGNMENT_WANTED = "alignment_wanted"
SHORTLIST = "shortlist"  # decoder input, (V',) int64: the ids a batch may produce
SHORTLIST_MASK = "shortlist_mask"  # decoder input, (N, V') float32: each sentence's of them
TOP_LOG_PROBS = "top_log_probs"
TOP_IDS = "top_ids"
# decoder output, (R, S) float32: where each row's query looked in its sentence's source (the
# manifest's `alignment` layer and head); bundles exported before it have no such output.
ALIGNMENT = "alignment"

# Dynamic axes, named the same in both graphs.
SENTENCE_AXIS = "sentences"  # N: the encoder's batch, and the decoder's cross keys/values and mask
BEAM_AXIS = "beams"  # G: the decoder's rows per sentence
ROW_AXIS = "rows"  # R = N * G: the decoder's rows, sentence-major
SOURCE_AXIS = "source_length"
CAPACITY_AXIS = "capacity"  # C: positions of the static cache
TOP_K_AXIS = "top_k"
ATTENDED_AXIS = "attended"  # T + 1: the cache positions up to this step's
SHORTLIST_AXIS = "shortlist"  # V': the ids a batch's shortlist holds


def cross_key(layer: int) -> str:
    return f"cross_key.{layer}"


def cross_value(layer: int) -> str:
    return f"cross_value.{layer}"


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"


def cross_names(n_layers: int) -> list[str]:
    """cross_key.0, cross_value.0, cross_key.1, ...: encoder outputs and decoder inputs."""
    return [name for i in range(n_layers) for name in (cross_key(i), cross_value(i))]


def past_names(n_layers: int) -> list[str]:
    return [name for i in range(n_layers) for name in (past_key(i), past_value(i))]


def present_names(n_layers: int) -> list[str]:
    """Decoder outputs in the order of `past_names`: present i becomes past i next step."""
    return [name for i in range(n_layers) for name in (present_key(i), present_value(i))]


def encoder_io(n_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of encoder.onnx, in graph order."""
    return [INPUT_IDS, ATTENTION_MASK], [MEMORY, *cross_names(n_layers)]


def decoder_step_io(
    n_layers: int, cache: DecoderCache, *, alignment: bool = False, shortlist: bool = False
) -> tuple[list[str], list[str]]:
    """(input names, output names) of decoder_step.onnx with this cache, in graph order, with
    the alignment output (and on the indirection cache its alignment_wanted input) or without
    it, with the shortlist's inputs or without them."""
    follow = (
        [PAST_SEQUENCE_LENGTH, CACHE_INDIRECTION, SELF_ATTENTION_MASK]
        if cache == "indirection"
        else [BEAM_ROWS]
    )
    inputs = [
        INPUT_IDS,
        POSITION,
        *follow,
        ENCODER_ATTENTION_MASK,
        TOP_K,
        *([SHORTLIST, SHORTLIST_MASK] if shortlist else []),
        *([ALIGNMENT_WANTED] if alignment and cache == "indirection" else []),
        *past_names(n_layers),
        *cross_names(n_layers),
    ]
    aligned = [ALIGNMENT] if alignment else []
    return inputs, [LOG_PROBS, TOP_LOG_PROBS, TOP_IDS, *present_names(n_layers), *aligned]


# --- Manifest schema ---------------------------------------------------------------------------


class BundleError(Exception):
    """A bundle that cannot be served; the message names the offending file."""


class _Frozen(BaseModel):
    # Unknown fields are errors: a manifest this reader does not fully understand must carry a
    # format version it does not support, not be half-read.
    model_config = ConfigDict(frozen=True, extra="forbid")


class TensorSpec(_Frozen):
    name: str
    dtype: str  # numpy name: "int64", "float32", "float16"
    shape: list[int | str]  # a str is a dynamic axis


class GraphSpec(_Frozen):
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def tensor(self, name: str) -> TensorSpec:
        for spec in (*self.inputs, *self.outputs):
            if spec.name == name:
                return spec
        raise KeyError(f"{self.file} has no tensor {name!r}")


class ModelDims(_Frozen):
    encoder_layers: int
    decoder_layers: int
    heads: int
    d_model: int
    d_head: int
    vocab_size: int  # of the source (the joint vocabulary when target_vocab_size is None)
    max_positions: int  # source length and decoding steps are each limited to this
    target_vocab_size: int | None = None  # a separate target vocabulary (some Marian models)
    # Target ids the model never generates (Marian: its pad): never among a step's top_k; in
    # log_probs they keep their log-softmax unless the model renormalizes without them.
    suppressed_ids: tuple[int, ...] = ()

    @property
    def output_vocab_size(self) -> int:
        """Tokens the decoder step scores (the width of log_probs)."""
        return self.vocab_size if self.target_vocab_size is None else self.target_vocab_size


class SpecialIds(_Frozen):
    pad: int
    bos: int
    eos: int
    unk: int


class SentencePieceFiles(_Frozen):
    """Marian's tokenization, as transformers' MarianTokenizer does it: the source text through
    the source SentencePiece model, the output through the target one, pieces to ids and back
    through the vocabularies (vocab.json, not the SentencePiece ids). File names in the bundle."""

    source_model: str
    target_model: str
    source_vocab: str
    target_vocab: str  # the same file as source_vocab unless the vocabularies are separate
    special_tokens: list[str]  # what decoding leaves out (MarianTokenizer's special tokens)
    clean_up_spaces: bool = False  # transformers' clean_up_tokenization_spaces ("a ." -> "a.")

    @property
    def files(self) -> list[str]:
        return list(
            dict.fromkeys(
                [self.source_model, self.target_model, self.source_vocab, self.target_vocab]
            )
        )


class TokenizersFile(_Frozen):
    """A `tokenizers` file with transformers' decoding options (an imported NLLB model's); a
    bare file name in the manifest is this project's own BPE, without them."""

    file: str
    clean_up_spaces: bool = False  # transformers' clean_up_tokenization_spaces ("a ." -> "a.")

    @property
    def files(self) -> list[str]:
        return [self.file]


Tokenization = str | TokenizersFile | SentencePieceFiles


def tokenizer_files(tokenizer: Tokenization) -> list[str]:
    """The files of a manifest's `tokenizer` entry."""
    return [tokenizer] if isinstance(tokenizer, str) else tokenizer.files


class FileEntry(_Frozen):
    sha256: str
    size: int  # bytes


class Provenance(_Frozen):
    checkpoint: str
    checkpoint_sha256: str  # of model.safetensors
    git_commit: str | None
    bleu: float | None  # as recorded in the checkpoint's config.json, if it was
    exporter: str


class AlignmentSpec(_Frozen):
    """Which cross-attention the decoder step's `alignment` output is: a decoder layer, and
    one head of it (trained by guided alignment) or None for the mean of its heads; or, with
    `aligner`, that layer's dedicated alignment query (model/transformer.py ModelConfig.aligner),
    whose row at each step aligns the token the step reads, not the one it picks."""

    layer: int
    head: int | None = None
    aligner: bool = False


class ShortlistSpec(_Frozen):
    """A vocabulary shortlist (export/shortlist.py; service/inference/shortlist.py): the
    decoder step scores only the ids a sentence may produce, its `frequent` most frequent
    target ids and, for each of its source ids, the `per_token` target ids that most often
    translate it, as counted on a parallel corpus. `file` (in the bundle, listed in `files`)
    holds them: "frequent" (F,) int64, and "offsets" (V_source + 1,) / "targets" int64, the
    target ids of source id s being targets[offsets[s]:offsets[s + 1]]."""

    file: str
    frequent: int
    per_token: int
    corpus: str  # what the counts came from, for the model card's reader
    # The language of the corpus's target side: a multilingual bundle's sentences into another
    # language are scored over every id.
    target_language: str


class Manifest(_Frozen):
    format_version: int
    model: ModelDims
    special_ids: SpecialIds
    source_language: str
    target_language: str
    dtype: Dtype
    decoder_cache: DecoderCache
    opset: int  # the encoder's; the decoder step's is its graph's own (the gather cache needs 24)
    # This project's tokenizers file, an imported one with its options, or SentencePiece files.
    tokenizer: Tokenization
    encoder: GraphSpec
    decoder_step: GraphSpec
    files: dict[str, FileEntry]
    provenance: Provenance
    # Multi-target models (Marian's ">>fra<<" tokens): target language -> the token the source
    # starts with to ask for it; these languages are served instead of target_language.
    target_tokens: dict[str, str] = {}
    # Multilingual models (M2M100, NLLB): source language -> the token the source starts with,
    # and target language -> the tokens the decoder is forced to start with (Prefixes in
    # service/bundle/decoding.py); these languages are served instead of source_language and
    # target_language, every source to every other language.
    source_tokens: dict[str, str] = {}
    decoder_prefixes: dict[str, list[str]] = {}
    # The decoder step's alignment output (markup and return_alignments need it); None: a
    # bundle exported before it, which serves text only.
    alignment: AlignmentSpec | None = None
    # The model card's file in the bundle (listed in `files`), and the weights' license as the
    # checkpoint records it: what the service's /status shows an operator, in an image that
    # carries bundles but no checkpoints. None: the checkpoint has none (or the bundle was
    # exported before these fields).
    card: str | None = None
    license: str | None = None
    # The decoder step's vocabulary shortlist (ShortlistSpec); None: it scores every id.
    shortlist: ShortlistSpec | None = None

    @property
    def source_languages(self) -> list[str]:
        """The source languages a request may name."""
        return list(self.source_tokens) or [self.source_language]

    @property
    def target_languages(self) -> list[str]:
        """The target languages a request may ask for."""
        return list(self.target_tokens) or list(self.decoder_prefixes) or [self.target_language]

    @property
    def tokenizer_files(self) -> list[str]:
        return tokenizer_files(self.tokenizer)

    @field_validator("files")
    @classmethod
    def _plain_file_names(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        # A bundle may come from elsewhere: never let it point outside its own directory.
        for name in files:
            if not name or Path(name).name != name or name in (".", ".."):
                raise ValueError(f"file name {name!r} is not a plain name inside the bundle")
        return files

    def to_json(self) -> str:
        """Stable text (fixed key order, no timestamps) so equal exports give equal manifests.
        Fields left at their defaults are left out: a bundle that uses none of the later
        additions (separate vocabularies, target tokens) reads as it did before them."""
        return json.dumps(self.model_dump(mode="json", exclude_defaults=True), indent=2) + "\n"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(sha256=sha256_file(path), size=path.stat().st_size)


def replace_directory(fresh: Path, target: Path) -> None:
    """Put the complete directory `fresh` where `target` is (or is not yet), so that `target`
    is never half-written: the old one is moved aside first, then removed. Both must be on one
    file system (make `fresh` beside `target`)."""
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(fresh, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(fresh, target)


# --- Loading and verification ------------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    """A verified bundle: every listed file is present with its recorded hash."""

    directory: Path
    manifest: Manifest

    def path(self, file: str) -> Path:
        return self.directory / file

    def check_graph_io(
        self, graph: GraphSpec, inputs: Sequence[str], outputs: Sequence[str]
    ) -> None:
        """Compare the names a loaded graph really has (e.g. an ONNX Runtime session's) with
        the manifest's, so a mismatch fails at load time and not at the first request."""
        for kind, listed, actual in (
            ("inputs", graph.input_names, inputs),
            ("outputs", graph.output_names, outputs),
        ):
            missing = [n for n in listed if n not in actual]
            unexpected = [n for n in actual if n not in listed]
            if missing or unexpected:
                raise BundleError(
                    f"{self.path(graph.file)}: graph {kind} do not match {MANIFEST_FILE}: "
                    f"missing {missing}, not in the manifest {unexpected}"
                )


def load_bundle(directory: str | Path) -> Bundle:
    """Read and verify a bundle: manifest parseable and of a supported format version, tensor
    names as this module spells them, every listed file present with its size and sha256."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_FILE
    try:
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{manifest_path}: missing (not a bundle directory?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{manifest_path}: not readable JSON: {e}") from e
    # The version first: a newer manifest may not fit this schema at all.
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if not isinstance(version, int) or version not in SUPPORTED_FORMAT_VERSIONS:
        raise BundleError(
            f"{manifest_path}: format version {version!r} is not supported "
            f"(supported: {sorted(SUPPORTED_FORMAT_VERSIONS)}); re-export the checkpoint "
            "with `python -m export`"
        )
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise BundleError(f"{manifest_path}: invalid manifest: {e}") from e
    _check_contract(manifest, manifest_path)
    for name, entry in manifest.files.items():
        _verify_file(directory / name, entry)
    for graph in (manifest.encoder.file, manifest.decoder_step.file):
        # A leftover, or a graph's weights ONNX Runtime would read unverified (the graph names
        # its data file itself, which this module does not parse): refused either way.
        data = external_data_file(graph)
        if data not in manifest.files and (directory / data).exists():
            raise BundleError(f"{directory / data}: not listed in {MANIFEST_FILE}; re-export")
    return Bundle(directory, manifest)


def _check_contract(manifest: Manifest, manifest_path: Path) -> None:
    n = manifest.model.decoder_layers
    for graph, (inputs, outputs) in (
        (manifest.encoder, encoder_io(n)),
        (
            manifest.decoder_step,
            decoder_step_io(
                n,
                manifest.decoder_cache,
                alignment=manifest.alignment is not None,
                shortlist=manifest.shortlist is not None,
            ),
        ),
    ):
        if graph.input_names != inputs or graph.output_names != outputs:
            raise BundleError(
                f"{manifest_path}: tensor names of {graph.file} differ from the contract: "
                f"listed inputs {graph.input_names}, outputs {graph.output_names}; "
                f"expected inputs {inputs}, outputs {outputs}"
            )
    card = [] if manifest.card is None else [manifest.card]
    shortlist = [] if manifest.shortlist is None else [manifest.shortlist.file]
    for file in (
        manifest.encoder.file,
        manifest.decoder_step.file,
        *manifest.tokenizer_files,
        *card,
        *shortlist,
    ):
        if file not in manifest.files:
            raise BundleError(f"{manifest_path}: lists no sha256 for {file}")


def _verify_file(path: Path, entry: FileEntry) -> None:
    if not path.is_file():
        raise BundleError(f"{path}: missing (listed in {MANIFEST_FILE})")
    size = path.stat().st_size
    if size != entry.size:
        state = "truncated" if size < entry.size else "larger than listed"
        raise BundleError(f"{path}: {state}: {size} bytes, {MANIFEST_FILE} lists {entry.size}")
    digest = sha256_file(path)
    if digest != entry.sha256:
        raise BundleError(
            f"{path}: sha256 mismatched: {digest}, {MANIFEST_FILE} lists {entry.sha256}"
        )
