"""service/inference/search.py: numpy greedy and beam search on hand-built log-prob tables, and
token for token against the torch reference (model/search.py) on random tables."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sized

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model import search as reference
from service.bundle.decoding import DecodingOptions, Hypothesis, Prefixes, StepPolicy
from service.inference.search import (
    FloatArray,
    IntArray,
    _without,
    beam_steps,
    drive,
    greedy_steps,
    search,
)

BOS, EOS = 1, 2  # the fixed special ids of model/transformer.py
V = 8  # pad, bos, eos, unk, then tokens 4..7
A, B, C, D = 4, 5, 6, 7

Table = dict[tuple[int, ...], dict[int, float]]


def top_k(log_probs: FloatArray, k: int) -> tuple[FloatArray, IntArray]:
    """`DecoderState.step`'s answer computed from a whole (R, V) table: the k largest
    log-probs of each row and their ids, best first, ties lower id first (as ONNX TopK)."""
    ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :k]  # (R, k)
    return np.take_along_axis(log_probs, ids, axis=-1), ids.astype(np.int64)


def rows_per_sentence(rows: Sized, sentences: Sized) -> int:
    """G of a state with len(rows) = N * G rows over N sentences: row r is sentence r // G's."""
    group, rest = divmod(len(rows), len(sentences))
    assert rest == 0 and group >= 1, f"{len(rows)} rows over {len(sentences)} sentences"
    return group


class TableState:
    """Log-probs as a function of each row's prefix: {prefix tuple: {token: prob}}.

    Unlisted prefixes put all mass on </s>; unlisted tokens get tiny probabilities, all
    different so that no test depends on how ties are broken. Counts the rows it is asked to
    step, so tests can see finished sentences leave the batch. Keeps one table per live
    sentence and finds a row's sentence as the graph does (rows grouped by sentence, the same
    number each), so a search that selected the wrong sentences would read the wrong table.
    """

    def __init__(self, tables: list[Table], *, aligned: bool = False) -> None:
        # One table per sentence, one row per sentence until beam search expands them.
        self.tables = list(tables)
        self.prefixes: list[tuple[int, ...]] = [() for _ in self.tables]
        self.rows_stepped: list[int] = []
        self.aligned = aligned
        self._inputs: list[int] = []

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        self.rows_stepped.append(len(tokens))
        self._inputs = tokens.tolist()
        out = np.tile(1e-6 / (1 + np.arange(V)), (len(self.prefixes), 1))  # (R, V)
        group = rows_per_sentence(tokens, self.tables)
        for r, token in enumerate(tokens.tolist()):
            prefix = self.prefixes[r] if token == BOS else (*self.prefixes[r], token)
            self.prefixes[r] = prefix
            for t, p in self.tables[r // group].get(prefix, {EOS: 1.0}).items():
                out[r, t] = p
        return top_k(np.log(out / out.sum(axis=-1, keepdims=True)).astype(np.float32), k)

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]
        self.tables = [self.tables[i] for i in sentences.tolist()]

    def reorder(self, rows: IntArray) -> None:
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]

    def alignment(self) -> FloatArray | None:
        """With `aligned`: each row "looks at" the token it was just given (one-hot over V)."""
        if not self.aligned:
            return None
        rows = np.zeros((len(self._inputs), V), np.float32)
        rows[np.arange(len(self._inputs)), self._inputs] = 1.0
        return rows


def _search(tables: list[Table], **options: object) -> list[list[Hypothesis]]:
    opts = DecodingOptions(**options)  # type: ignore[arg-type]
    state = TableState(tables)
    return search(state, [opts.max_decoding_length] * len(tables), opts, bos_id=BOS, eos_id=EOS)


# Greedy takes A (0.6) then is stuck with </s> at 0.35: 0.21. B then </s> gives 0.4 * 0.95 = 0.38.
GARDEN_PATH: Table = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.35, C: 0.33, D: 0.32},
    (B,): {EOS: 0.95, C: 0.05},
}


def test_greedy_picks_the_argmax_each_step() -> None:
    [[hyp]] = _search([GARDEN_PATH])
    assert hyp == Hypothesis([A], pytest.approx(math.log(0.6 * 0.35) / 2, abs=1e-4), "eos")


