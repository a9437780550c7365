"""Parallel text: reading, cleaning, and length-bucketed batches under a token budget."""

from __future__ import annotations

import gzip
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from tokenizers import Tokenizer
from torch import Tensor

from model.transformer import BOS_ID, EOS_ID, PAD_ID
from service.bundle.tokenizer import token_words


class DataError(ValueError):
    """Input data that cannot be used; the message names the offending file(s)."""


def read_lines(path: str | Path) -> list[str]:
    """One sentence per line, UTF-8, plain or gzipped (by the .gz suffix)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    try:
        with _open_text(path) as f:
            return [line.rstrip("\r\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path}: {e}") from e


def _open_text(path: Path) -> TextIO:
    """A UTF-8 text file, gzipped or not (by the .gz suffix)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Both sides of a parallel corpus; they must have the same number of lines."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    if not src:
        raise DataError(f"empty corpus: {src_path} and {tgt_path} have no lines")
    return src, tgt


def language_of(path: str | Path) -> str:
    """'train.en.gz' -> 'en'."""
    name = Path(path).name.removesuffix(".gz")
    return name.rsplit(".", 1)[-1] if "." in name else ""


@dataclass(frozen=True)
class Example:
    src: list[int]  # source ids followed by </s>
    tgt: list[int]  # target ids followed by </s> (the decoder input is <s> + tgt[:-1])
    # Guided alignment: (target token, source token) links of a word aligner's, by index into
    # tgt and src (</s> never linked); empty without alignments.
    links: tuple[tuple[int, int], ...] = ()


def encode_pairs(
    tokenizer: Tokenizer,
    src: Sequence[str],
    tgt: Sequence[str],
    max_len: int,
    alignments: Sequence[set[tuple[int, int]]] | None = None,
) -> list[Example]:
    """Tokenize pairs and drop empty ones and those longer than max_len tokens (with </s>).

    `alignments` (model/alignment.py: links of whitespace words, one set per pair) become links
    between tokens: every token of a source word to every token of a target word it is linked to.
    """
    if alignments is not None and len(alignments) != len(src):
        raise DataError(f"{len(alignments)} alignments for {len(src)} sentence pairs")
    src_ids = tokenizer.encode_batch(list(src))
    tgt_ids = tokenizer.encode_batch(list(tgt))
    examples = []
    for n, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if not s.ids or not t.ids:
            continue
        if len(s.ids) + 1 > max_len or len(t.ids) + 1 > max_len:
            continue
        links: tuple[tuple[int, int], ...] = ()
        if alignments is not None:
            links = _token_links(
                alignments[n], token_words(src[n], s.offsets), token_words(tgt[n], t.offsets)
            )
        examples.append(Example(s.ids + [EOS_ID], t.ids + [EOS_ID], links))
    return examples


def _token_links(
    words: set[tuple[int, int]], source_words: list[int | None], target_words: list[int | None]
) -> tuple[tuple[int, int], ...]:
    """Word links -> (target token, source token) links, in order."""
    sources: dict[int, list[int]] = {}
    for token, word in enumerate(source_words):
        if word is not None:
            sources.setdefault(word, []).append(token)
    linked: dict[int, set[int]] = {}
    for i, j in words:
        linked.setdefault(j, set()).update(sources.get(i, ()))
    return tuple(
        (t, s)
        for t, word in enumerate(target_words)
        if word is not None
        for s in sorted(linked.get(word, ()))
    )


def pad(
    sequences: Sequence[Sequence[int]], prefix: Sequence[int] = (), pad_id: int = PAD_ID
) -> Tensor:
    """Right-pad int sequences (each optionally prefixed) into a (B, L) int64 tensor."""
    length = max(len(prefix) + len(s) for s in sequences)
    out = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        row = [*prefix, *s]
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


