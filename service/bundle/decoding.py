"""How a translation is searched, written once for both sides of the bundle: the options, the
hypothesis, and the per-step rules.

model/search.py (torch, the reference) and service/inference/search.py (numpy, the service) run
the same greedy and beam searches over a decoder step and must give the same tokens (scores
within float rounding). What an option means lives here, so a decoding option is one field of
`DecodingOptions` and one rule of `StepPolicy`; each search applies the policy to its own arrays
(the reference to the whole (R, V) log-probs, the service to the step's top-k candidates).

Conventions both searches follow:
- A hypothesis's ids exclude </s>; it has at most `max_decoding_length` of them and ends with
  finish_reason "eos" or "length".
- Its score is the sum of the log-probs of its tokens (with </s> when emitted), divided by
  length ** length_penalty, where length counts </s> too (`StepPolicy.normalized`). Greedy search
  sums in float64, beam search keeps running scores in float32.
- At each step, a token `StepPolicy.banned` names is never chosen (</s> before
  `min_decoding_length`).
- beam_size=1 gives the same tokens as greedy search.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
import numpy.typing as npt

FinishReason = Literal["eos", "length"]


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
    return_scores: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_size", "num_hypotheses", "max_decoding_length", "min_decoding_length"):
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

    def banned(self, step: int) -> tuple[int, ...]:
        """Token ids no row may choose at `step` (0-based: the step that picks token step + 1)."""
        return (self.eos_id,) if step < self.options.min_decoding_length else ()

    def normalized(self, score: float, length: int) -> float:
        """A finished hypothesis's score: the sum of its log-probs over `length` tokens (</s>
        counted) ** length_penalty."""
        return score / math.pow(length, self.options.length_penalty)


class GreedyBook:
    """A greedy search's decisions, the same in both searches (each keeps its own arrays):
    every live row takes its best token; a row that takes </s> finishes and leaves the batch."""

    def __init__(self, policy: StepPolicy, batch_size: int) -> None:
        self.policy = policy
        self.alive = list(range(batch_size))  # sentence index of each live row
        self._outputs: list[list[int]] = [[] for _ in range(batch_size)]
        self._totals = [0.0] * batch_size  # float64 sums of float32 log-probs
        self._results: list[Hypothesis | None] = [None] * batch_size

    def advance(self, step: int, tokens: list[int], log_probs: list[float]) -> list[int]:
        """Each live row's best token at `step` and its log-prob -> the rows that go on, in
        order (all of them when none finished)."""
        keep = []
        for row, (sentence, token, log_prob) in enumerate(
            zip(self.alive, tokens, log_probs, strict=True)
        ):
            self._totals[sentence] += log_prob
            if token == self.policy.eos_id:
                score = self.policy.normalized(self._totals[sentence], step + 1)
                self._results[sentence] = Hypothesis(self._outputs[sentence], score, "eos")
            else:
                self._outputs[sentence].append(token)
                keep.append(row)
        self.alive = [self.alive[row] for row in keep]
        return keep

    def results(self) -> list[Hypothesis]:
        """One hypothesis per sentence; those still alive end at max_decoding_length."""
        length = self.policy.options.max_decoding_length
        for sentence in self.alive:
            score = self.policy.normalized(self._totals[sentence], length)
            self._results[sentence] = Hypothesis(self._outputs[sentence], score, "length")
        return [r for r in self._results if r is not None]


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
    beams are filled; a sentence with K finished hypotheses leaves the batch."""

    def __init__(self, policy: StepPolicy, batch_size: int) -> None:
        self.policy = policy
        self.k = policy.options.beam_size
        self.alive = list(range(batch_size))  # sentence index of each live block of rows
        self._finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]

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

    def results(
        self,
        scores: list[list[float]],
        history: Callable[[int], list[int]],
        alignment: Callable[[int], npt.NDArray[np.float32]] | None = None,
    ) -> list[list[Hypothesis]]:
        """The n-best lists, best first: the hypotheses finished with </s>, and the live beams
        (`scores[i][beam]`, `history(i * K + beam)`) ending at max_decoding_length."""
        length = self.policy.options.max_decoding_length
        for i, sentence in enumerate(self.alive):
            for beam, score in enumerate(scores[i]):
                if score > -math.inf:
                    normalized = self.policy.normalized(score, length)
                    row = i * self.k + beam
                    hypothesis = Hypothesis(
                        history(row),
                        normalized,
                        "length",
                        None if alignment is None else alignment(row),
                    )
                    self._finished[sentence].append(hypothesis)
        n = self.policy.options.num_hypotheses
        return [sorted(hyps, key=lambda h: h.score, reverse=True)[:n] for hyps in self._finished]
