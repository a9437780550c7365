"""Word alignments: the decoder step's alignment output carried per hypothesis through beam
search and batching (against the torch model's teacher-forced attention), the links read from
it, and the character map markup is re-placed through."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx.utils import Extractor

from export.onnx_export import export_bundle
from model.transformer import CONFIG_FILE, Transformer, load_model
from service.bundle.decoding import DecodingOptions, Hypothesis
from service.bundle.manifest import (
    ALIGNMENT,
    ALIGNMENT_WANTED,
    DECODER_STEP_FILE,
    AlignmentSpec,
    DecoderCache,
)
from service.bundle.tokenizer import token_words
from service.inference.engine import Engine, _aligned
from service.text.alignment import (
    SentenceAlignment,
    TextAlignment,
    lexical_only,
    links,
    sentence_alignment,
)
from tests.service.helpers import alignment_runs, without_alignment

SENTENCES = [
    "A man in a blue shirt is playing the guitar.",
    "Two dogs run.",
    "A little girl climbs into a wooden playhouse near the big tree in the park.",
    "",
    "People.",
]


@functools.cache
def _model(checkpoint: Path) -> Transformer:
    return load_model(checkpoint).eval()


def torch_alignment(checkpoint: Path, source: list[int], ids: list[int]) -> np.ndarray:
    """The model's own alignment for a finished hypothesis, teacher-forced: row t is the
    position that chose ids[t]."""
    model = _model(checkpoint)
    with torch.no_grad():
        _, weights = model.forward_aligned(
            torch.tensor([source]), torch.tensor([[model.config.bos_id, *ids]])
        )
    return weights[0, : len(ids)].numpy()


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_every_hypothesis_carries_the_alignment_the_model_computes(
    fp32_bundle: Path, tiny_checkpoint: Path, beam_size: int, padded: bool
) -> None:
    """Through beam reordering, finished rows leaving (compact) or staying (padded), and a
    batch of different lengths: each hypothesis's rows are its own steps' attention."""
    engine = Engine.load(fp32_bundle, device="cpu", padded=padded, max_batch_size=3)
    sources = engine.encode(SENTENCES)
    options = DecodingOptions(
        beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=20, alignments=True
    )
    for source, hypotheses in zip(sources, engine.generate(sources, options), strict=True):
        if not source:  # nothing to translate: no model call, nothing to align
            assert [(h.ids, h.alignment) for h in hypotheses] == [([], None)]
            continue
        for hypothesis in hypotheses:
            assert hypothesis.alignment is not None
            assert hypothesis.alignment.shape == (len(hypothesis.ids), len(source))
            if not hypothesis.ids:
                continue
            expected = torch_alignment(tiny_checkpoint, source, hypothesis.ids)
            np.testing.assert_allclose(hypothesis.alignment, expected, atol=2e-5)


@pytest.fixture(scope="module")
def head_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with one head of its first layer as the alignment head (as guided
    alignment leaves a model), and its bundle beside it."""
    out = tmp_path_factory.mktemp("head_checkpoint")
    shutil.copytree(tiny_checkpoint, out, dirs_exist_ok=True)
    config = json.loads((out / CONFIG_FILE).read_text())
    config["model"].update(alignment_layer=0, alignment_head=1)
    (out / CONFIG_FILE).write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("cache", ["indirection", "gather"])
def test_an_alignment_head_is_exported_and_carried(
    head_checkpoint: Path, tmp_path: Path, cache: DecoderCache
) -> None:
    bundle = tmp_path / "bundle"
    export_bundle(head_checkpoint, bundle, cache=cache)
    engine = Engine.load(bundle, device="cpu")
    assert engine.manifest.alignment == AlignmentSpec(layer=0, head=1)
    sources = engine.encode(SENTENCES[:3])
    options = DecodingOptions(beam_size=3, max_decoding_length=12, alignments=True)
    nbest = engine.generate(sources, options)
    for source, (best,) in zip(sources, nbest, strict=True):
        expected = torch_alignment(head_checkpoint, source, best.ids)
        np.testing.assert_allclose(best.alignment, expected, atol=2e-5)


@pytest.mark.parametrize("name", ["gather_bundle", "int8_bundle", "fp16_bundle"])
def test_every_bundle_kind_aligns(name: str, request: pytest.FixtureRequest) -> None:
    engine = Engine.load(request.getfixturevalue(name), device="cpu")
    (source,) = engine.encode(SENTENCES[:1])
    options = DecodingOptions(beam_size=2, max_decoding_length=12, alignments=True)
    (best,) = engine.generate([source], options)[0]
    assert best.alignment is not None and best.alignment.shape == (len(best.ids), len(source))
    np.testing.assert_allclose(best.alignment.sum(axis=1), 1.0, atol=2e-3)  # distributions


