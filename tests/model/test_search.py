"""Greedy and beam search against hand-built log-prob tables, then on a real (random) model."""

import itertools
import math

import pytest
import torch

from model.data import pad
from model.search import CachedStepper, beam_search, generate, greedy_search
from model.transformer import BOS_ID, EOS_ID, ModelConfig, Transformer, padding_mask
from service.bundle.decoding import DecodingOptions

V = 8  # pad, bos, eos, unk, then tokens 4..7
A, B, C, D = 4, 5, 6, 7


class TableStepper:
    """Log-probs as a function of each row's prefix: {prefix tuple: {token: prob}}.

    Unlisted prefixes put all mass on </s>; unlisted tokens get a tiny probability. One table
    per live sentence; row r is sentence r // G's, with G rows per sentence, as the model's
    grouped cross-attention reads them.
    """

    def __init__(self, tables: list[dict[tuple[int, ...], dict[int, float]]]):
        # One table per sentence, one row per sentence until beam search expands them.
        self.tables = list(tables)
        self.prefixes: list[tuple[int, ...]] = [() for _ in self.tables]
        self.calls = 0

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = torch.full((len(self.prefixes), V), math.log(1e-6))
        group, rest = divmod(len(tokens), len(self.tables))
        assert rest == 0, f"{len(tokens)} rows over {len(self.tables)} sentences"
        for r, token in enumerate(tokens.tolist()):
            prefix = self.prefixes[r] if token == BOS_ID else (*self.prefixes[r], token)
            self.prefixes[r] = prefix
            for t, p in self.tables[r // group].get(prefix, {EOS_ID: 1.0}).items():
                out[r, t] = math.log(p)
        return out.log_softmax(-1)

    def select(self, rows: torch.Tensor, sentences: torch.Tensor) -> None:
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]
        self.tables = [self.tables[i] for i in sentences.tolist()]

    def reorder(self, rows: torch.Tensor) -> None:
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]


# Greedy takes A (0.6) then is stuck with </s> at 0.35: 0.21. B then </s> gives 0.4 * 0.95 = 0.38.
GARDEN_PATH = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS_ID: 0.35, C: 0.33, D: 0.32},
    (B,): {EOS_ID: 0.95, C: 0.05},
}


def test_greedy_picks_the_argmax_each_step() -> None:
    [hyp] = greedy_search(
        TableStepper([GARDEN_PATH]), [10], DecodingOptions(max_decoding_length=10)
    )
    assert hyp.ids == [A]
    assert hyp.finish_reason == "eos"
    assert hyp.score == pytest.approx(math.log(0.6 * 0.35) / 2, abs=1e-4)


def test_beam_finds_the_better_sequence_greedy_misses() -> None:
    [[best]] = beam_search(
        TableStepper([GARDEN_PATH]), [10], DecodingOptions(beam_size=2, max_decoding_length=10)
    )
    assert best.ids == [B]
    assert best.score == pytest.approx(math.log(0.4 * 0.95) / 2, abs=1e-4)
    assert best.score > math.log(0.6 * 0.35) / 2


def test_length_penalty_changes_the_winner_as_computed() -> None:
    # Short: A </s> = 0.4 (length 2). Long: B C D </s> = 0.6 * 0.55 = 0.33 (length 4).
    table = {
        (): {A: 0.4, B: 0.6},
        (A,): {EOS_ID: 1.0},
        (B,): {C: 0.55, D: 0.45},
        (B, C): {D: 1.0},
        (B, D): {C: 1.0},
        (B, C, D): {EOS_ID: 1.0},
        (B, D, C): {EOS_ID: 1.0},
    }
    short, long = math.log(0.4), math.log(0.33)
    assert short > long and short / 2 < long / 4  # the computed winners differ
    for alpha, expected in ((0.0, [A]), (1.0, [B, C, D])):
        [[best]] = beam_search(
            TableStepper([table]),
            [10],
            DecodingOptions(beam_size=2, length_penalty=alpha, max_decoding_length=10),
        )
        assert best.ids == expected
        assert best.score == pytest.approx(max(short / 2**alpha, long / 4**alpha), abs=1e-4)


