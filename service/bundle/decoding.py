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
from dataclasses import dataclass
from typing import Any, Literal

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


@dataclass(frozen=True)
class Hypothesis:
    ids: list[int]  # target token ids, without </s>
    score: float
    finish_reason: FinishReason


def options_within(limit: int, **fields: Any) -> DecodingOptions:
    """`DecodingOptions(**fields)` for a model of `limit` positions: max_decoding_length is the
    limit when absent or None, and at most the limit."""
    requested = fields.pop("max_decoding_length", None)
    length = limit if requested is None else min(requested, limit)
    return DecodingOptions(max_decoding_length=length, **fields)


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
