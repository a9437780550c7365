"""Lexically constrained beam search: each sentence's terms (`Constraints`: target id
sequences, from a glossary) appear in its translation exactly once each.

After Post & Vilar (2018), dynamic beam allocation, over the service's beam search
(service/inference/search.py `beam_steps`), which hands a constrained sentence's step to
`Bank.choose`:
- Candidates: each row's best tokens as the step returns them (2K per row), plus, for each
  row, the token that starts each unmet term and the one that continues the term the row is in
  the middle of (`Bank.wanted`; their log-probs read from the step's whole distribution,
  `DecoderRows.log_probs_of`), each (row, token) once.
- A candidate's progress is how many of the sentence's term tokens its tokens hold: whole terms
  met (each counted at most as often as required) and the longest start of an unmet term its
  last tokens are. One that would hold a term more often than required is dropped (exactly
  once), and so is </s> before every term is met; so is a token of `Constraints.avoid` (the
  model's own word for a source term whose glossary target differs: "Fahrrad" beside the
  glossary's "Rad"), and a piece that would continue the word a term just ended ("Leder" +
  "kleidung": `Constraints.word_pieces`). A term counts in any of its spellings
  (`Constraints.spellings`: the same text in other pieces, "ant" + "ik" + "es" for the
  glossary's "ant" + "ikes"), which the model may write where the glossary's pieces are not
  its own: counted in the glossary's alone, the model's word was not the term, and the sentence
  went on to write it a second time. Only the term's own pieces count as beginning it (a
  spelling begun and left, "erk" + "l" + "immt" for "erk" + "let" + "tert", would hold a beam
  as progress).
- The K beams go first to the best candidate of each bank (candidates of equal progress) of
  progress all term tokens .. 1, then to the best of the rest by score, whatever their
  progress. So a hypothesis that has begun or met a term is not pushed out by better-scoring
  ones that have not, yet each bank takes one beam at most from them, and none when its best
  already ranks among the K best: where the model writes a one-token term itself, the
  hypotheses it prefers keep K - 1 beams until one of them holds the term and all K from then
  on, as in beam search. Post & Vilar's even shares (K // banks each, the bank of progress 0
  too) took K // 2 beams from them at every step for a one-token term, before and after it was
  met: of the test2016 sentences whose term the plain translation already used, 1 in 5 came
  out otherwise, and BLEU there fell (benchmarks/RESULTS.md, terminology). 1 in 15 still
  do: the beam the term's bank takes in the first steps, before the model writes the term, is
  the one the model's best translation began in.
- </s> from a hypothesis that holds every term finishes it when it ranks among the K best of
  the full bank; the n-best list is then ranked by score as always (BeamBook).
A hypothesis that cannot meet its terms before the sentence's length limit finishes at the
limit ("length"), as any other.

A sentence without terms is searched exactly as without this module: its candidates, order and
moves are beam search's own (tests/service/test_constraints.py checks it on random tables).
The state of a hypothesis is read from its tokens at each step (terms are a few tokens,
hypotheses tens): nothing follows the beams' back-pointers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from service.bundle.decoding import Constraints, Hypothesis

IntArray = npt.NDArray[np.int64]
# Hypotheses whose term counts a search keeps (a few steps' rows).
_COUNTED = 256


class _Terms:
    """One sentence's terms: each distinct id sequence and how often it is required."""

    def __init__(self, constraints: Constraints) -> None:
        required: dict[tuple[int, ...], int] = {}
        for term in constraints.terms:
            required[term] = required.get(term, 0) + 1
        self.required = required
        # Each term's spellings, its own first (Constraints.spellings).
        self.spellings: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {
            term: (term,) for term in required
        }
        for term, others in zip(constraints.terms, constraints.spellings, strict=False):
            self.spellings[term] = (term, *others)
        self.avoid = constraints.avoid
        self.word_pieces = constraints.word_pieces
        self.total = sum(len(term) * n for term, n in required.items())
        # Counts by hypothesis: a step asks for each row's twice (Bank.wanted, Bank.choose), and
        # a term's spellings make each count several scans of the row.
        self._counted: dict[tuple[int, ...], dict[tuple[int, ...], int]] = {}

    def counts(self, tokens: Sequence[int]) -> dict[tuple[int, ...], int]:
        """How often each term occurs in `tokens` in any of its spellings, not overlapping."""
        key = tuple(tokens)
        found = self._counted.get(key)
        if found is None:
            if len(self._counted) >= _COUNTED:
                self._counted.clear()  # the rows of steps gone by
            found = self._counted[key] = {
                term: sum(_count(tokens, own) for own in self.spellings[term])
                for term in self.required
            }
        return found

    def state(
        self, tokens: Sequence[int], counts: dict[tuple[int, ...], int]
    ) -> tuple[int, bool, bool]:
        """(progress, every term met, a term held too often) of a hypothesis's tokens, whose
        term counts are `counts`."""
        progress, complete, over, started = 0, True, False, 0
        for term, required in self.required.items():
            n = counts[term]
            progress += len(term) * min(n, required)
            over |= n > required
            if n < required:
                complete = False
                started = max(started, _started(tokens, term))
        return progress + started, complete, over

    def after(
        self, tokens: list[int], counts: dict[tuple[int, ...], int], token: int
    ) -> tuple[int, bool, bool]:
        """`state` of `tokens` + [token], from the counts of `tokens`: a term ends with the new
        token or the counts stay (a term's occurrences do not overlap: the new one counts
        unless it shares tokens with one just counted, which `_count` would not count)."""
        extended = [*tokens[-_LONGEST:], token]
        new = dict(counts)
        for term in self.required:
            for own in self.spellings[term]:
                if extended[-len(own) :] == list(own) and _count(tokens + [token], own) > _count(
                    tokens, own
                ):
                    new[term] += 1
        return self.state(extended, new)

    def glued(self, tokens: Sequence[int], token: int) -> bool:
        """Whether `token` would continue a word that a term just ended ("Leder" + "kleidung")."""
        return token in self.word_pieces and any(
            len(tokens) >= len(own) and tuple(tokens[-len(own) :]) == own
            for spellings in self.spellings.values()
            for own in spellings
        )

    def next_tokens(self, tokens: Sequence[int], counts: dict[tuple[int, ...], int]) -> set[int]:
        """The tokens that start or continue an unmet term after `tokens`."""
        wanted = set()
        for term, required in self.required.items():
            if counts[term] < required:
                wanted.add(term[0])
                wanted.add(term[_started(tokens, term)])
        return wanted


