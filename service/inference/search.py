"""Greedy and beam search in numpy over a decoder step: the serving side's search.

The search knows nothing of ONNX Runtime. It drives a `DecoderState`, which turns the last token
of every live row into the k most probable next tokens and their log-probs, and can drop or
reorder its rows; the engine implements it over decoder_step.onnx (whose TopK hands over k
candidates per row instead of the whole vocabulary), the tests over hand-built log-prob tables.

This is the serving twin of model/search.py, the torch reference: `service/` may not import
torch or `model/`, yet the service must give the reference's tokens exactly (its scores within
float rounding). So what the searches decide is written once, in service/bundle/decoding.py:
the options (`DecodingOptions`), the per-step rules (`StepPolicy`: banned tokens, score
normalisation) and the bookkeeping (`GreedyBook`, `BeamBook`: which candidates continue or
finish, the rows' moves, the n-best lists). This module keeps the array work:
- Each step asks the `DecoderState` for a row's best candidates (2 * beam_size, one more per
  token the row that bans most bans) and drops each row's banned ones. A beam's candidates in
  its sentence's top 2K are among the beam's own top 2K (at most 2K - 1 of a beam's candidates
  can rank ahead of one of its own). Ties go to the lower beam, then the lower token id. One
  exception: two log-probs of one beam that differ by an ulp can give equal float32 sums, and
  the one the step did not return is never seen; the reference's torch.topk breaks exact ties
  in no fixed order either, so neither side promises an order there.
- The book's moves reach the state: `select` keeps sentences and expands each first row into
  its beam_size beams after the first step (CTranslate2's expand_after_first_step), `reorder`
  follows the back-pointers, so only the self-attention cache moves; what is per sentence (the
  cross keys/values, the source mask) is never copied per beam.
- When the decoder step has an alignment output (`DecoderState.alignment`), each row's rows of
  it follow the row as its tokens do (greedy: per sentence; beam: gathered by the moves'
  back-pointers), and every finished hypothesis carries those of every step it ran: one per
  token and one for the step that picked </s> (the engine keeps a row per token: the step
  that picked it, or for an aligner the step that read it).
- A sentence's decoder prefix (`Prefixes`: a multilingual model's target-language token) is
  forced: its rows' candidates at those steps are the prefix's token at log-prob 0 alone.
- Before each step, a sentence past its `Deadline` leaves (`GreedyBook.stop`, `BeamBook.stop`)
  with one "deadline" hypothesis, as finished sentences leave; each sentence also ends at its own
  length limit (`limits`, DecodingOptions.limit).
tests/service/test_decoding.py checks on random tables that both searches agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from service.bundle.decoding import (
    BeamBook,
    Constraints,
    Deadline,
    DecodingOptions,
    GreedyBook,
    Hypothesis,
    Prefixes,
    StepPolicy,
)
from service.inference.constraints import Bank

T = TypeVar("T")
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class DecoderRows(Protocol):
    """The rows of a decoder's cache that a search moves between its steps: one per sentence at
    the start, beam_size per sentence (sentence-major) once beam search has expanded them. Who
    runs the steps is the search's driver: `search` (a `DecoderState` of its own) or a running
    batch that steps several searches' rows at once (service/inference/running.py)."""

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        """Keep only the sentences `sentences` (finished ones leave the batch) and their rows
        `rows`, in that order, grouped by sentence. A row may repeat: beam search expands each
        sentence's row after the first step."""
        ...

    def reorder(self, rows: IntArray) -> None:
        """Beam back-pointers: row i continues from row rows[i] of the same sentence, so only
        the self-attention cache moves (cross keys/values of one sentence's beams are copies)."""
        ...

    def alignment(self) -> FloatArray | None:
        """The last step's alignment of every row the search sees, (R, S): where its query
        looked in its sentence's source; None when the decoder has no alignment output."""
        ...

    def log_probs_of(self, ids: IntArray) -> FloatArray:
        """The last step's log-probs of `ids` (R, W) for every row the search sees, (R, W):
        tokens outside a row's top k that a constrained search wants (service/inference/
        constraints.py); -inf for an id the step does not score (a shortlist's, suppressed)."""
        ...


