"""Greedy and beam search in numpy over a decoder step: the serving side's search.

The search knows nothing of ONNX Runtime. It drives a `DecoderState`, which turns the last token
of every live row into the k most probable next tokens and their log-probs, and can drop or
reorder its rows; the engine implements it over decoder_step.onnx (whose TopK hands over k
candidates per row instead of the whole vocabulary), the tests over hand-built log-prob tables.

This is a deliberate mirror of model/search.py, the torch reference: `service/` may not import
torch or `model/`, yet the service must give the reference's tokens exactly (its scores within
float rounding), so both follow the same conventions step for step:
- A hypothesis's ids exclude </s>; it has at most `max_decoding_length` of them and ends with
  finish_reason "eos" or "length".
- Its score is the sum of the log-probs of its tokens (with </s> when emitted), divided by
  length ** length_penalty, where length counts </s> too. Greedy search sums in float64, beam
  search keeps running scores in float32, as the reference does.
- Beam search follows CTranslate2/fairseq: the first step runs one row per sentence, then
  `DecoderState.select` expands each into beam_size rows (CTranslate2's
  expand_after_first_step: at the start all beams are the same, so the first step costs one
  row, not beam_size); the 2 * beam_size best candidates per sentence are scanned, a </s> among
  the top beam_size finishes a hypothesis, the others continue; a sentence is done with
  beam_size finished hypotheses and leaves the batch. From then on only the self-attention
  cache follows the back-pointers (`DecoderState.reorder`); what is per sentence (the cross
  keys/values, the source mask) is never copied per beam.
- Those 2 * beam_size are found among each beam's own 2 * beam_size best (at most 2K - 1 of a
  beam's candidates can rank ahead of one of its own). Ties go to the lower beam, then the lower
  token id. One exception: two log-probs of one beam that differ by an ulp can give equal float32
  sums, and the one the step did not return is never seen; the reference's torch.topk breaks
  exact ties in no fixed order either, so neither side promises an order there.
- beam_size=1 gives the same tokens as greedy search.
tests/service/test_decoding.py checks on random tables that both searches agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
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


class DecoderState(Protocol):
    """The decoder with its cache, over R live rows: one per sentence at the start, beam_size
    per sentence (sentence-major) once beam search has expanded them."""

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        """tokens (R,) -> the k most probable next tokens of every row (all V if V < k), best
        first, equal log-probs lower id first: log-probs (R, k) and ids (R, k). The caller may
        modify the results."""
        ...

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        """Keep only the sentences `sentences` (finished ones leave the batch) and their rows
        `rows`, in that order, grouped by sentence. A row may repeat: beam search expands each
        sentence's row after the first step."""
        ...

    def reorder(self, rows: IntArray) -> None:
        """Beam back-pointers: row i continues from row rows[i] of the same sentence, so only
        the self-attention cache moves (cross keys/values of one sentence's beams are copies)."""
        ...


def search(
    state: DecoderState, batch_size: int, options: DecodingOptions, *, bos_id: int, eos_id: int
) -> list[list[Hypothesis]]:
    """n-best lists for `batch_size` sentences; `state` holds one row per sentence."""
    if options.beam_size == 1:
        return [
            [h] for h in greedy_search(state, batch_size, options, bos_id=bos_id, eos_id=eos_id)
        ]
    return beam_search(state, batch_size, options, bos_id=bos_id, eos_id=eos_id)


def greedy_search(
    state: DecoderState, batch_size: int, options: DecodingOptions, *, bos_id: int, eos_id: int
) -> list[Hypothesis]:
    """Pick the most probable token at each step; finished rows leave the batch.

    Uses the length options only (beam_size and num_hypotheses are beam_search's).
    """
    alive = list(range(batch_size))  # sentence index of each live row
    tokens = np.full(batch_size, bos_id, dtype=np.int64)  # (R,)
    outputs: list[list[int]] = [[] for _ in range(batch_size)]
    totals = [0.0] * batch_size  # float64 sums of float32 log-probs, as the reference
    results: list[Hypothesis | None] = [None] * batch_size
    for step in range(options.max_decoding_length):
        too_early = step < options.min_decoding_length
        # One more candidate when </s> is forbidden: it may be the best one.
        top_log_probs, top_ids = state.step(tokens, 2 if too_early else 1)  # (R, k)
        if too_early:
            top_log_probs, top_ids = _without(top_log_probs, top_ids, eos_id)
        best, best_scores = top_ids[:, 0], top_log_probs[:, 0]  # (R,)
        keep = []
        for row, (sentence, token, score) in enumerate(
            zip(alive, best.tolist(), best_scores.tolist(), strict=True)
        ):
            totals[sentence] += score
            if token == eos_id:
                normalized = _normalized(totals[sentence], step + 1, options.length_penalty)
                results[sentence] = Hypothesis(outputs[sentence], normalized, "eos")
            else:
                outputs[sentence].append(token)
                keep.append(row)
        if len(keep) < len(alive):
            if not keep:
                break
            rows = np.array(keep, dtype=np.int64)
            state.select(rows, rows)
            best = best[rows]
            alive = [alive[r] for r in keep]
        tokens = best.astype(np.int64)
    for sentence in alive:
        if results[sentence] is None:
            normalized = _normalized(
                totals[sentence], options.max_decoding_length, options.length_penalty
            )
            results[sentence] = Hypothesis(outputs[sentence], normalized, "length")
    return [r for r in results if r is not None]