def test_beam_finds_the_better_sequence_greedy_misses() -> None:
    [[best]] = _search([GARDEN_PATH], beam_size=2)
    assert best.ids == [B] and best.finish_reason == "eos"
    assert best.score == pytest.approx(math.log(0.4 * 0.95) / 2, abs=1e-4)
    assert best.score > math.log(0.6 * 0.35) / 2


def test_length_penalty_changes_the_winner_as_computed() -> None:
    # Short: A </s> = 0.4 (length 2). Long: B C D </s> = 0.6 * 0.55 = 0.33 (length 4).
    table: Table = {
        (): {A: 0.4, B: 0.6},
        (A,): {EOS: 1.0},
        (B,): {C: 0.55, D: 0.45},
        (B, C): {D: 1.0},
        (B, D): {C: 1.0},
        (B, C, D): {EOS: 1.0},
        (B, D, C): {EOS: 1.0},
    }
    short, long = math.log(0.4), math.log(0.33)
    assert short > long and short / 2 < long / 4  # the computed winners differ
    for alpha, expected in ((0.0, [A]), (1.0, [B, C, D])):
        [[best]] = _search([table], beam_size=2, length_penalty=alpha)
        assert best.ids == expected
        assert best.score == pytest.approx(max(short / 2**alpha, long / 4**alpha), abs=1e-4)


# Every prefix of A and C up to length 3 continues (A 0.9, C 0.1); </s> after 4 tokens.
LOOP: Table = {
    prefix: {A: 0.9, C: 0.1} for n in range(4) for prefix in itertools.product((A, C), repeat=n)
}


@pytest.mark.parametrize("beam_size", [1, 2])
def test_finish_reason_length_at_max_decoding_length(beam_size: int) -> None:
    [[hyp]] = _search([LOOP], beam_size=beam_size, max_decoding_length=3)
    assert hyp.ids == [A, A, A] and hyp.finish_reason == "length"
    # Normalized by the 3 tokens (no </s> was emitted).
    assert hyp.score == pytest.approx(3 * math.log(0.9) / 3, abs=1e-4)


def test_finish_reason_eos_when_the_end_token_wins() -> None:
    [[hyp]] = _search([LOOP], max_decoding_length=10)
    assert hyp.ids == [A, A, A, A] and hyp.finish_reason == "eos"
    assert hyp.score == pytest.approx(4 * math.log(0.9) / 5, abs=1e-4)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_min_decoding_length_forbids_early_eos(beam_size: int) -> None:
    [[hyp]] = _search([GARDEN_PATH], beam_size=beam_size, min_decoding_length=3)
    assert len(hyp.ids) >= 3 and hyp.finish_reason == "eos"


def test_nbest_is_ordered_by_score() -> None:
    [nbest] = _search([GARDEN_PATH], beam_size=4, num_hypotheses=4, max_decoding_length=5)
    assert len(nbest) == 4
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)
    assert nbest[0].ids == [B]