class DecoderState(DecoderRows, Protocol):
    """Decoder rows that step themselves."""

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        """tokens (R,) -> the k most probable next tokens of every row (all V if V < k), best
        first, equal log-probs lower id first: log-probs (R, k) and ids (R, k). The caller may
        modify the results."""
        ...


@dataclass(frozen=True)
class StepCall:
    """What a search asks of its next step: each live row's last token and how many candidates
    per row (as `DecoderState.step`), and the n-best lists of the sentences that finished since
    its last call, final (by the sentence's index), so a driver can answer them at once."""

    tokens: IntArray
    k: int
    finished: dict[int, list[Hypothesis]]


# A search, step by step: it yields a StepCall, is sent that step's (log-probs, ids), and returns
# every sentence's n-best list, in order.
Steps = Generator[StepCall, tuple[FloatArray, IntArray], list[list[Hypothesis]]]


def drive(steps: Generator[StepCall, tuple[FloatArray, IntArray], T], state: DecoderState) -> T:
    """Run a search (`search_steps`, `greedy_steps`, `beam_steps`) to its end on a state that
    steps itself."""
    try:
        call = next(steps)
        while True:
            call = steps.send(state.step(call.tokens, call.k))
    except StopIteration as done:
        result: T = done.value
        return result


def search(
    state: DecoderState,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int,
    eos_id: int,
    deadline: Deadline | None = None,
    prefixes: Prefixes | None = None,
    constraints: Sequence[Constraints] | None = None,
) -> list[list[Hypothesis]]:
    """n-best lists for len(limits) sentences, each of at most its limit of tokens
    (DecodingOptions.limit, plus its prefix: Prefixes.limits); `state` holds one row per
    sentence. A sentence past its `deadline` leaves before the next step with one "deadline"
    hypothesis. Hypotheses keep their `prefixes` (Prefixes.strip takes them off).
    `constraints[i]`: sentence i's terms, each in its translation exactly once (a beam search
    even at beam_size 1: service/inference/constraints.py)."""
    return drive(
        search_steps(
            state, limits, options, bos_id=bos_id, eos_id=eos_id, deadline=deadline,
            prefixes=prefixes, constraints=constraints,
        ),
        state,
    )  # fmt: skip


def search_steps(
    state: DecoderRows,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int,
    eos_id: int,
    deadline: Deadline | None = None,
    prefixes: Prefixes | None = None,
    constraints: Sequence[Constraints] | None = None,
) -> Steps:
    """`search`, one step at a time, for a driver that runs the steps (`Steps`)."""
    forced = prefixes or Prefixes.none(len(limits))
    bank = Bank.of(constraints, eos_id)
    if options.beam_size == 1 and bank is None:
        greedy = yield from greedy_steps(
            state, limits, options, bos_id=bos_id, eos_id=eos_id, deadline=deadline,
            prefixes=forced,
        )  # fmt: skip
        return [[h] for h in greedy]
    beams = yield from beam_steps(
        state, limits, options, bos_id=bos_id, eos_id=eos_id, deadline=deadline, prefixes=forced,
        bank=bank,
    )  # fmt: skip
    return beams


