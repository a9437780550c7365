"""Reference decoding in torch: greedy and batched beam search over a step function.

The search knows nothing of the model: it drives a `Stepper`, which turns the last token of
every live row into log-probs for the next one. Two steppers wrap the model: `CachedStepper`
(decode_step with a key/value cache) and `UncachedStepper` (re-runs the whole decoder on the
prefix each step, the seeds' loop, kept as the baseline).

What the search decides is written once, in service/bundle/decoding.py, and shared with the
service's numpy search (service/inference/search.py), which must match this one token for token:
the options (`DecodingOptions`), the per-step rules (`StepPolicy`: banned tokens, score
normalisation) and the bookkeeping (`GreedyBook`, `BeamBook`: CTranslate2/fairseq's beam search,
which candidates continue or finish, the rows' moves, the n-best lists). This module keeps the
torch work: the whole (R, V) log-probs with banned tokens at -inf, and torch.topk over a
sentence's beams. After the first step's expansion only the self-attention cache is reordered by
the back-pointers; the cached stepper keeps one row of cross-attention keys/values per sentence,
shared by its beams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, Unpack

import torch
from torch import Tensor

from model.data import pad
from model.transformer import BOS_ID, EOS_ID, PAD_ID, Transformer
from service.bundle.decoding import (
    BeamBook,
    DecodingOptions,
    GreedyBook,
    Hypothesis,
    OptionFields,
    Prefixes,
    StepPolicy,
    nothing,
    options_within,
)

DecoderKind = Literal["cached", "uncached"]


class Stepper(Protocol):
    def step(self, tokens: Tensor) -> Tensor:
        """tokens (R,) -> log-probs (R, V) of the next token."""
        ...

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        """Keep only the sentences `sentences` (those that finished leave the batch) and their
        rows `rows`, in that order, grouped by sentence; a row may repeat (beam search expands
        each sentence's row after the first step)."""
        ...

    def reorder(self, rows: Tensor) -> None:
        """Beam back-pointers: row i continues from row rows[i] of the same sentence."""
        ...


class CachedStepper:
    def __init__(self, model: Transformer, memory: Tensor, src_mask: Tensor) -> None:
        self.model, self.src_mask = model, src_mask
        self.cache = model.init_cache(memory)

    def step(self, tokens: Tensor) -> Tensor:
        log_probs, self.cache = self.model.decode_step(tokens, self.cache, self.src_mask)
        return log_probs

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        # One cross key/value and mask row per sentence, shared by its beams.
        self.cache = self.cache.select(rows, sentences)
        self.src_mask = self.src_mask.index_select(0, sentences)

    def reorder(self, rows: Tensor) -> None:
        self.cache = self.cache.reorder_self(rows)


class UncachedStepper:
    def __init__(self, model: Transformer, memory: Tensor, src_mask: Tensor) -> None:
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.prefix = memory.new_zeros(memory.size(0), 0, dtype=torch.long)  # (R, t)

    def step(self, tokens: Tensor) -> Tensor:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)  # (R, t + 1)
        logits = self.model.decode(self.prefix, self.memory, self.src_mask)[:, -1]  # (R, V)
        return self.model.next_token_log_probs(logits)

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        # The seeds' loop: memory and mask follow the rows, one copy per beam.
        self.prefix = self.prefix.index_select(0, rows)
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = self.src_mask.index_select(0, rows)

    def reorder(self, rows: Tensor) -> None:
        self.prefix = self.prefix.index_select(0, rows)


def greedy_search(
    stepper: Stepper,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    device: torch.device | str = "cpu",
    prefixes: Prefixes | None = None,
) -> list[Hypothesis]:
    """Pick the most probable token at each step; finished rows leave the batch.

    Uses the length options only (beam_size and num_hypotheses are beam_search's).
    """
    forced = prefixes or Prefixes.none(len(limits))
    book = GreedyBook(StepPolicy(options, eos_id), limits)
    tokens = torch.full((len(limits),), bos_id, dtype=torch.long, device=device)
    for step in range(book.steps):
        bans = book.policy.bans(step, len(tokens), book.history)
        log_probs = _without(stepper.step(tokens), bans)  # (R, V)
        _force(log_probs, forced.forced(step, book.alive), 1)
        best_log_probs, best = log_probs.max(dim=-1)  # (R,)
        keep = book.advance(step, best.tolist(), best_log_probs.tolist())
        if not keep:
            break
        if len(keep) < len(best):
            rows = torch.tensor(keep, device=device)
            stepper.select(rows, rows)
            best = best.index_select(0, rows)
        tokens = best
    return book.results()


