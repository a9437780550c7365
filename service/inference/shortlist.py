"""A bundle's vocabulary shortlist at serving time (the manifest's ShortlistSpec; counted by
export/shortlist.py).

Each sentence may produce its own ids: the shortlist's frequent ones, the ids listed for each
of its source ids, and </s>; never a suppressed id. A multilingual bundle's sentence forced
into another language than the shortlist's (its decoder prefix tells) may produce every id.
A batch's decoder step scores the union of its sentences' ids (`batch_inputs`: the step's
`shortlist` and `shortlist_mask` inputs), and each sentence's mask leaves it its own ids only,
so its scores and its translation are those it gets alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.bundle.decoding import NO_CONSTRAINTS, Constraints
from service.bundle.manifest import Bundle, BundleError
from service.inference.search import FloatArray, IntArray
from service.inference.step_state import bucket


@dataclass(frozen=True)
class Shortlist:
    frequent: IntArray  # (F,) ids every sentence may produce (</s> included)
    offsets: IntArray  # (V_source + 1,)
    targets: IntArray  # source id s's ids: targets[offsets[s]:offsets[s + 1]]
    excluded: IntArray  # the suppressed ids, never produced
    prefix: tuple[int, ...]  # the decoder prefix of a translation into the shortlist's language
    every: IntArray  # the ids of a sentence into another language: all but the suppressed

    @classmethod
    def load(cls, bundle: Bundle, prefix: Sequence[int] = ()) -> Shortlist | None:
        """The bundle's shortlist, checked against its vocabularies; None without one.
        `prefix`: the decoder prefix of its target language (a multilingual bundle's)."""
        spec = bundle.manifest.shortlist
        if spec is None:
            return None
        path = bundle.path(spec.file)
        dims, eos = bundle.manifest.model, bundle.manifest.special_ids.eos
        try:
            with np.load(path, allow_pickle=False) as arrays:
                names = ("frequent", "offsets", "targets")
                frequent, offsets, targets = (np.asarray(arrays[n], np.int64) for n in names)
        except (OSError, KeyError, ValueError) as e:
            raise BundleError(f"{path}: not a shortlist: {e}") from e
        vocab = dims.output_vocab_size
        if (
            offsets.shape != (dims.vocab_size + 1,)
            or offsets[0] != 0
            or offsets[-1] != len(targets)
            or np.any(np.diff(offsets) < 0)
            or any(
                len(ids) and not 0 <= ids.min() <= ids.max() < vocab for ids in (frequent, targets)
            )
        ):
            raise BundleError(
                f"{path}: does not map the {dims.vocab_size} source ids to target ids below {vocab}"
            )
        excluded = np.array(sorted(dims.suppressed_ids), np.int64)
        frequent = np.setdiff1d(np.union1d(frequent, [eos]), excluded)
        every = np.setdiff1d(np.arange(vocab), excluded)
        return cls(frequent, offsets, targets, excluded, tuple(prefix), every)

    def candidates(
        self, source: Sequence[int], prefix: Sequence[int] = (), terms: Constraints = NO_CONSTRAINTS
    ) -> IntArray:
        """The ids a sentence with these source ids and this decoder prefix may produce,
        ascending: every id for a prefix into another language than the shortlist's; the ids
        of its `terms` too (a glossary's, service/inference/constraints.py)."""
        if prefix and tuple(prefix) != self.prefix:
            return self.every
        offsets = self.offsets
        own = [self.targets[offsets[s] : offsets[s + 1]] for s in set(source)]
        own += [np.array(term, np.int64) for term in terms.terms]
        ids: IntArray = np.unique(np.concatenate([self.frequent, *own]))
        if len(self.excluded):  # (export/shortlist.py leaves them out; another file may not)
            ids = np.setdiff1d(ids, self.excluded, assume_unique=True)
        return ids


def batch_inputs(
    candidates: Sequence[IntArray], padded: bool = False
) -> tuple[IntArray, FloatArray]:
    """The decoder step's `shortlist` (V',) (the union of the sentences' ids, ascending) and
    `shortlist_mask` (N, V') float32 (0 on each sentence's own ids, -inf elsewhere). `padded`:
    V' a power of two (the padded policy's few shapes, for CUDA graphs), the last id repeated
    and masked for every sentence."""
    union: IntArray = np.unique(np.concatenate(candidates))
    if padded:
        union = np.concatenate([union, np.full(bucket(len(union)) - len(union), union[-1])])
    mask = np.full((len(candidates), len(union)), -np.inf, np.float32)
    for row, ids in enumerate(candidates):
        mask[row, np.searchsorted(union, ids)] = 0.0  # the first of a repeated id: a real one
    return union, mask