@pytest.mark.parametrize("name", ["fp32_bundle", "int8_bundle", "fp16_bundle", "gather_bundle"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_step_computes_the_alignment_only_when_asked(
    name: str, beam_size: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain text asks for no alignment: its steps skip the aligner's nodes (the If on
    alignment_wanted; the CUDA graph has none and computes the alignment at every step) and
    bind no alignment output, and translate exactly as with it."""
    engine = Engine.load(request.getfixturevalue(name), device="cpu")
    gated = engine.manifest.decoder_cache == "indirection"
    assert (ALIGNMENT_WANTED in engine.manifest.decoder_step.input_names) == gated
    outputs = 3 + 2 * engine.manifest.model.decoder_layers  # log-probs, top k, the caches
    sources = engine.encode(SENTENCES)
    runs = alignment_runs(monkeypatch)
    results = {}
    for aligned in (False, True):
        runs.clear()
        options = DecodingOptions(
            beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=12,
            alignments=aligned,
        )  # fmt: skip
        results[aligned] = engine.generate(sources, options)
        assert runs and all(gate == (aligned if gated else None) for gate, _ in runs)
        bound = outputs + (aligned or not gated)
        assert all(count == bound for _, count in runs)
        for source, hypotheses in zip(sources, results[aligned], strict=True):
            assert all((h.alignment is not None) == (aligned and bool(source)) for h in hypotheses)
    for plain, aligned in zip(results[False], results[True], strict=True):
        assert [h.ids for h in plain] == [h.ids for h in aligned]
        assert [h.score for h in plain] == pytest.approx([h.score for h in aligned], abs=1e-5)


def test_the_alignment_nodes_run_inside_an_if_on_the_cpu_graph(fp32_bundle: Path) -> None:
    """Nothing outside the If computes for the alignment alone: without it, the graph's
    outputs but the alignment need every other node."""
    step = onnx.load(str(fp32_bundle / DECODER_STEP_FILE))
    [gate] = [n for n in step.graph.node if ALIGNMENT in n.output]
    assert gate.op_type == "If" and list(gate.input) == [ALIGNMENT_WANTED]
    then_branch = next(a.g for a in gate.attribute if a.name == "then_branch")
    assert any(n.op_type == "Softmax" for n in then_branch.node)
    others = [o.name for o in step.graph.output if o.name != ALIGNMENT]
    inputs = [i.name for i in step.graph.input if i.name != ALIGNMENT_WANTED]
    needed = Extractor(step).extract_model(inputs, others)
    assert len(needed.graph.node) == len(step.graph.node) - 1  # all but the If


def test_a_bundle_exported_before_alignments_loads_and_translates(
    fp32_bundle: Path, tmp_path: Path
) -> None:
    """Its decoder step has no alignment output and its manifest no alignment entry."""
    old = without_alignment(fp32_bundle, tmp_path / "old")
    engine = Engine.load(old, device="cpu")
    assert not engine.aligns
    new = Engine.load(fp32_bundle, device="cpu")
    sources = engine.encode(SENTENCES[:3])
    options = DecodingOptions(beam_size=2, max_decoding_length=15, alignments=True)
    for before, after in zip(
        engine.generate(sources, options), new.generate(sources, options), strict=True
    ):
        assert [h.ids for h in before] == [h.ids for h in after]
        assert all(h.alignment is None for h in before)


def test_links_take_each_source_tokens_most_attending_target_token() -> None:
    weights = np.array(
        [
            [0.7, 0.2, 0.1, 0.0],  # target 0 looks at source 0
            [0.1, 0.1, 0.7, 0.4],  # target 1 at source 2, and most of all targets at source 3
            [0.0, 0.3, 0.6, 0.1],  # target 2 at source 2, but target 1 looks at it more
        ],
        np.float32,
    )
    assert links(weights) == [(0, 0), (1, 2), (2, 1), (3, 1)]
    assert links(np.zeros((0, 3), np.float32)) == []


def test_a_word_links_to_a_word_not_to_the_full_stop_that_looks_at_it() -> None:
    """The row that reads "." looks back at "bike" more than "Fahrrad"'s row does: a word
    still goes to the best word, and the full stop to the full stop."""
    # "a bike." -> "ein Fahrrad.": source tokens a, bike, "."; target ein, Fahrrad, "."; </s>.
    weights = np.array(
        [
            [0.9, 0.05, 0.05, 0.0],  # ein -> a
            [0.1, 0.40, 0.30, 0.2],  # Fahrrad -> bike, weakly
            [0.0, 0.55, 0.45, 0.0],  # "." -> bike, more than Fahrrad does
        ],
        np.float32,
    )
    source, target = "a bike.", "ein Fahrrad."
    source_tokens, target_tokens = [(0, 1), (2, 6), (6, 7)], [(0, 3), (4, 11), (11, 12)]
    assert links(weights[:, :3]) == [(0, 0), (1, 2), (2, 2)]  # read raw: bike -> "."
    aligned = sentence_alignment(source, target, source_tokens, target_tokens, weights)
    assert aligned.pairs == [(0, 0), (1, 1), (2, 2)]
    assert aligned.strong == [True, True, True]
    assert aligned.weights is not None and aligned.weights.tolist() == weights[:, :3].tolist()
    text = TextAlignment([(0, 0, aligned)])
    assert text.span(2, 7) == (4, 11)  # <b>bike.</b> -> <b>Fahrrad</b>.
    # A translation of punctuation alone: the words keep their links there.
    only = lexical_only(weights[:1, :3], source, "…", source_tokens, [(0, 1)])
    assert only.tolist() == weights[:1, :3].tolist()


def test_a_sentence_drops_the_target_token_and_eos_columns() -> None:
    # One column for a multi-target model's language token, two tokens, </s>.
    weights = np.array([[0.1, 0.1, 0.7, 0.1], [0.1, 0.8, 0.05, 0.05]], np.float32)
    aligned = sentence_alignment("ab cd", "xy", [(0, 2), (3, 5)], [(0, 1), (1, 2)], weights)
    assert aligned.pairs == [(0, 1), (1, 0)]
    assert aligned.weights is not None  # what return_alignments answers: the tokens' columns
    assert aligned.weights.tolist() == weights[:, 1:3].tolist()


def test_words_widen_tokens_and_drop_their_edge_punctuation() -> None:
    sentence = SentenceAlignment(
        source="blue shirt,",
        target="blauen Hemd,",
        source_tokens=[(0, 2), (2, 4), (5, 10), (10, 11)],
        target_tokens=[(0, 4), (4, 6), (7, 11), (11, 12)],
        pairs=[(0, 1), (2, 2), (3, 3)],
        strong=[True, True, False],
    )
    assert sentence.words() == [
        ((0, 4), (0, 6), True, True),
        ((5, 10), (7, 11), True, True),
        ((10, 11), (11, 12), False, False),  # "," is no word: not lexical
    ]


def test_a_tags_punctuation_does_not_stretch_it_to_where_the_punctuation_went() -> None:
    """In "<b>people.</b>" the full stop links to the translation's last one; the tag follows its
    word's lexical link, strong or weak, not the strong link of its punctuation."""
    sentence = SentenceAlignment(
        source="people. x",
        target="Menschen spielen Musik.",
        source_tokens=[(0, 6), (6, 7), (8, 9)],
        target_tokens=[(0, 8), (9, 16), (17, 22), (22, 23)],
        pairs=[(0, 0), (1, 3), (2, 1)],
        strong=[False, True, True],
    )
    text = TextAlignment([(0, 0, sentence)])
    assert text.span(0, 7) == (0, 8)  # people. -> Menschen, not "Menschen spielen Musik."
    assert text.span(6, 7) == (22, 23)  # the full stop alone still goes where its link does


def test_span_covers_the_linked_words_and_point_follows_the_word_before() -> None:
    # "a blue shirt" -> "ein Hemd blau": blue -> blau, shirt -> Hemd, a -> ein.
    sentence = SentenceAlignment(
        source="a blue shirt",
        target="ein Hemd blau",
        source_tokens=[(0, 1), (2, 6), (7, 12)],
        target_tokens=[(0, 3), (4, 8), (9, 13)],
        pairs=[(0, 0), (1, 2), (2, 1)],
        strong=[True, True, True],
    )
    text = TextAlignment([(4, 6, sentence)])  # placed after "Hi. " / "Hallo."
    assert text.span(4 + 2, 4 + 6) == (6 + 9, 6 + 13)  # blue -> blau
    assert text.span(4 + 2, 4 + 12) == (6 + 4, 6 + 13)  # blue shirt -> Hemd blau
    assert text.span(0, 3) is None  # nothing linked there
    assert text.point(4 + 6) == 6 + 13  # after "blue": after "blau"
    assert text.point(4 + 12) == 6 + 8  # after "shirt": after "Hemd"
    assert text.point(0) == 6 + 0  # before everything: before the first word's target


def test_point_between_two_sentences_is_between_their_translations() -> None:
    """Not before the earlier one's period, which links to nothing: something at the later
    sentence's start goes at its translation's start, something after the earlier one's
    period after the earlier translation's."""

    def sentence(source: str, target: str) -> SentenceAlignment:
        words = [(m.start(), m.end()) for m in re.finditer(r"\w+|\.", source)]
        targets = [(m.start(), m.end()) for m in re.finditer(r"\w+|\.", target)]
        pairs = [(i, i) for i in range(len(words) - 1)]  # the period: unlinked
        return SentenceAlignment(source, target, words, targets, pairs, [True] * len(pairs))

    # "A dog runs. A cat sleeps." -> "Ein Hund rennt. Eine Katze schläft."
    text = TextAlignment(
        [
            (0, 0, sentence("A dog runs.", "Ein Hund rennt.")),
            (12, 16, sentence("A cat sleeps.", "Eine Katze schläft.")),
        ]
    )
    assert text.point(12) == 16  # "runs. {x}A cat": "rennt. {x}Eine Katze"
    assert text.point(11) == 15  # "runs.{x} A cat": "rennt.{x} Eine Katze"
    assert text.point(10) == 14  # "runs{x}.": after "rennt", as before
    assert text.point(25) == 35  # after the last period: at the end


def test_token_words_read_each_tokens_first_character_past_its_word_boundary() -> None:
    # Byte-level BPE spans start at the space before a word ("Ġyoung" covers " young").
    text = "Two young, men"
    spans = [(0, 3), (3, 9), (9, 10), (10, 11), (10, 14)]
    assert token_words(text, spans) == [0, 1, 1, None, 2]


def test_the_shipped_tokenizers_spans_are_its_tokens_characters(shipped_bundle: Path) -> None:
    engine = Engine.load(shipped_bundle, device="cpu")
    text = "A man\x07 in a blue shirt, isn't he?  Über 3€"
    (spans,) = engine.source_spans([text])
    (ids,) = engine.encode([text])
    assert len(spans) == len(ids) - 1  # </s> has no characters
    pieces = [text[a:b] for a, b in spans]
    assert pieces[:4] == ["A", "man", "in", "a"]  # the bell is dropped, offsets still hold
    assert pieces[-3:] == ["€"] * 3  # one character, three byte tokens
    joined = "".join(text[a:b] for a, b in dict.fromkeys(spans))
    assert joined == text.replace(" ", "").replace("\x07", "")
    translation = "Ein Mann im blauen Hemd, nicht wahr? Über 3€"
    (target_ids,) = engine.encode([translation])
    target_ids = target_ids[:-1]
    decoded = engine.decode(target_ids)
    target = [decoded[a:b] for a, b in engine.target_spans(target_ids)]
    assert target[:4] == ["Ein", "Mann", "im", "blauen"]
    assert "".join(target) == decoded.replace(" ", "")


def test_a_weak_link_does_not_stretch_a_tag_unless_it_is_all_there_is() -> None:
    """ "woman is" -> "Frau sitzt": "is" weakly attended by "sitzt" covers only "Frau"; "is"
    alone still lands on "sitzt"."""
    weights = np.array([[0.9, 0.05, 0.05], [0.1, 0.2, 0.7]], np.float32)  # (targets, sources+</s>)
    sentence = sentence_alignment(
        "woman is", "Frau sitzt", [(0, 5), (6, 8)], [(0, 4), (5, 10)], weights
    )
    assert sentence.pairs == [(0, 0), (1, 1)] and sentence.strong == [True, False]
    text = TextAlignment([(0, 0, sentence)])
    assert text.span(0, 8) == (0, 4)  # "woman is" -> "Frau"
    assert text.span(6, 8) == (5, 10)  # "is" -> "sitzt"


@pytest.mark.parametrize("reads", [False, True])
def test_the_engine_keeps_one_row_per_token(reads: bool) -> None:
    """The search's rows are one per step run (a step per token, and the one that picked </s>);
    a token's row is the step that picked it, or for an aligner (`reads`) the one that read it,
    the next: cut by the length limit, the last token was never read and gets zeros."""
    steps = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 1  # 4 steps, 3 source columns
    ended = _aligned(Hypothesis([7, 8, 9], -1.0, "eos", steps), 2, reads)
    assert ended.alignment is not None
    assert ended.alignment.tolist() == (steps[1:4] if reads else steps[:3])[:, :2].tolist()
    cut = _aligned(Hypothesis([7, 8, 9], -1.0, "length", steps[:3]), 2, reads)
    assert cut.alignment is not None
    expected = [*steps[1:3, :2].tolist(), [0.0, 0.0]] if reads else steps[:3, :2].tolist()
    assert cut.alignment.tolist() == expected
    empty = _aligned(Hypothesis([], -1.0, "eos", steps[:1]), 2, reads)
    assert empty.alignment is not None and empty.alignment.shape == (0, 2)