def beam_search(
    stepper: Stepper,
    limits: Sequence[int],
    options: DecodingOptions,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    device: torch.device | str = "cpu",
    prefixes: Prefixes | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; `stepper` holds one row per sentence, and beam_size rows per
    sentence (sentence-major) from the second step on: it expands them itself (`select`)."""
    forced = prefixes or Prefixes.none(len(limits))
    book = BeamBook(StepPolicy(options, eos_id), limits)
    batch_size = len(limits)
    k = options.beam_size
    # One beam per sentence on the first step (all k would be the same), k from then on.
    scores = torch.zeros(batch_size, 1, device=device)  # (N, beams)
    history = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # (N*beams, t)
    tokens = torch.full((batch_size,), bos_id, dtype=torch.long, device=device)

    def tokens_of(row: int) -> list[int]:
        return list(history[row].tolist())

    for step in range(book.steps):
        bans = book.policy.bans(step, len(tokens), tokens_of)
        log_probs = _without(stepper.step(tokens), bans)  # (N*beams, V)
        _force(log_probs, forced.forced(step, book.alive), scores.size(1))
        n, beams, vocab = len(book.alive), scores.size(1), log_probs.size(-1)
        candidates = (scores[:, :, None] + log_probs.view(n, beams, vocab)).view(n, -1)
        top_scores, top_index = candidates.topk(min(2 * k, beams * vocab), dim=-1)  # (N, 2K)
        moves = book.advance(
            step,
            beams,
            top_scores.tolist(),
            (top_index // vocab).tolist(),  # the beam of each candidate
            (top_index % vocab).tolist(),  # its token
            tokens_of,
        )
        if moves is None:
            break
        if moves.select is not None:
            rows, sentences = moves.select
            stepper.select(
                torch.tensor(rows, device=device), torch.tensor(sentences, device=device)
            )
        if moves.reorder is not None:
            stepper.reorder(torch.tensor(moves.reorder, device=device))
        tokens = torch.tensor(moves.tokens, device=device)
        history = torch.cat(
            [history.index_select(0, torch.tensor(moves.rows, device=device)), tokens[:, None]],
            dim=1,
        )
        scores = torch.tensor(moves.scores, device=device).view(-1, k)
    return book.results()


def _without(log_probs: Tensor, bans: list[tuple[int, ...]]) -> Tensor:
    """The step's log-probs with each row's banned tokens (`bans`, one tuple per row) at -inf
    (never chosen)."""
    if len(set(bans)) == 1:  # the step's bans alone, the same for every row
        if bans[0]:
            log_probs[:, list(bans[0])] = -math.inf
        return log_probs
    for row, banned in enumerate(bans):
        if banned:
            log_probs[row, list(banned)] = -math.inf
    return log_probs


def _force(log_probs: Tensor, forced: list[tuple[int, int]], beams: int) -> None:
    """In place: the rows of each sentence a prefix forces a token on (Prefixes.forced) have
    log-prob 0 for that token and -inf for every other."""
    for i, token in forced:
        rows = log_probs[i * beams : (i + 1) * beams]
        rows.fill_(-math.inf)
        rows[:, token] = 0.0


def decode_batches(
    make_stepper: Callable[[Tensor], Stepper],
    sources: Sequence[Sequence[int]],
    options: DecodingOptions,
    *,
    batch_size: int = 64,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    device: torch.device | str = "cpu",
    prefixes: Sequence[Sequence[int]] | None = None,
    positions: int | None = None,
) -> list[list[Hypothesis]]:
    """Sort sources by length, decode them in batches, and return n-best lists in input order.

    `make_stepper(src)` gets a padded (B, S) batch and returns a stepper over its B rows (the
    encoder run once; beam search expands the rows per beam after the first step). Any backend
    (torch, ONNX Runtime) plugs in here and shares the search. Empty sources give an empty
    hypothesis unseen. `prefixes`: each source's decoder prefix (Prefixes), forced and taken
    off the hypotheses, within the decoder's `positions`.
    """
    results = [[nothing()] for _ in sources]
    order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        stepper = make_stepper(pad([sources[i] for i in chunk], pad_id=pad_id))  # (B, S) -> B rows
        forced = Prefixes([() if prefixes is None else prefixes[i] for i in chunk])
        limits = forced.limits([options.limit(len(sources[i])) for i in chunk], positions)
        if options.beam_size > 1:
            nbest = beam_search(
                stepper, limits, options, bos_id=bos_id, eos_id=eos_id, device=device,
                prefixes=forced,
            )  # fmt: skip
        else:
            greedy = greedy_search(
                stepper, limits, options, bos_id=bos_id, eos_id=eos_id, device=device,
                prefixes=forced,
            )  # fmt: skip
            nbest = [[h] for h in greedy]
        for row, (i, hyps) in enumerate(zip(chunk, nbest, strict=True)):
            results[i] = [forced.strip(row, h) for h in hyps]
    return results


@torch.inference_mode()
def generate(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
    decoder: DecoderKind = "cached",
    prefixes: Sequence[Sequence[int]] | None = None,
    **options: Unpack[OptionFields],
) -> list[list[Hypothesis]]:
    """Decode source id sequences (each ending in </s>) with the torch model; n-best lists.

    `options` are `DecodingOptions` fields; max_decoding_length is at most the model's positions
    (all of them when not given). `prefixes`: each source's decoder prefix (a multilingual
    model's target-language token), forced."""
    device = next(model.parameters()).device
    stepper_cls = CachedStepper if decoder == "cached" else UncachedStepper

    def make_stepper(src: Tensor) -> Stepper:
        src = src.to(device)  # (B, S)
        src_mask = model.source_mask(src)
        memory = model.encode(src, src_mask)  # encoder once per batch
        return stepper_cls(model, memory, src_mask)

    return decode_batches(
        make_stepper,
        sources,
        options_within(model.config.max_positions, **options),
        batch_size=batch_size,
        pad_id=model.config.pad_id,
        bos_id=model.config.bos_id,
        eos_id=model.config.eos_id,
        device=device,
        prefixes=prefixes,
        positions=model.config.max_positions,
    )