def test_finish_reasons_eos_and_length() -> None:
    loop = {(): {A: 0.9}, (A,): {A: 0.9}, (A, A): {A: 0.9}, (A, A, A): {A: 0.9}}
    [hyp] = greedy_search(TableStepper([loop]), [3], DecodingOptions(max_decoding_length=3))
    assert hyp.ids == [A, A, A] and hyp.finish_reason == "length"
    [[hyp]] = beam_search(
        TableStepper([loop]), [3], DecodingOptions(beam_size=2, max_decoding_length=3)
    )
    assert hyp.finish_reason == "length" and len(hyp.ids) == 3


def test_min_decoding_length_forbids_early_eos() -> None:
    [hyp] = greedy_search(
        TableStepper([GARDEN_PATH]),
        [10],
        DecodingOptions(max_decoding_length=10, min_decoding_length=3),
    )
    assert len(hyp.ids) >= 3


def test_nbest_is_ordered_by_score() -> None:
    nbest = beam_search(
        TableStepper([GARDEN_PATH]),
        [5],
        DecodingOptions(beam_size=4, num_hypotheses=4, max_decoding_length=5),
    )[0]
    assert len(nbest) == 4
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)
    assert nbest[0].ids == [B]
    with pytest.raises(ValueError, match="num_hypotheses"):
        beam_search(
            TableStepper([GARDEN_PATH]),
            [5],
            DecodingOptions(beam_size=2, num_hypotheses=3, max_decoding_length=5),
        )


def test_finished_sentences_leave_the_batch() -> None:
    short = {(): {EOS_ID: 0.9, A: 0.1}}
    long = {(): {A: 0.9}, (A,): {A: 0.9}, (A, A): {A: 0.9}, (A, A, A): {EOS_ID: 0.9}}
    stepper = TableStepper([short, long, short])
    hyps = greedy_search(stepper, [10] * 3, DecodingOptions(max_decoding_length=10))
    assert [h.ids for h in hyps] == [[], [A, A, A], []]
    assert len(stepper.prefixes) == 1  # only the long sentence was still being decoded
    stepper = TableStepper([short, long, short])
    nbest = beam_search(stepper, [10] * 3, DecodingOptions(beam_size=2, max_decoding_length=10))
    assert [n[0].ids for n in nbest] == [[], [A, A, A], []]
    assert len(stepper.prefixes) == 2


def _random_table(seed: int, depth: int = 4) -> dict[tuple[int, ...], dict[int, float]]:
    g = torch.Generator().manual_seed(seed)
    table: dict[tuple[int, ...], dict[int, float]] = {}
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(depth):
        nxt = []
        for prefix in frontier:
            p = torch.rand(5, generator=g) + 0.05
            p = (p / p.sum()).tolist()
            table[prefix] = dict(zip([EOS_ID, A, B, C, D], p, strict=True))
            nxt += [(*prefix, t) for t in (A, B, C, D)]
        frontier = nxt
    return table


def test_beam_size_one_equals_greedy_on_random_tables() -> None:
    tables = [_random_table(s) for s in range(12)]
    greedy = greedy_search(TableStepper(tables), [6] * 12, DecodingOptions(max_decoding_length=6))
    beam = beam_search(
        TableStepper(tables), [6] * 12, DecodingOptions(beam_size=1, max_decoding_length=6)
    )
    assert [g.ids for g in greedy] == [b[0].ids for b in beam]
    assert [g.score for g in greedy] == pytest.approx([b[0].score for b in beam])


@pytest.fixture(scope="module")
def random_model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40,
        d_model=32,
        d_ff=64,
        h=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_positions=20,
        norm="pre",
    )
    return Transformer(config).eval()


SOURCES = [[5, 6, 7, EOS_ID], [], [8, EOS_ID], [9, 10, 11, 12, 13, 14, EOS_ID], [15, 16, EOS_ID]]