def greedy_steps(
    state: DecoderRows,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int,
    eos_id: int,
    deadline: Deadline | None = None,
    prefixes: Prefixes | None = None,
) -> Generator[StepCall, tuple[FloatArray, IntArray], list[Hypothesis]]:
    """Pick the most probable token at each step; finished rows leave the batch.

    Uses the length options only (beam_size and num_hypotheses are beam_steps').
    """
    forced = prefixes or Prefixes.none(len(limits))
    book = GreedyBook(StepPolicy(options, eos_id), limits)
    tokens = np.full(len(limits), bos_id, dtype=np.int64)  # (R,)
    aligned: list[list[FloatArray]] = [[] for _ in limits]  # per sentence, per step
    done: dict[int, Hypothesis] = {}

    def result(sentence: int) -> Hypothesis:
        """A finished sentence's hypothesis with its alignment rows (none if it was stopped
        before its first step)."""
        if sentence not in done:
            h, rows = book.result(sentence), aligned[sentence]
            done[sentence] = replace(h, alignment=np.stack(rows)) if rows else h
        return done[sentence]

    before = list(book.alive)
    for step in range(book.steps):
        late = _late(book.alive, deadline)
        if late:
            keep = book.stop(late)
            if not keep:
                break
            rows = np.array(keep, dtype=np.int64)
            state.select(rows, rows)
            tokens = tokens[rows]
        bans = book.policy.bans(step, len(tokens), book.history)
        gone = _gone(before, book.alive)
        before = list(book.alive)
        # One more candidate per banned token: it may be among the best.
        stepped = yield StepCall(tokens, 1 + _extra(bans), {s: [result(s)] for s in gone})
        top_log_probs, top_ids = _without(*stepped, bans)  # (R, 1)
        _force(top_log_probs, top_ids, forced.forced(step, book.alive), 1)
        best = top_ids[:, 0]  # (R,)
        alignment = state.alignment()
        if alignment is not None:
            for sentence, row in zip(book.alive, alignment, strict=True):
                aligned[sentence].append(row)
        keep = book.advance(step, best.tolist(), top_log_probs[:, 0].tolist())
        if not keep:
            break
        if len(keep) < len(best):
            rows = np.array(keep, dtype=np.int64)
            state.select(rows, rows)
            best = best[rows]
        tokens = best.astype(np.int64)
    return [result(sentence) for sentence in range(len(limits))]