def beam_search(
    state: DecoderState, batch_size: int, options: DecodingOptions, *, bos_id: int, eos_id: int
) -> list[list[Hypothesis]]:
    """Batched beam search; `state` holds one row per sentence, expanded to beam_size rows per
    sentence (sentence-major) after the first step."""
    k = options.beam_size
    alive = list(range(batch_size))  # sentence index of each live block of rows
    # One beam per sentence on the first step (all k would be the same), k from then on.
    scores = np.zeros((batch_size, 1), dtype=np.float32)  # (N, beams)
    history = np.zeros((batch_size, 0), dtype=np.int64)  # (N*beams, t)
    tokens = np.full(batch_size, bos_id, dtype=np.int64)  # (N*beams,)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]

    for step in range(options.max_decoding_length):
        too_early = step < options.min_decoding_length
        # A beam's candidates in the sentence's top 2K are among the beam's own top 2K (one
        # more when </s> is forbidden, as it may be one of them).
        top_log_probs, top_ids = state.step(tokens, 2 * k + int(too_early))  # (N*beams, C)
        if too_early:
            top_log_probs, top_ids = _without(top_log_probs, top_ids, eos_id)
        n, beams, c = len(alive), scores.shape[1], top_log_probs.shape[-1]
        candidates = (scores[:, :, None] + top_log_probs.reshape(n, beams, c)).reshape(n, -1)
        beam_of = np.broadcast_to(np.repeat(np.arange(beams), c), (n, beams * c))  # (N, B*C)
        # Best score first; ties to the lower beam, then the lower token id.
        order = np.lexsort((top_ids.reshape(n, beams * c), beam_of, -candidates), axis=-1)
        order = order[:, : min(2 * k, beams * c)]  # (N, 2K)
        top_scores = np.take_along_axis(candidates, order, axis=-1)
        top_beams = np.take_along_axis(beam_of, order, axis=-1)
        top_tokens = np.take_along_axis(top_ids.reshape(n, beams * c), order, axis=-1)
        next_rows: list[int] = []
        next_tokens: list[int] = []
        next_scores: list[float] = []
        keep_blocks: list[int] = []
        for i, (sentence, cand_scores, cand_beams, cand_tokens) in enumerate(
            zip(alive, top_scores.tolist(), top_beams.tolist(), top_tokens.tolist(), strict=True)
        ):
            rows: list[int] = []
            toks: list[int] = []
            scs: list[float] = []
            for j, (score, beam, token) in enumerate(
                zip(cand_scores, cand_beams, cand_tokens, strict=True)
            ):
                if score == -math.inf or len(rows) == k:
                    break
                if token == eos_id:
                    if j < k:
                        finished[sentence].append(
                            Hypothesis(
                                history[i * beams + beam].tolist(),
                                _normalized(score, step + 1, options.length_penalty),
                                "eos",
                            )
                        )
                    continue
                rows.append(i * beams + beam)
                toks.append(token)
                scs.append(score)
            if len(finished[sentence]) >= k:
                continue
            while len(rows) < k:  # fewer live candidates than beams: dead filler rows
                rows.append(i * beams)
                toks.append(eos_id)
                scs.append(-math.inf)
            keep_blocks.append(i)
            next_rows += rows
            next_tokens += toks
            next_scores += scs
        if not keep_blocks:
            alive = []
            break
        row_index = np.array(next_rows, dtype=np.int64)
        kept = np.array(keep_blocks, dtype=np.int64)
        if beams < k:
            # After the first step: each kept sentence's row becomes its k beams.
            state.select(row_index, kept)
        elif len(keep_blocks) < n:
            # Rows of finished sentences leave: select whole blocks, then reorder within them.
            kept_rows = np.array([b * k + r for b in keep_blocks for r in range(k)], np.int64)
            state.select(kept_rows, kept)
            position = {b: p for p, b in enumerate(keep_blocks)}
            state.reorder(np.array([position[r // k] * k + r % k for r in next_rows], np.int64))
        else:
            state.reorder(row_index)
        tokens = np.array(next_tokens, dtype=np.int64)
        history = np.concatenate([history[row_index], tokens[:, None]], axis=1)
        scores = np.array(next_scores, dtype=np.float32).reshape(len(keep_blocks), k)
        alive = [alive[b] for b in keep_blocks]

    for i, sentence in enumerate(alive):
        for beam in range(k):
            score = float(scores[i, beam])
            if score > -math.inf:
                finished[sentence].append(
                    Hypothesis(
                        history[i * k + beam].tolist(),
                        _normalized(score, options.max_decoding_length, options.length_penalty),
                        "length",
                    )
                )
    return [
        sorted(hyps, key=lambda h: h.score, reverse=True)[: options.num_hypotheses]
        for hyps in finished
    ]


def _normalized(score: float, length: int, length_penalty: float) -> float:
    return score / math.pow(length, length_penalty)


def _without(
    top_log_probs: FloatArray, top_ids: IntArray, token: int
) -> tuple[FloatArray, IntArray]:
    """The candidates with `token` left out, one column fewer, the rest in their order. A row
    whose candidates do not hold `token` loses its last (worst) one instead."""
    rows, c = top_ids.shape
    is_token = top_ids == token
    # Each row drops its `token` column, or else its last column.
    drop = np.where(is_token.any(axis=-1), is_token.argmax(axis=-1), c - 1)  # (R,)
    keep = np.arange(c)[None, :] != drop[:, None]  # (R, C), one False per row
    return top_log_probs[keep].reshape(rows, c - 1), top_ids[keep].reshape(rows, c - 1)