@pytest.mark.parametrize(
    ("beam_size", "rows_stepped"),
    [
        # Greedy: the short sentences end at step 0, the long one runs 4 steps alone.
        (1, [3, 1, 1, 1]),
        # Beam 2: step 0 runs one row per sentence, then each has 2. A short sentence needs 2
        # finished hypotheses ([] at step 0, [A] and a filler's at step 1), then its rows
        # leave; the long one's 2 beams run on.
        (2, [3, 6, 2, 2]),
    ],
)
def test_finished_sentences_leave_the_batch(beam_size: int, rows_stepped: list[int]) -> None:
    short: Table = {(): {EOS: 0.8, A: 0.2}}
    # Every prefix of A and B up to length 3 continues; </s> after 3 tokens.
    long: Table = {(): {A: 0.5, B: 0.5}}
    for prefix in ((A,), (B,), (A, A), (A, B), (B, A), (B, B)):
        long[prefix] = {A: 0.5, B: 0.5}
    state = TableState([short, long, short])
    opts = DecodingOptions(beam_size=beam_size, max_decoding_length=10)
    nbest = search(state, [10] * 3, opts, bos_id=BOS, eos_id=EOS)
    assert [n[0].ids for n in nbest[::2]] == [[], []]
    assert len(nbest[1][0].ids) == 3 and nbest[1][0].finish_reason == "eos"
    assert state.rows_stepped == rows_stepped


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("beam_size", [1, 2])
@pytest.mark.parametrize("late_after", [0, 2])
def test_a_sentence_past_its_deadline_leaves_at_the_next_step(
    beam_size: int, late_after: int, aligned: bool
) -> None:
    """The deadline is read before every step: a sentence past it leaves its batch there with
    one "deadline" hypothesis, and the others decode as they would without it."""
    long: Table = {(): {A: 0.5, B: 0.5}}
    for prefix in itertools.product((A, B), repeat=1):
        long[prefix] = {A: 0.5, B: 0.5}
    for prefix in itertools.product((A, B), repeat=2):
        long[prefix] = {A: 0.4, B: 0.6}
    tables = [long, long, long]
    opts = DecodingOptions(beam_size=beam_size, max_decoding_length=6)
    alone = search(TableState(tables, aligned=aligned), [6] * 3, opts, bos_id=BOS, eos_id=EOS)
    state = TableState(tables, aligned=aligned)

    def deadline(sentence: int) -> float:
        # Sentence 1 is past its deadline once `late_after` steps have run.
        return -math.inf if sentence == 1 and len(state.rows_stepped) >= late_after else math.inf

    nbest = search(state, [6] * 3, opts, bos_id=BOS, eos_id=EOS, deadline=deadline)
    [stopped] = nbest[1]
    assert stopped.finish_reason == "deadline" and len(stopped.ids) == late_after
    assert [nbest[0], nbest[2]] == [alone[0], alone[2]]
    for i in (0, 2):  # their alignment rows too (not part of Hypothesis equality)
        for ours, theirs in zip(nbest[i], alone[i], strict=True):
            assert (ours.alignment is None) == (not aligned)
            if aligned:
                assert np.array_equal(ours.alignment, theirs.alignment)
    beams = 1 if late_after == 0 else beam_size  # rows per sentence at that step
    assert state.rows_stepped[late_after] == 2 * beams  # the other two alone from then on


@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_each_hypothesis_carries_its_own_steps_alignment(beam_size: int) -> None:
    """Through reordering, expansion, finished rows and rows leaving: a hypothesis's alignment
    has a row for every step it ran, its tokens' and, when it ended with </s>, that step's; row
    t is what the row that chose token t looked at (here: the token it was given)."""
    short: Table = {(): {EOS: 0.6, A: 0.4}, (A,): {EOS: 0.9, B: 0.1}}
    long: Table = {(): {A: 0.5, B: 0.5}}
    for prefix in ((A,), (B,), (A, A), (A, B), (B, A), (B, B)):
        long[prefix] = {A: 0.45, B: 0.55} if len(prefix) == 1 else {A: 0.3, C: 0.7}
    state = TableState([long, short, long], aligned=True)
    opts = DecodingOptions(beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=4)
    for nbest in search(state, [4] * 3, opts, bos_id=BOS, eos_id=EOS):
        for hypothesis in nbest:
            assert hypothesis.alignment is not None
            steps = len(hypothesis.ids) + (hypothesis.finish_reason == "eos")
            assert hypothesis.alignment.shape == (steps, V)
            given = [BOS, *hypothesis.ids]
            assert hypothesis.alignment.argmax(axis=1).tolist() == given[:steps]


def test_the_state_arrays_are_not_modified_by_the_search() -> None:
    """min_decoding_length forbids </s> on copies: a state may hand out its own arrays."""
    table = np.log(np.full((2, V), 1 / V, dtype=np.float32))  # enough rows for 2 beams
    top_log_probs, top_ids = top_k(table, V)
    saved = top_log_probs.copy(), top_ids.copy()

    class Constant:
        def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
            return top_log_probs[: len(tokens), :k], top_ids[: len(tokens), :k]  # views

        def select(self, rows: IntArray, sentences: IntArray) -> None: ...

        def reorder(self, rows: IntArray) -> None: ...

        def alignment(self) -> None:
            return None

    for beam_size in (1, 2):
        opts = DecodingOptions(beam_size=beam_size, max_decoding_length=3, min_decoding_length=2)
        search(Constant(), [3], opts, bos_id=BOS, eos_id=EOS)
        assert np.array_equal(top_log_probs, saved[0]) and np.array_equal(top_ids, saved[1])