# Terms are matched over a hypothesis's last tokens: none is longer (a glossary's terms have at
# most MAX_TERM_CHARACTERS characters, a few dozen tokens).
_LONGEST = 64


def _count(tokens: Sequence[int], term: tuple[int, ...]) -> int:
    """Occurrences of `term` in `tokens`, not overlapping."""
    n, i, width = 0, 0, len(term)
    while i + width <= len(tokens):
        if tuple(tokens[i : i + width]) == term:
            n += 1
            i += width
        else:
            i += 1
    return n


def _started(tokens: Sequence[int], term: tuple[int, ...]) -> int:
    """How many of `term`'s first tokens `tokens` ends with (less than the whole term)."""
    for n in range(min(len(term) - 1, len(tokens)), 0, -1):
        if tuple(tokens[-n:]) == term[:n]:
            return n
    return 0


class Bank:
    """The terms of a search's sentences (by sentence index), and the constrained choice of
    each step for those that have any."""

    def __init__(self, constraints: Sequence[Constraints], eos_id: int) -> None:
        self._terms = [_Terms(c) if c else None for c in constraints]
        self.eos_id = eos_id

    @staticmethod
    def of(constraints: Sequence[Constraints] | None, eos_id: int) -> Bank | None:
        """A bank for these sentences' terms; None when none has any (plain beam search)."""
        if constraints is None or not any(constraints):
            return None
        return Bank(constraints, eos_id)

    def constrained(self, sentence: int) -> bool:
        return self._terms[sentence] is not None

    def holds(self, sentence: int, hypothesis: Hypothesis) -> bool:
        """Whether a finished hypothesis holds each of its sentence's terms as often as
        required (BeamBook ranks those first): one cut at the length limit may not."""
        terms = self._terms[sentence]
        return terms is None or terms.state(hypothesis.ids, terms.counts(hypothesis.ids))[1]

    def wanted(
        self, alive: Sequence[int], beams: int, history: Callable[[int], list[int]]
    ) -> tuple[IntArray, npt.NDArray[np.bool_]]:
        """The tokens each row wants scored besides its best ones ((R, W), padded with </s>),
        and which of those are real (False: padding, and every column of a sentence without
        terms, which must be -inf)."""
        per_row: list[list[int]] = []
        for i, sentence in enumerate(alive):
            terms = self._terms[sentence]
            for b in range(beams):
                if terms is None:
                    per_row.append([])
                    continue
                tokens = history(i * beams + b)
                per_row.append(sorted(terms.next_tokens(tokens, terms.counts(tokens))))
        width = max(map(len, per_row), default=0) or 1
        ids = np.full((len(per_row), width), self.eos_id, np.int64)
        real = np.zeros((len(per_row), width), bool)
        for row, tokens in enumerate(per_row):
            ids[row, : len(tokens)] = tokens
            real[row, : len(tokens)] = True
        return ids, real

    def choose(
        self,
        sentence: int,
        k: int,
        scores: Sequence[float],
        beam_of: Sequence[int],
        ids: Sequence[int],
        history: Callable[[int], list[int]],
    ) -> list[int]:
        """A constrained sentence's step: of its candidates (flat over its beams: running
        score, beam, token), the columns BeamBook.advance is to read, in its order: the
        finishing </s> ones first, then the K that go on (module docstring)."""
        terms = self._terms[sentence]
        assert terms is not None
        seen: set[tuple[int, int]] = set()
        finishing: list[tuple[float, int]] = []
        banks: dict[int, list[tuple[float, int]]] = {}
        rows: dict[int, tuple[list[int], dict[tuple[int, ...], int], bool]] = {}
        for column, (score, beam, token) in enumerate(zip(scores, beam_of, ids, strict=True)):
            if score == -np.inf or (beam, token) in seen:
                continue
            seen.add((beam, token))
            if beam not in rows:
                tokens = history(beam)
                counts = terms.counts(tokens)
                rows[beam] = tokens, counts, terms.state(tokens, counts)[1]
            tokens, counts, complete = rows[beam]
            if token == self.eos_id:
                if complete:
                    finishing.append((score, column))
                continue
            if token in terms.avoid or terms.glued(tokens, token):
                continue
            progress, _, over = terms.after(tokens, counts, token)
            if not over:
                banks.setdefault(progress, []).append((score, column))
        for bank in banks.values():
            bank.sort(key=lambda c: -c[0])
        chosen = _allocate(banks, terms.total, k)
        # </s> among the K best of the full bank (hypotheses holding every term) finishes.
        full = sorted([*finishing, *banks.get(terms.total, [])], key=lambda c: -c[0])[:k]
        ended = [column for score, column in full if ids[column] == self.eos_id]
        return ended + chosen


def _allocate(banks: dict[int, list[tuple[float, int]]], total: int, k: int) -> list[int]:
    """K candidates from banks of progress 0 .. total (each sorted best first): the best of
    each bank of progress total .. 1 that has any, while beams are left, then the best of the
    rest by score, ties to the lower column (module docstring); ordered most advanced first,
    best first within a bank."""
    firsts = [(p, *banks[p][0]) for p in range(total, 0, -1) if banks.get(p)][:k]
    kept = {column for _, _, column in firsts}
    rest = sorted(
        ((p, score, column) for p, bank in banks.items() for score, column in bank
         if column not in kept),
        key=lambda c: (-c[1], c[2]),
    )  # fmt: skip
    chosen = firsts + rest[: k - len(firsts)]
    chosen.sort(key=lambda c: (-c[0], -c[1], c[2]))
    return [column for _, _, column in chosen]