@dataclass
class Batch:
    src: Tensor  # (B, S)
    tgt_in: Tensor  # (B, T): <s> y1 .. yn
    tgt_out: Tensor  # (B, T): y1 .. yn </s>
    # Guided alignment's target (B, T, S): row t spreads 1 evenly over the source tokens that
    # target token t (tgt_out[:, t]) is linked to; all 0 where it has no link. None: no links.
    alignment: Tensor | None = None

    @classmethod
    def from_examples(cls, examples: Sequence[Example]) -> Batch:
        src = pad([e.src for e in examples])
        tgt_out = pad([e.tgt for e in examples])
        tgt_in = pad([e.tgt[:-1] for e in examples], prefix=[BOS_ID])
        alignment = None
        if any(e.links for e in examples):
            alignment = torch.zeros(*tgt_out.shape, src.size(1))
            for b, e in enumerate(examples):
                for t, s in e.links:
                    alignment[b, t, s] = 1.0
            alignment /= alignment.sum(-1, keepdim=True).clamp(min=1.0)
        return cls(src, tgt_in, tgt_out, alignment)

    @property
    def n_tgt_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.src.to(device),
            self.tgt_in.to(device),
            self.tgt_out.to(device),
            None if self.alignment is None else self.alignment.to(device),
        )


def token_budget_batches(examples: Sequence[Example], max_tokens: int) -> list[list[int]]:
    """Indices grouped by length so that batch_size * longest side <= max_tokens.

    Sorting by (target, source) length keeps padding low; the order of the batches is
    shuffled separately, per epoch.
    """
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].tgt), len(examples[i].src)))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(len(examples[i].src), len(examples[i].tgt))
        if size > max_tokens:
            raise DataError(f"an example of {size} tokens does not fit max_tokens={max_tokens}")
        if current and max(longest, size) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches


def epoch_batches(batches: Sequence[list[int]], seed: int, epoch: int) -> Iterator[list[int]]:
    """The batches of one epoch in a shuffled order determined by (seed, epoch)."""
    order = list(range(len(batches)))
    random.Random(seed * 100_003 + epoch).shuffle(order)
    for i in order:
        yield batches[i]


# Lines tokenized at a time while streaming (tokenizers' batch encoding, in parallel).
_STREAM_CHUNK = 10_000


def stream_pairs(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[str, str]]:
    """The sentence pairs of two files, read line by line (plain or gzipped): a corpus that
    does not fit in memory. DataError when one file ends before the other."""
    paths = [Path(src_path), Path(tgt_path)]
    for path in paths:
        if not path.is_file():
            raise DataError(f"no such file: {path}")
    files = [_open_text(path) for path in paths]
    try:
        for n, (src, tgt) in enumerate(itertools.zip_longest(*files), start=1):
            if src is None or tgt is None:
                raise DataError(
                    f"line counts differ: {paths[src is None]} has more lines than "
                    f"{paths[src is not None]} (which ends before line {n})"
                )
            yield src.rstrip("\r\n"), tgt.rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {paths[0]} / {paths[1]}: {e}") from e
    finally:
        for f in files:
            f.close()


def stream_batches(
    pairs: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    max_len: int,
    max_tokens: int,
    buffer: int,
    seed: int,
    epoch: int,
) -> Iterator[list[Example]]:
    """Token-budget batches of a stream of pairs with flat memory: `buffer` examples at a time
    are encoded (encode_pairs' rules), sorted into batches by length (token_budget_batches) and
    yielded in a shuffled order of their own (seed, epoch, buffer number); then the next
    buffer. Every usable pair once per pass."""
    rng = random.Random(seed * 100_003 + epoch)
    examples: list[Example] = []

    def batches() -> Iterator[list[Example]]:
        groups = token_budget_batches(examples, max_tokens)
        rng.shuffle(groups)
        for indices in groups:
            yield [examples[i] for i in indices]

    stream = iter(pairs)
    while chunk := list(itertools.islice(stream, _STREAM_CHUNK)):
        src, tgt = zip(*chunk, strict=True)
        examples += encode_pairs(tokenizer, src, tgt, max_len)
        if len(examples) >= buffer:
            yield from batches()
            examples = []
    if examples:
        yield from batches()