def test_the_policy_bans_eos_until_the_minimum_and_normalizes_by_length() -> None:
    policy = StepPolicy(DecodingOptions(min_decoding_length=2, length_penalty=0.5), eos_id=EOS)
    never = lambda row: pytest.fail("no history is read without no_repeat_ngram_size")  # noqa: E731
    assert [policy.bans(step, 2, never) for step in range(4)] == [[(EOS,)] * 2] * 2 + [[()] * 2] * 2
    assert policy.normalized(-6.0, 9) == pytest.approx(-2.0)


@pytest.mark.parametrize(
    ("n", "history", "banned"),
    [
        (2, [A, B, A], (B,)),  # "A B" seen: B may not follow A again
        (2, [A, B, A, C, A], (B, C)),
        (2, [A, B, C], ()),  # C never came before
        (3, [A, B, C, A, B], (C,)),
        (3, [A, B, C, A], ()),  # one token of the key only
        (1, [A, C, A], (A, C)),  # no token twice
        (2, [], ()),
    ],
)
def test_no_repeat_ngram_bans_what_would_repeat_an_ngram(
    n: int, history: list[int], banned: tuple[int, ...]
) -> None:
    policy = StepPolicy(DecodingOptions(no_repeat_ngram_size=n, min_decoding_length=1), eos_id=EOS)
    histories = [history, []]
    assert policy.bans(0, 2, histories.__getitem__) == [(EOS, *banned), (EOS,)]
    assert policy.bans(1, 2, histories.__getitem__)[0] == banned


def test_a_sentence_ending_at_its_own_limit_is_scored_by_its_own_length() -> None:
    """Two sentences, limits 1 and 3, beam 2, 2-best: each "length" hypothesis is normalised
    by its own sentence's limit and ranks among the </s> ones by that score."""
    # </s> first or never: only the first step can end a hypothesis with </s>.
    table: Table = {(): {A: 0.6, EOS: 0.4}}
    for prefix in ((A,), (A, A), (A, B)):
        table[prefix] = {A: 0.9, B: 0.1}
    opts = DecodingOptions(beam_size=2, num_hypotheses=2, max_decoding_length=3)
    short, long = search(TableState([table, table]), [1, 3], opts, bos_id=BOS, eos_id=EOS)
    log = math.log
    assert [(h.ids, h.finish_reason) for h in short] == [([A], "length"), ([], "eos")]
    assert [h.score for h in short] == pytest.approx([log(0.6) / 1, log(0.4) / 1], abs=1e-5)
    assert [(h.ids, h.finish_reason) for h in long] == [([A, A, A], "length"), ([], "eos")]
    assert [h.score for h in long] == pytest.approx(
        [(log(0.6) + 2 * log(0.9)) / 3, log(0.4)], abs=1e-5
    )


@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_repeat_ngram_size_keeps_a_looping_model_from_looping(beam_size: int) -> None:
    """A model that would say A B A B ... says each bigram once, in both searches alike."""
    loop: Table = {}
    for prefix in itertools.chain.from_iterable(
        itertools.product((A, B, C, D), repeat=n) for n in range(6)
    ):
        last = prefix[-1] if prefix else B
        loop[prefix] = (
            {A: 0.5, C: 0.3, D: 0.15, EOS: 0.05}
            if last == B
            else {B: 0.6, C: 0.2, D: 0.15, EOS: 0.05}
        )
    free = _search([loop], beam_size=beam_size, max_decoding_length=6)[0][0]
    assert free.ids == [A, B, A, B, A, B]
    [[hypothesis]] = _search(
        [loop], beam_size=beam_size, max_decoding_length=6, no_repeat_ngram_size=2
    )
    bigrams = list(zip(hypothesis.ids, hypothesis.ids[1:], strict=False))
    assert len(bigrams) == len(set(bigrams)) == 5  # six tokens, no bigram twice
    if beam_size == 1:
        assert hypothesis.ids[:4] == [A, B, A, C]  # B A once, then not A B again


