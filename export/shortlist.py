"""A vocabulary shortlist counted on a parallel corpus (the manifest's ShortlistSpec).

    python -m export --checkpoint DIR --out BUNDLE --shortlist SRC TGT
        [--shortlist-frequent 1000] [--shortlist-per-token 100]

With a large target vocabulary the decoder step's output projection is most of its work (an
NLLB-200 model scores 256,206 ids for every row at every step). A shortlist scores only the ids
a sentence may produce: the corpus's `frequent` most frequent target ids, and for each of the
sentence's source ids the `per_token` target ids that most often appear in the translations of
sentences that hold it (Marian's and CTranslate2's lexical shortlists, counted by co-occurrence
here instead of word alignment). A sentence's ids depend on that sentence alone, so its
translation does not change with its batch; they differ from the full vocabulary's wherever
the best token is not among them, so a shortlist is an option of the export and its BLEU is
measured against the bundle without one (`python -m export.quantize --bundle B --reference
FULL`; benchmarks/RESULTS.md).

SRC and TGT are line-aligned text (gzipped or not): the training data, or any source text and
the model's own translations of it (which is what the shortlist must cover).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from model.data import read_parallel
from service.bundle.manifest import SentencePieceFiles, SpecialIds, Tokenization
from service.bundle.tokenizer import TextTokenizer, load_tokenizer_files

DEFAULT_FREQUENT = 1000
DEFAULT_PER_TOKEN = 100
_CHUNK = 4096  # sentence pairs counted at a time: the (source, target) pairs of a chunk in memory


class Shortlist(NamedTuple):
    frequent: np.ndarray  # (F,) int64, ascending
    offsets: np.ndarray  # (V_source + 1,) int64
    targets: np.ndarray  # int64: source id s's are targets[offsets[s]:offsets[s + 1]], ascending

    def save(self, path: Path) -> None:
        # Plain arrays, no pickles: what service/inference/shortlist.py reads back.
        with path.open("wb") as f:
            np.savez(f, frequent=self.frequent, offsets=self.offsets, targets=self.targets)


def count_shortlist(
    pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
    source_vocab: int,
    target_vocab: int,
    *,
    frequent: int,
    per_token: int,
    excluded: Iterable[int] = (),
) -> Shortlist:
    """The shortlist of (source ids, target ids) sentence pairs: the `frequent` target ids
    seen most often (ties: lower id), and for each source id the `per_token` target ids not
    among those that co-occur with it in the most pairs, at least twice (a pair counts each
    id once; ties: lower id). `excluded` ids (a model's suppressed ones) are in neither."""
    if frequent < 1 or per_token < 0:
        raise ValueError(f"frequent must be >= 1 and per_token >= 0, got {frequent}, {per_token}")
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    totals = np.zeros(target_vocab, np.int64)
    chunk: list[np.ndarray] = []

    def flush() -> None:
        if chunk:
            unique, count = np.unique(np.concatenate(chunk), return_counts=True)
            keys.append(unique)
            counts.append(count)
            chunk.clear()

    for source, target in pairs:
        target_array = np.asarray(target, np.int64)
        np.add.at(totals, target_array, 1)
        s, t = np.unique(np.asarray(source, np.int64)), np.unique(target_array)
        chunk.append((s[:, None] * target_vocab + t[None, :]).reshape(-1))
        if len(chunk) == _CHUNK:
            flush()
    flush()
    excluded_ids = np.array(sorted(set(excluded)), np.int64)
    totals[excluded_ids] = -1
    order = np.lexsort((np.arange(target_vocab), -totals))  # most seen first, then lower id
    top = order[:frequent]
    top = np.sort(top[totals[top] > 0])
    if not keys:
        return Shortlist(top, np.zeros(source_vocab + 1, np.int64), np.zeros(0, np.int64))
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    together = np.bincount(inverse, weights=np.concatenate(counts)).astype(np.int64)
    source_ids, target_ids = np.divmod(unique, target_vocab)
    kept = (together >= 2) & ~np.isin(target_ids, top) & ~np.isin(target_ids, excluded_ids)
    source_ids, target_ids, together = source_ids[kept], target_ids[kept], together[kept]
    # By source id, most pairs first, then lower id; the first per_token of each source id.
    order = np.lexsort((target_ids, -together, source_ids))
    source_ids, target_ids = source_ids[order], target_ids[order]
    starts = np.searchsorted(source_ids, np.arange(source_vocab))
    rank = np.arange(len(source_ids)) - starts[source_ids]
    source_ids, target_ids = source_ids[rank < per_token], target_ids[rank < per_token]
    order = np.lexsort((target_ids, source_ids))  # each source id's targets ascending
    offsets = np.searchsorted(source_ids[order], np.arange(source_vocab + 1))
    return Shortlist(top, offsets.astype(np.int64), target_ids[order])


def corpus_shortlist(
    checkpoint: Path,
    tokenizer: Tokenization,
    special_ids: SpecialIds,
    vocab_sizes: tuple[int, int],
    corpus: tuple[Path, Path],
    *,
    frequent: int,
    per_token: int,
    excluded: Iterable[int],
) -> Shortlist:
    """The shortlist of a checkpoint's model counted on the line-aligned `corpus` (source,
    target), tokenized as the service tokenizes (its source ids; the target side through the
    target tokenizer)."""
    source_tokenizer = load_tokenizer_files(checkpoint, tokenizer, special_ids, vocab_sizes)
    target_tokenizer = _target_tokenizer(checkpoint, tokenizer, special_ids, vocab_sizes)
    sources, targets = read_parallel(*corpus)
    pairs = (
        (source, target)
        for start in range(0, len(sources), _CHUNK)
        for source, target in zip(
            source_tokenizer.encode(sources[start : start + _CHUNK]),
            target_tokenizer.encode(targets[start : start + _CHUNK]),
            strict=True,
        )
    )
    return count_shortlist(
        pairs, *vocab_sizes, frequent=frequent, per_token=per_token, excluded=excluded
    )


def _target_tokenizer(
    checkpoint: Path,
    tokenizer: Tokenization,
    special_ids: SpecialIds,
    vocab_sizes: tuple[int, int],
) -> TextTokenizer:
    """What turns target text into target ids: the same tokenizer, or Marian's target
    SentencePiece model and vocabulary in the source's place."""
    if isinstance(tokenizer, SentencePieceFiles):
        tokenizer = tokenizer.model_copy(
            update={"source_model": tokenizer.target_model, "source_vocab": tokenizer.target_vocab}
        )
        vocab_sizes = (vocab_sizes[1], vocab_sizes[1])
    return load_tokenizer_files(checkpoint, tokenizer, special_ids, vocab_sizes)
