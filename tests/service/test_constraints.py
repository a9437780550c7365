"""Constrained beam search (service/inference/constraints.py) on random log-prob tables: a
sentence without terms is searched exactly as without them, one with terms gets each exactly
once; and over the shipped model, a glossary that matches nothing in a sentence leaves its
search as it was."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.bundle.decoding import Constraints, DecodingOptions, Hypothesis
from service.glossaries import Entry
from service.inference.constraints import Bank
from service.inference.engine import Engine
from service.inference.search import FloatArray, IntArray, search
from service.text import pipeline, terms
from service.text.terms import Terms
from tests.service.test_decoding import BOS, EOS, NumpyState, RandomModel, top_k


class WholeState(NumpyState):
    """The random model's steps, with the whole distribution kept for `log_probs_of`."""

    def __init__(self, model: RandomModel) -> None:
        super().__init__(model)
        self.last: FloatArray = np.zeros((0, 0), np.float32)

    def step(self, tokens: IntArray, k: int) -> tuple[FloatArray, IntArray]:
        self.last = self.model.log_probs(tokens.tolist())
        return top_k(self.last, k)

    def log_probs_of(self, ids: IntArray) -> FloatArray:
        scored: FloatArray = np.take_along_axis(self.last, ids, axis=1)
        return scored


def run(
    seed: int, vocab: int, limits: list[int], opts: DecodingOptions, terms: list[Constraints] | None
) -> list[list[tuple[list[int], str, float]]]:
    state = WholeState(RandomModel(seed, vocab, len(limits)))
    found = search(state, limits, opts, bos_id=BOS, eos_id=EOS, constraints=terms)
    return [[(h.ids, h.finish_reason, h.score) for h in n] for n in found]


def count(tokens: list[int], term: tuple[int, ...]) -> int:
    n = i = 0
    while i + len(term) <= len(tokens):
        if tuple(tokens[i : i + len(term)]) == term:
            n, i = n + 1, i + len(term)
        else:
            i += 1
    return n


OPTIONS = st.builds(
    DecodingOptions,
    beam_size=st.integers(2, 5),
    length_penalty=st.sampled_from([0.0, 1.0]),
    max_decoding_length=st.integers(6, 14),
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sentences=st.integers(1, 4), opts=OPTIONS, data=st.data())
def test_sentences_without_terms_are_searched_as_without_constraints(
    seed: int, sentences: int, opts: DecodingOptions, data: st.DataObject
) -> None:
    """Whatever terms the other sentences of the search have."""
    vocab = 12
    limits = [opts.max_decoding_length] * sentences
    token = st.integers(4, vocab - 1)
    terms = [
        Constraints(tuple(data.draw(st.lists(st.tuples(token), max_size=2))))
        for _ in range(sentences)
    ]
    plain = run(seed, vocab, limits, opts, None)
    constrained = run(seed, vocab, limits, opts, terms)
    for own, without, with_ in zip(terms, plain, constrained, strict=True):
        if not own:
            assert with_ == without
    assert run(seed, vocab, limits, opts, [Constraints()] * sentences) == plain


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), opts=OPTIONS, data=st.data())
def test_each_term_appears_exactly_once(
    seed: int, opts: DecodingOptions, data: st.DataObject
) -> None:
    vocab = 40
    word = st.integers(4, vocab - 1)
    terms = data.draw(
        st.lists(st.lists(word, min_size=1, max_size=3).map(tuple), min_size=1, max_size=3)
    )
    # A term inside another cannot be held exactly once with it.
    if any(a != b and count(list(a), b) for a in terms for b in terms):
        return
    limit = sum(map(len, terms)) + opts.max_decoding_length
    (best, *_), *_ = run(seed, vocab, [limit], opts, [Constraints(tuple(terms))])
    tokens, _, _ = best
    for term in set(terms):
        assert count(tokens, term) == terms.count(term), (tokens, terms)


def test_greedy_with_terms_searches_a_beam_and_meets_them() -> None:
    opts = DecodingOptions(beam_size=1, max_decoding_length=12)
    (best,), *_ = run(3, 30, [12], opts, [Constraints(((7, 8),))])
    assert count(best[0], (7, 8)) == 1


def test_avoided_tokens_are_never_chosen_in_a_constrained_sentence() -> None:
    opts = DecodingOptions(beam_size=3, max_decoding_length=10)
    (plain,), *_ = run(5, 30, [10], opts, None)
    avoid = frozenset(plain[0][:2]) - {9}
    (best, *_), *_ = run(5, 30, [10], opts, [Constraints(((9,),), avoid)])
    assert count(best[0], (9,)) == 1 and not avoid & set(best[0])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), term=st.integers(4, 11))
