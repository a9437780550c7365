"""How a translation is searched, written once for both sides of the bundle: the options, the
hypothesis, and the per-step rules.

model/search.py (torch, the reference) and service/inference/search.py (numpy, the service) run
the same greedy and beam searches over a decoder step and must give the same tokens (scores
within float rounding). What an option means lives here, so a decoding option is one field of
`DecodingOptions` and one rule of `StepPolicy`; each search applies the policy to its own arrays
(the reference to the whole (R, V) log-probs, the service to the step's top-k candidates).

Conventions both searches follow:
- A hypothesis's ids exclude </s>; it has at most `DecodingOptions.limit` of them (the
  sentence's own limit: max_decoding_length, or less by the relative limit) and ends with
  finish_reason "eos" or "length", or in the service "deadline" (the search stopped it: its
  request's deadline passed, or nobody waits for it any more).
- Its score is the sum of the log-probs of its tokens (with </s> when emitted), divided by
  length ** length_penalty, where length counts </s> too (`StepPolicy.normalized`). Greedy search
  sums in float64, beam search keeps running scores in float32.
- At each step, a token `StepPolicy.bans` names for a row is never chosen by it (</s> before
  `min_decoding_length`; with `no_repeat_ngram_size` n, a token that would repeat an n-gram of
  the row's own tokens).
- beam_size=1 gives the same tokens as greedy search.
- A sentence may have a decoder prefix (`Prefixes`: a multilingual model's target-language
  token, transformers' forced_bos_token_id): at step t < len(prefix) its rows may choose only
  prefix[t], at log-prob 0 (transformers' ForcedBOSTokenLogitsProcessor), so the prefix adds
  nothing to the score but counts in its length, and in the sentence's limit on top of its
  own. Hypotheses come back without it (`Prefixes.strip`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
import numpy.typing as npt

FinishReason = Literal["eos", "length", "deadline"]


@dataclass(frozen=True, slots=True)
class Constraints:
    """A sentence's terms (service/text/terms.py) for constrained beam search: the target ids
    of each, which its translation holds exactly once each (a term matched twice: twice), and
    the ids it may not produce (`avoid`: the model's own words for a source term where the
    glossary says otherwise, which it would otherwise write beside the term)."""

    terms: tuple[tuple[int, ...], ...] = ()
    avoid: frozenset[int] = frozenset()
    # The ids that continue a word (no space before them): never right after a term, which
    # would glue "Leder" and "kleidung" (the model's, shared by its sentences).
    word_pieces: frozenset[int] = frozenset()
    # Each term's other spellings that count as it: the same text in other pieces, as the model
    # may write it ("ant" + "ik" + "es" for the glossary's "ant" + "ikes"); without them the
    # model's own word was not the term, and the search wrote the term a second time.
    spellings: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.terms)


NO_CONSTRAINTS = Constraints()

# When sentence i of a search must be done (time.monotonic()); read before every step, so it
# may change while the search runs (a caller that no longer wants a sentence moves it to the
# past). The service's search stops a sentence past it ("deadline").
Deadline = Callable[[int], float]


@dataclass(frozen=True, kw_only=True)
class DecodingOptions:
    """CTranslate2-style decoding options; lengths count target tokens without </s>.

    `return_scores` does not change the search (scores decide the n-best order, so they are
    always computed and every `Hypothesis` carries one): it tells the caller whether to show
    them, and being part of the options, requests that differ in it are never merged.
    """

    beam_size: int = 1  # 1 is greedy search
    num_hypotheses: int = 1  # n-best list size, at most beam_size
    length_penalty: float = 1.0
    max_decoding_length: int = 256
    min_decoding_length: int = 0
    # The relative limit (fairseq's max_len_a/b): a sentence of L source tokens gets at most
    # floor(a * L + b) target tokens (`limit`), within max_decoding_length; None: no relative
    # limit. A degenerate source then cannot run to max_decoding_length.
    max_length_a: float | None = None
    max_length_b: int = 0
    # No n-gram of this size occurs twice in a hypothesis (fairseq's no_repeat_ngram_size);
    # 0: off.
    no_repeat_ngram_size: int = 0
    return_scores: bool = False
    # The hypotheses carry their alignment rows (markup and return_alignments need them), when
    # the model has an alignment output; without, a step skips the aligner's nodes where the
    # graph can (bundle format 7's alignment_wanted).
    alignments: bool = False

    def __post_init__(self) -> None:
        for name in (
            "beam_size",
            "num_hypotheses",
            "max_decoding_length",
            "min_decoding_length",
            "no_repeat_ngram_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1 (1 is greedy), got {self.beam_size}")
        if not 1 <= self.num_hypotheses <= self.beam_size:
            raise ValueError(
                f"num_hypotheses must be between 1 and beam_size ({self.beam_size}), "
                f"got {self.num_hypotheses}"
            )
        if self.max_decoding_length < 1:
            raise ValueError(
                f"max_decoding_length must be at least 1, got {self.max_decoding_length}"
            )
        if not 0 <= self.min_decoding_length <= self.max_decoding_length:
            raise ValueError(
                f"min_decoding_length must be between 0 and max_decoding_length "
                f"({self.max_decoding_length}), got {self.min_decoding_length}"
            )
        if not isinstance(self.length_penalty, int | float) or not math.isfinite(
            self.length_penalty
        ):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if self.no_repeat_ngram_size < 0:
            raise ValueError(
                f"no_repeat_ngram_size must be at least 0 (0: off), got {self.no_repeat_ngram_size}"
            )
        a, b = self.max_length_a, self.max_length_b
        if a is not None and (
            not isinstance(a, int | float) or isinstance(a, bool) or not 0 <= a < math.inf
        ):
            raise ValueError(f"max_length_a must be a finite number >= 0 or None, got {a!r}")
        if not isinstance(b, int) or isinstance(b, bool) or b < 0:
            raise ValueError(f"max_length_b must be an integer >= 0, got {b!r}")

    def limit(self, source_length: int) -> int:
        """The most target tokens a sentence of `source_length` source tokens may get:
        max_decoding_length, or floor(max_length_a * source_length + max_length_b) when that is
        less, but never less than min_decoding_length or 1."""
        if self.max_length_a is None:
            return self.max_decoding_length
        relative = math.floor(self.max_length_a * source_length + self.max_length_b)
        return min(self.max_decoding_length, max(relative, self.min_decoding_length, 1))

    def within(self, limit: int) -> DecodingOptions:
        """These options for a model of `limit` positions: it cannot produce more tokens, so both
        lengths are capped there (requests that differ only beyond it are batched together)."""
        length = min(self.max_decoding_length, limit)
        return replace(
            self,
            max_decoding_length=length,
            min_decoding_length=min(self.min_decoding_length, length),
        )


@dataclass(frozen=True)
class Hypothesis:
    ids: list[int]  # target token ids, without </s>
    score: float
    finish_reason: FinishReason
    # (steps, S): the decoder step's alignment output for each step the hypothesis ran (its ids'
    # and the one that picked </s>) as the search returns it; (len(ids), S) from the engine,
    # one row per id (service/inference/engine.py). None when the model has none. Not part of
    # equality.
    alignment: npt.NDArray[np.float32] | None = field(default=None, compare=False)


class OptionFields(TypedDict, total=False):
    """`DecodingOptions` as keywords (the torch reference's `generate` takes them so); a None
    max_decoding_length is the model's limit."""

    beam_size: int
    num_hypotheses: int
    length_penalty: float
    max_decoding_length: int | None
    min_decoding_length: int
    max_length_a: float | None
    max_length_b: int
    no_repeat_ngram_size: int
    return_scores: bool


def options_within(limit: int, **fields: Unpack[OptionFields]) -> DecodingOptions:
    """`DecodingOptions(**fields)` for a model of `limit` positions (`DecodingOptions.within`);
    max_decoding_length is the limit when absent or None."""
    given: dict[str, Any] = {name: value for name, value in fields.items() if value is not None}
    return DecodingOptions(**{"max_decoding_length": limit, **given}).within(limit)


def nothing() -> Hypothesis:
    """The hypothesis of an empty source: found without a model call."""
    return Hypothesis([], 0.0, "eos")


@dataclass(frozen=True)
class StepPolicy:
    """The rules `options` set at every step, for both searches: which tokens may not be chosen,
    and how a finished hypothesis's score is normalized. A new decoding option adds its rule
    here, once for greedy and beam search and for both sides."""

    options: DecodingOptions
    eos_id: int

    def bans(
        self, step: int, rows: int, history: Callable[[int], Sequence[int]]
    ) -> list[tuple[int, ...]]:
        """The token ids each of `rows` rows may not choose at `step` (0-based: the step that
        picks token step + 1): </s> before min_decoding_length, and with no_repeat_ngram_size n
        the tokens that would repeat an n-gram of the row's tokens so far, `history(row)`
        (fairseq's rule: each token that followed an earlier occurrence of the row's last n - 1
        tokens). Without n-grams every row gets the same tuple and `history` is not called."""
        step_bans = (self.eos_id,) if step < self.options.min_decoding_length else ()
        n = self.options.no_repeat_ngram_size
        if n == 0:
            return [step_bans] * rows
        return [step_bans + _repeats(history(row), n) for row in range(rows)]

    def normalized(self, score: float, length: int) -> float:
        """A finished hypothesis's score: the sum of its log-probs over `length` tokens (</s>
        counted) ** length_penalty."""
        return score / math.pow(length, self.options.length_penalty)


def _repeats(tokens: Sequence[int], n: int) -> tuple[int, ...]:
    """The tokens that would end an n-gram already in `tokens` (StepPolicy.bans), in order of
    first occurrence."""
    start = len(tokens) - n + 1  # where the last n - 1 tokens begin
    if start < 0:
        return ()
    key = list(tokens[start:])
    found: dict[int, None] = {}
    for i in range(start):
        if list(tokens[i : i + n - 1]) == key:
            found[tokens[i + n - 1]] = None
    return tuple(found)


@dataclass(frozen=True)
class Prefixes:
    """Each sentence's decoder prefix: the target ids its translation is forced to start with
    (module docstring); () for none."""

    prefixes: Sequence[Sequence[int]]

    @classmethod
    def none(cls, sentences: int) -> Prefixes:
        return cls([()] * sentences)

    def limits(self, limits: Sequence[int], positions: int | None = None) -> list[int]:
        """The search's limits: each sentence's own (DecodingOptions.limit) plus its prefix,
        within the decoder's `positions`."""
        return [
            min(limit + len(p), positions or limit + len(p))
            for limit, p in zip(limits, self.prefixes, strict=True)
        ]

    def forced(self, step: int, sentences: Sequence[int]) -> list[tuple[int, int]]:
        """(position in `sentences`, token) for each of these sentences whose prefix forces
        its token at `step`."""
        return [
            (i, prefix[step])
            for i, sentence in enumerate(sentences)
            if step < len(prefix := self.prefixes[sentence])
        ]

    def strip(self, sentence: int, hypothesis: Hypothesis) -> Hypothesis:
        """A sentence's hypothesis without its prefix: ids, and the alignment rows of the
        steps that chose the prefix."""
        n = len(self.prefixes[sentence])
        if not n:
            return hypothesis
        alignment = None if hypothesis.alignment is None else hypothesis.alignment[n:]
        return replace(hypothesis, ids=hypothesis.ids[n:], alignment=alignment)


class GreedyBook:
    """A greedy search's decisions, the same in both searches (each keeps its own arrays):
    every live row takes its best token; a row that takes </s>, or reaches its sentence's
    limit (`limits`, one per sentence: DecodingOptions.limit), finishes and leaves the batch."""

    def __init__(self, policy: StepPolicy, limits: Sequence[int]) -> None:
        self.policy = policy
        self.alive = list(range(len(limits)))  # sentence index of each live row
        self._limits = list(limits)
        self._outputs: list[list[int]] = [[] for _ in limits]
        self._totals = [0.0] * len(limits)  # float64 sums of float32 log-probs
        self._results: list[Hypothesis | None] = [None] * len(limits)

    @property
    def steps(self) -> int:
        """How many steps the search may take: the longest limit."""
        return max(self._limits, default=0)

    def history(self, row: int) -> list[int]:
        """A live row's tokens so far."""
        return self._outputs[self.alive[row]]

    def advance(self, step: int, tokens: list[int], log_probs: list[float]) -> list[int]:
        """Each live row's best token at `step` and its log-prob -> the rows that go on, in
        order (all of them when none finished)."""
        keep = []
        for row, (sentence, token, log_prob) in enumerate(
            zip(self.alive, tokens, log_probs, strict=True)
        ):
            self._totals[sentence] += log_prob
            if token == self.policy.eos_id:
                self._finish(sentence, step + 1, "eos")
                continue
            self._outputs[sentence].append(token)
            if step + 1 == self._limits[sentence]:
                self._finish(sentence, step + 1, "length")
            else:
                keep.append(row)
        self.alive = [self.alive[row] for row in keep]
        return keep

    def stop(self, rows: Collection[int]) -> list[int]:
        """End these live rows now ("deadline": what they have so far) -> the rows that go on,
        in order."""
        keep = [row for row in range(len(self.alive)) if row not in rows]
        for row in rows:
            sentence = self.alive[row]
            self._finish(sentence, len(self._outputs[sentence]) or 1, "deadline")
        self.alive = [self.alive[row] for row in keep]
        return keep

    def results(self) -> list[Hypothesis]:
        """One hypothesis per sentence, once every sentence has finished."""
        return [r for r in self._results if r is not None]

    def result(self, sentence: int) -> Hypothesis:
        """A finished sentence's hypothesis."""
        result = self._results[sentence]
        if result is None:
            raise ValueError(f"sentence {sentence} has not finished")
        return result

    def _finish(self, sentence: int, length: int, reason: FinishReason) -> None:
        score = self.policy.normalized(self._totals[sentence], length)
        self._results[sentence] = Hypothesis(self._outputs[sentence], score, reason)


@dataclass(frozen=True)
class BeamMoves:
    """What one step of beam search decided, for the search to apply to its own arrays: the
    next rows (K per sentence that goes on, sentence-major), and how the decoder's rows move."""

    rows: list[int]  # the row each next row continues, in the step's numbering
    tokens: list[int]  # the token each next row takes
    scores: list[float]  # each next row's running score (-inf: a dead filler row)
    select: tuple[list[int], list[int]] | None  # first DecoderState.select(rows, sentences)
    reorder: list[int] | None  # then DecoderState.reorder(rows)


class BeamBook:
    """A batched beam search's decisions, the same in both searches (each keeps its own arrays
    and ranks its own candidates).

    CTranslate2/fairseq's rules: the first step runs one row per sentence, whose best candidates
    become its K beams (expand_after_first_step); each step scans a sentence's 2K best
    candidates, a </s> among the first K finishes a hypothesis, the others continue until K
    beams are filled; a sentence with K finished hypotheses leaves the batch, and so does one
    whose beams reach its limit (`limits`, one per sentence: DecodingOptions.limit), its live
    beams finishing with "length". `preferred(sentence, hypothesis)`, when given, ranks the
    hypotheses it prefers before the others, each by score (a constrained search's: those
    that hold every term)."""

    def __init__(
        self,
        policy: StepPolicy,
        limits: Sequence[int],
        preferred: Callable[[int, Hypothesis], bool] | None = None,
    ) -> None:
        self.policy = policy
        self._preferred = preferred
        self.k = policy.options.beam_size
        self.alive = list(range(len(limits)))  # sentence index of each live block of rows
        self._limits = list(limits)
        self._finished: list[list[Hypothesis]] = [[] for _ in limits]

    @property
    def steps(self) -> int:
        """How many steps the search may take: the longest limit."""
        return max(self._limits, default=0)

    def advance(
        self,
        step: int,
        beams: int,
        scores: list[list[float]],
        beam_ids: list[list[int]],
        tokens: list[list[int]],
        history: Callable[[int], list[int]],
        alignment: Callable[[int], npt.NDArray[np.float32]] | None = None,
    ) -> BeamMoves | None:
        """The step's choice: for each live sentence (`beams` rows each: 1 on the first step,
        K after), its best candidates, best first, as running scores, the beam (within the
        sentence) and the token of each; `history(row)` is a row's tokens so far, and
        `alignment(row)` its alignment rows (Hypothesis.alignment), if the search has them.
        None when every sentence has finished."""
        k, eos_id = self.k, self.policy.eos_id
        next_rows: list[int] = []
        next_tokens: list[int] = []
        next_scores: list[float] = []
        kept: list[int] = []
        for i, (sentence, row_scores, row_beams, row_tokens) in enumerate(
            zip(self.alive, scores, beam_ids, tokens, strict=True)
        ):
            rows: list[int] = []
            toks: list[int] = []
            scs: list[float] = []
            for j, (score, beam, token) in enumerate(
                zip(row_scores, row_beams, row_tokens, strict=True)
            ):
                if score == -math.inf or len(rows) == k:
                    break
                if token == eos_id:
                    if j < k:
                        normalized = self.policy.normalized(score, step + 1)
                        row = i * beams + beam
                        hypothesis = Hypothesis(
                            history(row),
                            normalized,
                            "eos",
                            None if alignment is None else alignment(row),
                        )
                        self._finished[sentence].append(hypothesis)
                    continue
                rows.append(i * beams + beam)
                toks.append(token)
                scs.append(score)
            if len(self._finished[sentence]) >= k:
                continue
            if step + 1 == self._limits[sentence]:
                for row, token, score in zip(rows, toks, scs, strict=True):
                    self._finished[sentence].append(
                        Hypothesis(
                            [*history(row), token],
                            self.policy.normalized(score, step + 1),
                            "length",
                            None if alignment is None else alignment(row),
                        )
                    )
                continue
            while len(rows) < k:  # fewer live candidates than beams: dead filler rows
                rows.append(i * beams)
                toks.append(eos_id)
                scs.append(-math.inf)
            kept.append(i)
            next_rows += rows
            next_tokens += toks
            next_scores += scs
        live = len(self.alive)
        self.alive = [self.alive[i] for i in kept]
        if not kept:
            return None
        if beams < k:
            # After the first step: each kept sentence's row becomes its K beams.
            return BeamMoves(next_rows, next_tokens, next_scores, (next_rows, kept), None)
        if len(kept) < live:
            # Rows of finished sentences leave: select whole blocks, then reorder within them.
            kept_rows = [b * k + r for b in kept for r in range(k)]
            position = {b: p for p, b in enumerate(kept)}
            within = [position[r // k] * k + r % k for r in next_rows]
            return BeamMoves(next_rows, next_tokens, next_scores, (kept_rows, kept), within)
        return BeamMoves(next_rows, next_tokens, next_scores, None, next_rows)

    def stop(
        self, positions: Collection[int], beams: int, scores: list[list[float]],
        history: Callable[[int], list[int]],
    ) -> list[int]:  # fmt: skip
        """End the live sentences at these positions of `alive` now: each gets one "deadline"
        hypothesis, its best beam so far (`beams` rows per sentence, running `scores[i]`,
        `history(row)`). -> the positions that go on, in order."""
        keep = [i for i in range(len(self.alive)) if i not in positions]
        for i in positions:
            row = i * beams  # a sentence's best beam is its first row
            length = max(len(history(row)), 1)
            score = self.policy.normalized(scores[i][0], length)
            self._finished[self.alive[i]] = [Hypothesis(history(row), score, "deadline")]
        self.alive = [self.alive[i] for i in keep]
        return keep

    def results(self) -> list[list[Hypothesis]]:
        """The n-best lists, best first, once every sentence has finished."""
        return [self.result(sentence) for sentence in range(len(self._finished))]

    def result(self, sentence: int) -> list[Hypothesis]:
        """A finished sentence's n-best list, best first."""
        n = self.policy.options.num_hypotheses
        finished = sorted(self._finished[sentence], key=lambda h: h.score, reverse=True)
        if self._preferred is not None:
            preferred = self._preferred
            finished.sort(key=lambda h: not preferred(sentence, h))  # stable: by score within
        return finished[:n]