def beam_steps(
    state: DecoderRows,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int,
    eos_id: int,
    deadline: Deadline | None = None,
    prefixes: Prefixes | None = None,
    bank: Bank | None = None,
) -> Generator[StepCall, tuple[FloatArray, IntArray], list[list[Hypothesis]]]:
    """Batched beam search; `state` holds one row per sentence, expanded to beam_size rows per
    sentence (sentence-major) after the first step. `bank`: the sentences' terms, whose steps
    it chooses (constrained beam search, service/inference/constraints.py)."""
    forced = prefixes or Prefixes.none(len(limits))
    book = BeamBook(StepPolicy(options, eos_id), limits, None if bank is None else bank.holds)
    batch_size = len(limits)
    k = options.beam_size
    # One beam per sentence on the first step (all k would be the same), k from then on.
    scores = np.zeros((batch_size, 1), dtype=np.float32)  # (N, beams)
    history = np.zeros((batch_size, 0), dtype=np.int64)  # (N*beams, t)
    tokens = np.full(batch_size, bos_id, dtype=np.int64)  # (N*beams,)
    # (N*beams, t, S): each row's alignment rows so far, when the decoder has them.
    aligned: FloatArray | None = None
    step_alignment: FloatArray | None = None  # this step's rows, before the moves

    def tokens_of(row: int) -> list[int]:
        return list(history[row].tolist())

    def ending_alignment(row: int) -> FloatArray:
        """The alignment rows of a row that ends at this step: its history's and this step's."""
        assert aligned is not None and step_alignment is not None
        rows: FloatArray = np.concatenate([aligned[row], step_alignment[row, None]])
        return rows

    before = list(book.alive)
    for step in range(book.steps):
        late = _late(book.alive, deadline)
        if late:
            beams = scores.shape[1]
            kept = book.stop(late, beams, scores.tolist(), tokens_of)
            if not kept:
                break
            live = np.array([i * beams + b for i in kept for b in range(beams)], dtype=np.int64)
            state.select(live, np.array(kept, dtype=np.int64))
            scores, history, tokens = scores[kept], history[live], tokens[live]
            aligned = None if aligned is None else aligned[live]
        bans = book.policy.bans(step, len(tokens), tokens_of)
        gone = _gone(before, book.alive)
        before = list(book.alive)
        # A beam's candidates in the sentence's top 2K are among the beam's own top 2K (one
        # more per banned token, as it may be one of them).
        stepped = yield StepCall(tokens, 2 * k + _extra(bans), {s: book.result(s) for s in gone})
        top_log_probs, top_ids = _without(*stepped, bans)
        if bank is not None:
            top_log_probs, top_ids = _wanted(
                state, bank, book.alive, scores.shape[1], tokens_of, bans, top_log_probs, top_ids
            )
        _force(top_log_probs, top_ids, forced.forced(step, book.alive), scores.shape[1])
        step_alignment = state.alignment()
        if step_alignment is not None and aligned is None:
            aligned = np.zeros((len(step_alignment), 0, step_alignment.shape[1]), np.float32)
        n, beams, c = len(book.alive), scores.shape[1], top_log_probs.shape[-1]
        candidates = (scores[:, :, None] + top_log_probs.reshape(n, beams, c)).reshape(n, -1)
        ids = top_ids.reshape(n, beams * c)  # (N, B*C)
        beam_of = np.arange(beams * c) // c  # (B*C,): each column's beam
        # Best score first; ties to the lower beam, then the lower token id (one key for both).
        ties = beam_of * (int(ids.max(initial=0)) + 1) + ids
        order = np.lexsort((ties, -candidates), axis=-1)[:, : min(2 * k, beams * c)]  # (N, 2K)
        picked = np.arange(n)[:, None], order
        chosen = (candidates[picked].tolist(), beam_of[order].tolist(), ids[picked].tolist())
        if bank is not None:
            chosen = _constrained(
                bank, book.alive, beams, k, candidates, beam_of, ids, chosen, tokens_of
            )
        moves = book.advance(
            step, beams, *chosen, tokens_of, None if aligned is None else ending_alignment
        )
        if moves is None:
            break
        if aligned is not None and step_alignment is not None:  # as history: then the moves
            aligned = np.concatenate([aligned, step_alignment[:, None, :]], axis=1)
            aligned = aligned[np.array(moves.rows)]
        if moves.select is not None:
            rows, sentences = moves.select
            state.select(np.array(rows, dtype=np.int64), np.array(sentences, dtype=np.int64))
        if moves.reorder is not None:
            state.reorder(np.array(moves.reorder, dtype=np.int64))
        tokens = np.array(moves.tokens, dtype=np.int64)
        history = np.concatenate([history[np.array(moves.rows)], tokens[:, None]], axis=1)
        scores = np.array(moves.scores, dtype=np.float32).reshape(-1, k)
    return book.results()


def _wanted(
    state: DecoderRows,
    bank: Bank,
    alive: list[int],
    beams: int,
    history: Callable[[int], list[int]],
    bans: list[tuple[int, ...]],
    log_probs: FloatArray,
    ids: IntArray,
) -> tuple[FloatArray, IntArray]:
    """Each row's candidates with the tokens its terms want after them (Bank.wanted), at their
    log-probs; -inf where banned, and for every row of a sentence without terms."""
    wanted, real = bank.wanted(alive, beams, history)
    scored = state.log_probs_of(wanted).astype(np.float32)
    banned = np.array([[t in b for t in row] for row, b in zip(wanted.tolist(), bans, strict=True)])
    scored[~real | banned.reshape(real.shape)] = -np.inf
    return np.concatenate([log_probs, scored], axis=1), np.concatenate([ids, wanted], axis=1)


