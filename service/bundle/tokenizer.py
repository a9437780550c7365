"""A bundle's tokenizer: texts -> source ids ending in </s>, target ids -> text.

Two kinds, named by the manifest's `tokenizer` entry:
- a Hugging Face `tokenizers` file: this project's joint byte-level BPE;
- SentencePiece files, for Marian (OPUS-MT) models: the same ids and text as transformers'
  MarianTokenizer. The source text goes through the source SentencePiece model, whose pieces
  map to ids through vocab.json (not the SentencePiece model's own ids; a piece missing from
  vocab.json is <unk>), then </s>; the output ids map back to pieces through the target
  vocabulary, which the target SentencePiece model joins into text.

Why the `sentencepiece` package and not a `tokenizers` file converted from the .spm models
(benchmarks/RESULTS.md has the numbers and the command): on every Multi30k en/de/fr line both
give MarianTokenizer's ids, but the conversion (transformers' SpmConverter) drops a trailing
U+0085 that SentencePiece keeps (474 of 20,000 random texts differ), while calling SentencePiece
is MarianTokenizer's own code path, equal on every text tried; and it encodes 3.6 times as many
sentences per second as the converted file.

Two deliberate differences from MarianTokenizer, both on text a client sends: it turns text that
spells a special token ("</s>", "<pad>") into that token, and a leading ">>fra<<" into a
language token; here both stay text. The service adds the target-language token itself, from
the requested target, so a client can neither end its input early nor pick another target.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import sentencepiece
from tokenizers import Tokenizer

from service.bundle.manifest import (
    Bundle,
    BundleError,
    SentencePieceFiles,
    SpecialIds,
    Tokenization,
    TokenizersFile,
)

# transformers' clean_up_tokenization, applied in this order when a Marian checkpoint asks for
# it (clean_up_tokenization_spaces in its tokenizer_config.json).
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
_WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁"
_WORD = re.compile(r"\S+")

Span = tuple[int, int]  # characters [start, end) of a text


class TextTokenizer(Protocol):
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids + </s> per text; [] for a text with no tokens (nothing to translate)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids (special tokens left out) -> text."""
        ...

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of each text as a word of a translation (no </s>): a glossary's term."""
        ...

    def token_id(self, token: str) -> int | None:
        """The source id of a whole token (e.g. ">>fra<<"), None if it is not one."""
        ...

    def source_spans(self, texts: Sequence[str]) -> list[list[Span]]:
        """The characters of each text that each of its `encode` ids (</s> left out) stands
        for; a token of no character of its own (a lone word boundary) is an empty span."""
        ...

    def target_spans(self, ids: Sequence[int]) -> list[Span]:
        """The characters of `decode(ids)` that each id stands for (empty for a special
        token or a lone word boundary)."""
        ...