def test_model_beam_one_equals_greedy_and_cached_equals_uncached(random_model) -> None:
    greedy = generate(random_model, SOURCES, beam_size=1, max_decoding_length=12)
    uncached = generate(
        random_model, SOURCES, beam_size=1, max_decoding_length=12, decoder="uncached"
    )
    assert [g[0].ids for g in greedy] == [u[0].ids for u in uncached]
    # The batched beam code with K=1, through the model, picks the same tokens as greedy.
    nonempty = [s for s in SOURCES if s]
    src = pad(nonempty)
    mask = padding_mask(src)
    with torch.no_grad():
        stepper = CachedStepper(random_model, random_model.encode(src, mask), mask)
        beam = beam_search(
            stepper, [12] * len(nonempty), DecodingOptions(beam_size=1, max_decoding_length=12)
        )
    assert [b[0].ids for b in beam] == [g[0].ids for g, s in zip(greedy, SOURCES, strict=True) if s]


def test_model_beam_cached_equals_uncached_and_order_is_kept(random_model) -> None:
    cached = generate(
        random_model, SOURCES, beam_size=4, num_hypotheses=2, max_decoding_length=12, batch_size=2
    )
    uncached = generate(
        random_model,
        SOURCES,
        beam_size=4,
        num_hypotheses=2,
        max_decoding_length=12,
        decoder="uncached",
    )
    assert [[h.ids for h in n] for n in cached] == [[h.ids for h in n] for n in uncached]
    assert cached[1][0].ids == [] and cached[1][0].finish_reason == "eos"
    # Each sentence decoded alone gives the same result as in the batch (order restored).
    for source, nbest in zip(SOURCES, cached, strict=True):
        alone = generate(
            random_model, [source], beam_size=4, num_hypotheses=2, max_decoding_length=12
        )
        assert [h.ids for h in alone[0]] == [h.ids for h in nbest]


def test_each_sentence_stops_at_its_own_limit() -> None:
    """A relative limit gives each sentence its own (DecodingOptions.limit); one that reaches
    it finishes with "length" while the others go on, in greedy and beam search alike."""
    # No </s> on any path of A and B up to 4 tokens.
    loop = {p: {A: 0.6, B: 0.4} for n in range(4) for p in itertools.product((A, B), repeat=n)}
    options = DecodingOptions(max_decoding_length=4, max_length_a=1.0, max_length_b=1)
    limits = [options.limit(n) for n in (0, 1, 2, 9)]
    assert limits == [1, 2, 3, 4]  # a * L + b, within max_decoding_length
    hyps = greedy_search(TableStepper([loop] * 4), limits, options)
    assert [len(h.ids) for h in hyps] == limits
    assert {h.finish_reason for h in hyps} == {"length"}
    stepper = TableStepper([loop] * 4)
    nbest = beam_search(stepper, limits, DecodingOptions(beam_size=2, max_decoding_length=4))
    assert [len(n[0].ids) for n in nbest] == limits
    assert {h.finish_reason for n in nbest for h in n} == {"length"}


@pytest.mark.parametrize(
    ("a", "b", "minimum", "length", "limit"),
    [
        (None, 0, 0, 100, 50),  # no relative limit: max_decoding_length
        (2.0, 10, 0, 7, 24),
        (1.5, 0, 0, 3, 4),  # floor(4.5)
        (2.0, 10, 0, 40, 50),  # within max_decoding_length
        (0.0, 0, 0, 7, 1),  # at least one token
        (0.5, 0, 6, 4, 6),  # at least min_decoding_length
    ],
)
def test_the_relative_limit(a: float | None, b: int, minimum: int, length: int, limit: int) -> None:
    options = DecodingOptions(
        max_decoding_length=50, min_decoding_length=minimum, max_length_a=a, max_length_b=b
    )
    assert options.limit(length) == limit


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_length_a": -1.0}, "max_length_a"),
        ({"max_length_a": math.nan}, "max_length_a"),
        ({"max_length_a": True}, "max_length_a"),
        ({"max_length_b": -1}, "max_length_b"),
        ({"max_length_b": 1.5}, "max_length_b"),
    ],
)
def test_bad_relative_limits_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**fields)  # type: ignore[arg-type]