def test_banned_tokens_leave_the_candidates_in_order() -> None:
    """A row drops the banned tokens it holds, then its worst candidates: one column fewer per
    banned token, whichever of them it holds."""
    ids = np.array([[5, 2, 7, 9], [3, 4, 6, 8]], dtype=np.int64)
    log_probs = -np.arange(8, dtype=np.float32).reshape(2, 4)
    kept_log_probs, kept_ids = _without(log_probs, ids, [(2, 9)] * 2)
    assert kept_ids.tolist() == [[5, 7], [3, 4]]
    assert kept_log_probs.tolist() == [[0.0, -2.0], [-4.0, -5.0]]
    assert _without(log_probs, ids, [(), ()])[1] is ids
    # Rows with bans of their own: as many columns fewer as the fewest any row bans, a row
    # that bans more ending with a banned one at -inf (it keeps every one it may choose).
    kept_log_probs, kept_ids = _without(log_probs, ids, [(7,), (4, 6)])
    assert kept_ids.tolist() == [[5, 2, 9], [3, 8, 4]]
    assert kept_log_probs.tolist() == [[0.0, -1.0, -3.0], [-4.0, -7.0, -np.inf]]


def test_top_k_is_best_first_with_ties_to_the_lower_id() -> None:
    table = np.log(np.array([[0.1, 0.3, 0.1, 0.3, 0.2], [0.2] * 5], dtype=np.float32))
    values, ids = top_k(table, 3)
    assert ids.tolist() == [[1, 3, 4], [0, 1, 2]]
    assert np.array_equal(values, np.take_along_axis(table, ids, axis=-1))
    assert top_k(table, 9)[1].shape == (2, 5)  # never more than the vocabulary


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"beam_size": 0}, "beam_size"),
        ({"beam_size": 2.0}, "beam_size must be an integer"),
        ({"beam_size": 2, "num_hypotheses": 3}, r"num_hypotheses must be between 1 and beam_size"),
        ({"num_hypotheses": 0}, "num_hypotheses"),
        ({"max_decoding_length": 0}, "max_decoding_length"),
        ({"max_decoding_length": 5, "min_decoding_length": 6}, "min_decoding_length"),
        ({"min_decoding_length": -1}, "min_decoding_length"),
        ({"length_penalty": math.nan}, "length_penalty"),
        ({"max_decoding_length": True}, "max_decoding_length must be an integer"),
    ],
)
def test_options_are_validated(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**options)  # type: ignore[arg-type]


def test_options_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        DecodingOptions(4)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        DecodingOptions().beam_size = 2  # type: ignore[misc]


# --- Against the torch reference on random log-probs -------------------------------------------