def test_no_word_piece_follows_a_term(seed: int, term: int) -> None:
    """Tokens that continue a word never come right after a term (no "Leder" + "kleidung")."""
    pieces = frozenset(range(4, 12)) - {term}
    opts = DecodingOptions(beam_size=3, max_decoding_length=10)
    (best, *_), *_ = run(seed, 12, [12], opts, [Constraints(((term,),), word_pieces=pieces)])
    tokens = best[0]
    assert count(tokens, (term,)) == 1
    at = tokens.index(term)
    assert at + 1 == len(tokens) or tokens[at + 1] not in pieces


def test_beams_go_by_score_where_they_take_none_from_a_bank_that_has_begun_a_term() -> None:
    """Once the K best candidates hold the term, the step keeps them, as beam search would:
    the bank of progress 0 (beam 2, which has not written the term) is not given beams of its
    own (Post & Vilar's even shares gave it K // 2 = 2, dropping two better ones). Before that,
    the bank holding the term takes one beam, the best of it, and the rest go by score."""
    bank = Bank([Constraints(((9,),))], EOS)
    histories = {0: [9], 1: [9, 4], 2: [4]}
    # (score, beam, token): beams 0 and 1 hold the term, beam 2 does not.
    candidates = [(-1.0, 0, 4), (-1.2, 1, 5), (-1.4, 0, 5), (-1.6, 1, 6), (-3.0, 2, 5),
                  (-4.0, 2, 6), (-9.0, 2, 9)]  # fmt: skip
    scores, beams, ids = map(list, zip(*candidates, strict=True))
    chosen = bank.choose(0, 4, scores, beams, ids, histories.__getitem__)
    assert sorted(chosen) == [0, 1, 2, 3]
    # Nobody holds the term: its best candidate takes one beam, the other three go by score.
    histories = {0: [4], 1: [5], 2: [6]}
    chosen = bank.choose(0, 4, scores, beams, ids, histories.__getitem__)
    assert chosen == [6, 0, 1, 2]


def test_a_term_counts_in_its_other_spellings() -> None:
    """The model may write a term's text in other pieces (Constraints.spellings): that holds
    the term, so the hypothesis may end, and the term's own pieces after it would be a second
    one; begun in another spelling, it is no progress."""
    term, spelled = (7, 8), (7, 9, 10)
    bank = Bank([Constraints((term,), spellings=((spelled,),))], EOS)
    plain = Bank([Constraints((term,))], EOS)
    held = Hypothesis([5, 7, 9, 10], -1.0, "eos")
    assert bank.holds(0, held) and not plain.holds(0, held)
    histories = {0: [5, 7, 9, 10], 1: [5, 7, 9, 10, 7], 2: [5, 7, 9]}
    candidates = [(-1.0, 0, EOS), (-1.5, 1, 8), (-2.0, 2, 10), (-2.5, 2, 11), (-3.0, 0, 4)]
    scores, beams, ids = map(list, zip(*candidates, strict=True))
    chosen = bank.choose(0, 2, scores, beams, ids, histories.__getitem__)
    # </s> ends beam 0; 7 8 after the term is dropped; 10 meets it, 11 leaves it unbegun.
    assert chosen == [0, 2, 3]
    # Without the spelling, beam 0 may not end, and 7 8 is the term (its first).
    assert plain.choose(0, 2, scores, beams, ids, histories.__getitem__) == [1, 2]


def test_the_shipped_model_searches_sentences_no_term_matches_as_without_a_glossary(
    shipped_engine: Engine,
) -> None:
    """Over the real engine, beam 4, two hypotheses: a glossary none of whose terms is in a
    sentence leaves its search as it was, whether no sentence of the batch has a term (the
    texts are prepared as without a glossary) or another sentence of the same batch has one
    (its rows are searched with constraints, the others' with none)."""
    texts = [
        "Two dogs play in the snow.",
        "A man is riding a bike down the street.",
        "A woman reads a book in the park.",
    ]
    options = DecodingOptions(beam_size=4, num_hypotheses=2, max_decoding_length=40)

    def search(glossary: Terms | None) -> list[list[tuple[list[int], float]]]:
        prepared = pipeline.prepare(
            shipped_engine, texts, None, max_segment_characters=1000, terms=glossary
        )
        # The model's own words for a term are avoided in its sentence only: none here.
        constraints = None
        if glossary is not None:
            constraints = terms.constraints(shipped_engine, prepared.matched, lambda term: "")
        found = shipped_engine.generate(
            prepared.sources, prepared.decoding(options), constraints=constraints
        )
        return [[(h.ids, h.score) for h in hypotheses] for hypotheses in found]

    plain = search(None)
    unmatched = search(Terms([Entry("cat", "Katze"), Entry("mountain bike", "Mountainbike")]))
    assert unmatched == plain
    one = search(Terms([Entry("bike", "Rad")]))
    rad = shipped_engine.target_ids(["Rad"])[0]
    assert rad is not None and count(one[1][0][0], tuple(rad)) == 1
    for without, with_ in ((plain[0], one[0]), (plain[2], one[2])):
        assert [ids for ids, _ in with_] == [ids for ids, _ in without]
        assert [score for _, score in with_] == pytest.approx([s for _, s in without], abs=1e-5)