def _constrained(
    bank: Bank,
    alive: list[int],
    beams: int,
    k: int,
    candidates: FloatArray,
    beam_of: IntArray,
    ids: IntArray,
    chosen: tuple[list[list[float]], list[list[int]], list[list[int]]],
    history: Callable[[int], list[int]],
) -> tuple[list[list[float]], list[list[int]], list[list[int]]]:
    """The step's candidates for BeamBook.advance with each constrained sentence's replaced by
    its bank's choice (Bank.choose); the others' as beam search ranked them."""
    scores, beam_ids, tokens = chosen
    beam_list = beam_of.tolist()
    for i, sentence in enumerate(alive):
        if not bank.constrained(sentence):
            continue
        row_scores, row_ids = candidates[i].tolist(), ids[i].tolist()

        def own(beam: int, i: int = i) -> list[int]:
            return history(i * beams + beam)

        columns = bank.choose(sentence, k, row_scores, beam_list, row_ids, own)
        scores[i] = [row_scores[c] for c in columns]
        beam_ids[i] = [beam_list[c] for c in columns]
        tokens[i] = [row_ids[c] for c in columns]
    return scores, beam_ids, tokens


def _gone(before: list[int], alive: list[int]) -> list[int]:
    """The sentences of `before` no longer `alive` (both in the book's order)."""
    if len(before) == len(alive):
        return []
    left = set(alive)
    return [sentence for sentence in before if sentence not in left]


def _late(alive: list[int], deadline: Deadline | None) -> list[int]:
    """The positions in `alive` of the sentences past their deadline."""
    if deadline is None:
        return []
    now = time.monotonic()
    return [i for i, sentence in enumerate(alive) if deadline(sentence) < now]


def _force(log_probs: FloatArray, ids: IntArray, forced: list[tuple[int, int]], beams: int) -> None:
    """In place: the rows of each sentence a prefix forces a token on (Prefixes.forced: its
    position among the live ones, `beams` rows each, and the token) get that token first at
    log-prob 0 and nothing else."""
    for i, token in forced:
        rows = slice(i * beams, (i + 1) * beams)
        ids[rows, 0] = token
        log_probs[rows, 0] = 0.0
        log_probs[rows, 1:] = -np.inf


def _most(bans: list[tuple[int, ...]]) -> int:
    """The most tokens any row has banned (StepPolicy.bans)."""
    return max(map(len, bans), default=0)


def _extra(bans: list[tuple[int, ...]]) -> int:
    """How many more candidates than its own the search asks a step for: one per token the
    row that bans most bans, past one rounded up to a multiple of 8, so that the step's shape
    changes every 8 bans only (the n-gram rule's grow with the output; a new shape rebinds the
    step, and on CUDA captures a new graph)."""
    most = _most(bans)
    return most if most <= 1 else -(-most // 8) * 8


def _without(
    top_log_probs: FloatArray, top_ids: IntArray, bans: list[tuple[int, ...]]
) -> tuple[FloatArray, IntArray]:
    """The candidates without each row's banned tokens (`bans`, one tuple per row): as many
    columns fewer as the fewest any row bans, the rest in their order; a row that bans more
    ends with its banned ones at -inf (never chosen), so no row loses a candidate it may
    choose."""
    if not _most(bans):
        return top_log_probs, top_ids
    if len(set(bans)) == 1:  # the step's bans alone, the same for every row
        banned = np.isin(top_ids, bans[0])  # (R, C)
    else:
        banned = np.stack([np.isin(ids, b) for ids, b in zip(top_ids, bans, strict=True)])
    order = np.argsort(banned, axis=-1, kind="stable")  # banned last, the rest in order
    kept = top_ids.shape[1] - min(map(len, bans))
    log_probs = np.take_along_axis(top_log_probs, order, axis=-1)[:, :kept]
    log_probs[np.take_along_axis(banned, order, axis=-1)[:, :kept]] = -np.inf
    return log_probs, np.take_along_axis(top_ids, order, axis=-1)[:, :kept]