class RandomModel:
    """Log-probs as a deterministic pseudo-random function of (sentence, prefix), with </s>
    made likelier as the prefix grows so that hypotheses end at varied lengths. The same
    function feeds a numpy state and a torch stepper, so the searches see equal inputs."""

    def __init__(self, seed: int, vocab: int, sentences: int) -> None:
        self.seed, self.vocab = seed, vocab
        self.sentence = list(range(sentences))  # of each live sentence
        self.prefixes: list[tuple[int, ...]] = [() for _ in self.sentence]  # of each row

    def log_probs(self, tokens: list[int]) -> FloatArray:
        out = np.empty((len(tokens), self.vocab), dtype=np.float32)
        group = rows_per_sentence(tokens, self.sentence)
        for r, token in enumerate(tokens):
            prefix = self.prefixes[r] if token == BOS else (*self.prefixes[r], token)
            self.prefixes[r] = prefix
            rng = np.random.default_rng([self.seed, self.sentence[r // group], *prefix])
            logits = rng.normal(size=self.vocab) * 2
            logits[EOS] += len(prefix) - 2
            out[r] = logits - np.logaddexp.reduce(logits)
        return out

    def keep(self, rows: list[int], sentences: list[int] | None = None) -> None:
        self.prefixes = [self.prefixes[i] for i in rows]
        if sentences is not None:
            self.sentence = [self.sentence[i] for i in sentences]


class NumpyState:
    def __init__(self, model: RandomModel) -> None:
        self.model = model

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        return top_k(self.model.log_probs(tokens.tolist()), k)

    def select(self, rows: IntArray, sentences: IntArray) -> None:
        self.model.keep(rows.tolist(), sentences.tolist())

    def reorder(self, rows: IntArray) -> None:
        self.model.keep(rows.tolist())

    def alignment(self) -> None:
        return None


class TorchStepper:
    def __init__(self, model: RandomModel) -> None:
        self.model = model

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.model.log_probs(tokens.tolist()))

    def select(self, rows: torch.Tensor, sentences: torch.Tensor) -> None:
        self.model.keep(rows.tolist(), sentences.tolist())

    def reorder(self, rows: torch.Tensor) -> None:
        self.model.keep(rows.tolist())


def _reference(
    seed: int, vocab: int, limits: list[int], opts: DecodingOptions, prefixes: Prefixes
) -> list[list[Hypothesis]]:
    stepper = TorchStepper(RandomModel(seed, vocab, len(limits)))
    if opts.beam_size == 1:
        return [[h] for h in reference.greedy_search(stepper, limits, opts, prefixes=prefixes)]
    return reference.beam_search(stepper, limits, opts, prefixes=prefixes)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(5, 12),
    sentences=st.integers(1, 4),
    beam_size=st.integers(1, 4),
    data=st.data(),
)
def test_numpy_search_equals_the_torch_reference(
    seed: int, vocab: int, sentences: int, beam_size: int, data: st.DataObject
) -> None:
    max_length = data.draw(st.integers(1, 8), "max_decoding_length")
    opts = DecodingOptions(
        beam_size=beam_size,
        num_hypotheses=data.draw(st.integers(1, beam_size), "num_hypotheses"),
        length_penalty=data.draw(st.sampled_from([0.0, 0.6, 1.0, 1.7]), "length_penalty"),
        max_decoding_length=max_length,
        min_decoding_length=data.draw(st.integers(0, max_length), "min_decoding_length"),
        max_length_a=data.draw(st.sampled_from([None, 0.0, 0.5, 1.0, 2.0]), "max_length_a"),
        max_length_b=data.draw(st.integers(0, 3), "max_length_b"),
        # 1 can ban a small vocabulary whole; real ones are larger than any output.
        no_repeat_ngram_size=data.draw(st.sampled_from([0, 2, 3]), "no_repeat_ngram_size"),
    )
    # Each sentence's own limit, from a source length (DecodingOptions.limit), and its decoder
    # prefix (a multilingual model's target token; none, one or two tokens here).
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=sentences, max_size=sentences))
    tokens = st.integers(0, vocab - 1).filter(lambda t: t != EOS)
    prefixes = Prefixes(
        data.draw(st.lists(st.lists(tokens, max_size=2), min_size=sentences, max_size=sentences))
    )
    limits = prefixes.limits([opts.limit(n) for n in lengths])
    state = NumpyState(RandomModel(seed, vocab, sentences))
    ours = search(state, limits, opts, bos_id=BOS, eos_id=EOS, prefixes=prefixes)
    expected = _reference(seed, vocab, limits, opts, prefixes)
    for n, limit, prefix in zip(ours, limits, prefixes.prefixes, strict=True):
        assert all(len(h.ids) <= limit for h in n)
        assert all(h.ids[: len(prefix)] == prefix[: len(h.ids)] for h in n)  # forced
    assert [[(h.ids, h.finish_reason) for h in n] for n in ours] == [
        [(h.ids, h.finish_reason) for h in n] for n in expected
    ]
    for n, m in zip(ours, expected, strict=True):
        assert [h.score for h in n] == pytest.approx([h.score for h in m], abs=1e-4)


def test_beam_size_one_equals_greedy() -> None:
    opts = DecodingOptions(max_decoding_length=8)
    limits = [8] * 6
    states = NumpyState(RandomModel(7, 10, 6)), NumpyState(RandomModel(7, 10, 6))
    greedy = drive(greedy_steps(states[0], limits, opts, bos_id=BOS, eos_id=EOS), states[0])
    beam = drive(beam_steps(states[1], limits, opts, bos_id=BOS, eos_id=EOS), states[1])
    assert [g.ids for g in greedy] == [b[0].ids for b in beam]
    assert [g.score for g in greedy] == pytest.approx([b[0].score for b in beam])