class BpeTokenizer:
    """A `tokenizers` file (this project's byte-level BPE, or an imported NLLB model's), with
    </s> appended by the engine whatever post-processor it has. `exact`: the file has exactly
    the model's tokens (this project's); else at most (NLLB's model has two ids more than its
    tokenizer, never produced by it)."""

    def __init__(
        self,
        path: Path,
        special_ids: SpecialIds,
        vocab_size: int,
        *,
        exact: bool = True,
        clean_up_spaces: bool = False,
    ) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own untyped errors
            raise BundleError(f"{path}: not a tokenizers file: {e}") from e
        # Not stored in tokenizer.json: without it a user could type "</s>" and end the input.
        self._tokenizer.encode_special_tokens = True
        size = self._tokenizer.get_vocab_size()
        if size != vocab_size and (exact or size > vocab_size):
            raise BundleError(f"{path}: {size} tokens, the model has {vocab_size}")
        self._eos = special_ids.eos
        self._clean_up = clean_up_spaces

    # One call per text (here, and for the spans below): the batch calls hand their lists to
    # the library's thread pool, which costs more than the work for sentences (encoding two:
    # 0.036 ms in a loop, 0.054 batched, 0.54 ms on average batched beside one busy thread;
    # decoding a translation's prefixes: 0.029 ms a sentence in a loop, 0.042 batched, ~1 ms
    # batched beside the engine's threads on two cores).

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = [self._tokenizer.encode(text, add_special_tokens=False) for text in texts]
        return [[*e.ids, self._eos] if e.ids else [] for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return _cleaned(text) if self._clean_up else text

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        # One joint vocabulary; its pre-tokenizer adds the space a word has inside a sentence.
        return [self._tokenizer.encode(text, add_special_tokens=False).ids for text in texts]

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def source_spans(self, texts: Sequence[str]) -> list[list[Span]]:
        encode = self._tokenizer.encode
        return [
            [_without_spaces(text, span) for span in encode(text, add_special_tokens=False).offsets]
            for text in texts
        ]

    def target_spans(self, ids: Sequence[int]) -> list[Span]:
        decode = self._tokenizer.decode
        return prefix_spans(
            [decode(list(ids[: i + 1]), skip_special_tokens=True) for i in range(len(ids))]
        )


class SentencePieceTokenizer:
    """transformers' MarianTokenizer (module docstring), on the `sentencepiece` package."""

    def __init__(
        self,
        directory: Path,
        files: SentencePieceFiles,
        special_ids: SpecialIds,
        vocab_sizes: tuple[int, int],
    ) -> None:
        """`files` in `directory`; `vocab_sizes` (source, target) of the model."""
        self._source = _load_model(directory / files.source_model)
        self._target = _load_model(directory / files.target_model)
        self._source_ids = _load_vocab(directory / files.source_vocab, vocab_sizes[0])
        target_ids = _load_vocab(directory / files.target_vocab, vocab_sizes[1])
        self._target_pieces = {i: piece for piece, i in target_ids.items()}
        self._target_ids = target_ids
        missing = [token for token in files.special_tokens if token not in target_ids]
        if missing:
            raise BundleError(f"{directory / files.target_vocab}: no special token {missing}")
        self._skipped = frozenset(target_ids[token] for token in files.special_tokens)
        self._unk, self._eos = special_ids.unk, special_ids.eos
        self._clean_up = files.clean_up_spaces

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        # One call per text: for sentence-length texts a loop is faster than the batch call,
        # which hands the list to a thread pool.
        ids, unk, eos = self._source_ids, self._unk, self._eos
        out = []
        for text in texts:
            pieces = self._source.encode(text, out_type=str)
            out.append([*(ids.get(p, unk) for p in pieces), eos] if pieces else [])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        pieces = [self._target_pieces[i] for i in ids if i not in self._skipped]
        text: str = self._target.decode_pieces(pieces)
        text = text.replace(_WORD_BOUNDARY, " ").strip()
        return _cleaned(text) if self._clean_up else text

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        ids, unk = self._target_ids, self._unk
        return [[ids.get(p, unk) for p in self._target.encode(t, out_type=str)] for t in texts]

    def token_id(self, token: str) -> int | None:
        return self._source_ids.get(token)

    def source_spans(self, texts: Sequence[str]) -> list[list[Span]]:
        spans = []
        for text in texts:
            offsets = self._source.encode(text, out_type="offset_mapping")["offsets"]
            spans.append([_without_spaces(text, (start, end)) for start, end in offsets])
        return spans

    def target_spans(self, ids: Sequence[int]) -> list[Span]:
        return prefix_spans([self.decode(ids[: i + 1]) for i in range(len(ids))])


def _cleaned(text: str) -> str:
    """transformers' clean_up_tokenization."""
    for before, after in _CLEAN_UP:
        text = text.replace(before, after)
    return text


def prefix_spans(prefixes: Sequence[str]) -> list[Span]:
    """Token spans in the last of `prefixes` (the decoding of ids[:1], ids[:2], ... ids): token
    i is what its prefix added, without the spaces it starts with. A decoding that is not a
    prefix of the next (a character split over byte tokens) is clamped into place."""
    if not prefixes:
        return []
    text = prefixes[-1]
    spans: list[Span] = []
    end = 0
    for prefix in prefixes:
        start = end
        end = max(start, min(len(prefix), len(text)))
        spans.append(_without_spaces(text, (start, end)))
    return spans


def _without_spaces(text: str, span: Span) -> Span:
    """A token's span without the word boundary (spaces) it starts with."""
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    return start, end


def token_words(text: str, spans: Sequence[Span]) -> list[int | None]:
    """The whitespace-separated word of `text` each token span falls in (by its first
    character that is not a space), None for a span of spaces or nothing."""
    starts = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    words: list[int | None] = []
    word = 0
    for span in spans:
        start, end = _without_spaces(text, span)
        if start >= end:
            words.append(None)
            continue
        while word < len(starts) and starts[word][1] <= start:
            word += 1
        words.append(word if word < len(starts) and starts[word][0] <= start else None)
    return words


def load_tokenizer(bundle: Bundle) -> TextTokenizer:
    """The tokenizer the bundle's manifest names, checked against the model's vocabularies."""
    manifest = bundle.manifest
    dims = manifest.model
    return load_tokenizer_files(
        bundle.directory,
        manifest.tokenizer,
        manifest.special_ids,
        (dims.vocab_size, dims.output_vocab_size),
    )


def load_tokenizer_files(
    directory: Path,
    files: Tokenization,
    special_ids: SpecialIds,
    vocab_sizes: tuple[int, int],
) -> TextTokenizer:
    """A tokenizer from its files in `directory`, checked against the model's (source,
    target) vocabulary sizes: what a bundle and an import both load."""
    if isinstance(files, SentencePieceFiles):
        return SentencePieceTokenizer(directory, files, special_ids, vocab_sizes)
    if isinstance(files, TokenizersFile):
        return BpeTokenizer(
            directory / files.file,
            special_ids,
            vocab_sizes[0],
            exact=False,
            clean_up_spaces=files.clean_up_spaces,
        )
    return BpeTokenizer(directory / files, special_ids, vocab_sizes[0])


def _load_model(path: Path) -> sentencepiece.SentencePieceProcessor:
    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise BundleError(f"{path}: not a SentencePiece model: {e}") from e


def _load_vocab(path: Path, size: int) -> dict[str, int]:
    """piece -> id, every id of the model's `size` once (what the importer checked)."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: not a readable vocabulary: {e}") from e
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(size)):
        raise BundleError(f"{path}: does not map {size} tokens to the ids 0..{size - 1}")
    return vocab
