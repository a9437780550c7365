"""A bundle's vocabulary shortlist in the engine (service/inference/shortlist.py): a sentence
produces only its own ids, and its translation and scores do not depend on its batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.onnx_export import export_bundle
from model.data import read_lines
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import MANIFEST_FILE, BundleError
from service.inference.engine import Engine
from service.inference.shortlist import batch_inputs


@pytest.fixture(scope="module")
def engine(shortlist_bundle: Path) -> Engine:
    return Engine.load(shortlist_bundle, device="cpu", intra_op_threads=1)


@pytest.mark.parametrize(
    "options",
    [DecodingOptions(), DecodingOptions(beam_size=4, num_hypotheses=2, length_penalty=0.6)],
)
def test_a_sentence_translates_alike_alone_and_in_any_batch(
    engine: Engine, val_src: list[str], options: DecodingOptions
) -> None:
    sources = engine.encode(val_src[:20])
    shortlist = engine.shortlist
    assert shortlist is not None
    own = [shortlist.candidates(s) for s in sources]
    union, _ = batch_inputs(own)
    assert all(len(ids) < len(union) for ids in own)  # each sentence's ids are a part
    batched = engine.generate(sources, options)
    for source, ids, nbest in zip(sources, own, batched, strict=True):
        [alone] = engine.generate([source], options)
        assert [h.ids for h in nbest] == [h.ids for h in alone]
        assert [h.score for h in nbest] == pytest.approx([h.score for h in alone], abs=1e-4)
        for hypothesis in nbest:  # nothing outside its own ids
            assert np.isin(hypothesis.ids, ids).all()


def test_the_padded_policy_pads_the_shortlist_and_translates_alike(
    shortlist_bundle: Path, engine: Engine, val_src: list[str]
) -> None:
    """CUDA's policy (run on the CPU here): 5 sentences in 8 slots, V' a power of two, its
    padding masked for every sentence."""
    padded = Engine.load(shortlist_bundle, device="cpu", intra_op_threads=1, padded=True)
    sources = engine.encode(val_src[10:15])
    options = DecodingOptions(beam_size=3)
    expected = engine.generate(sources, options)
    for a, b in zip(padded.generate(sources, options), expected, strict=True):
        assert [h.ids for h in a] == [h.ids for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    shortlist = engine.shortlist
    assert shortlist is not None
    ids, mask = batch_inputs([shortlist.candidates(s) for s in sources], padded=True)
    assert len(ids) & (len(ids) - 1) == 0
    real = np.searchsorted(ids, ids[-1]) + 1  # the columns past it repeat the last id
    assert np.all(np.diff(ids[:real]) > 0) and np.isinf(mask[:, real:]).all()


def test_a_multilingual_shortlist_applies_to_its_own_target_language(
    nllb_checkpoint: Path, nllb_bundle: Path, multi30k: Path, tmp_path: Path
) -> None:
    """A shortlist counted on English -> German keeps sentences into German to their ids;
    sentences into French in the same batch keep every id, so they translate as the bundle
    without a shortlist translates them."""
    corpus = (multi30k / "val.en.gz", multi30k / "val.de.gz")
    with pytest.raises(ValueError, match="--shortlist-target"):
        export_bundle(nllb_checkpoint, tmp_path / "b", shortlist=corpus)
    export_bundle(
        nllb_checkpoint, tmp_path / "b", shortlist=corpus, shortlist_target="deu_Latn",
        shortlist_frequent=50, shortlist_per_token=5,
    )  # fmt: skip
    engine = Engine.load(tmp_path / "b", device="cpu", intra_op_threads=1)
    full = Engine.load(nllb_bundle, device="cpu", intra_op_threads=1)
    texts = read_lines(multi30k / "val.en.gz")[:8]
    targets = ["deu_Latn", "fra_Latn"] * 4
    sources = engine.encode(texts, "deu_Latn", "eng_Latn")  # (the target is the decoder's)
    prefixes = [engine.decoder_prefix(target) for target in targets]
    options = DecodingOptions(beam_size=2, max_decoding_length=12)
    got = engine.generate(sources, options, prefixes=prefixes)
    expected = full.generate(sources, options, prefixes=prefixes)
    shortlist = engine.shortlist
    assert shortlist is not None
    german = shortlist.candidates(sources[0], prefixes[0])
    assert len(german) < len(shortlist.every)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if targets[i] == "fra_Latn":
            assert a[0].ids == b[0].ids and a[0].score == pytest.approx(b[0].score, abs=1e-4)
        else:
            assert np.isin(a[0].ids, shortlist.candidates(sources[i], prefixes[i])).all()


def test_a_model_that_picks_its_target_by_a_source_token_takes_no_shortlist(
    marian_multi_checkpoint: Path, multi30k: Path, tmp_path: Path
) -> None:
    corpus = (multi30k / "val.en.gz", multi30k / "val.de.gz")
    with pytest.raises(ValueError, match="target_tokens"):
        export_bundle(marian_multi_checkpoint, tmp_path, shortlist=corpus)


def test_a_shortlist_for_a_language_the_model_does_not_serve_is_refused(
    nllb_checkpoint: Path, multi30k: Path, tmp_path: Path
) -> None:
    corpus = (multi30k / "val.en.gz", multi30k / "val.de.gz")
    export_bundle(
        nllb_checkpoint, tmp_path, shortlist=corpus, shortlist_target="deu_Latn",
        shortlist_frequent=50, shortlist_per_token=5,
    )  # fmt: skip
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    manifest["shortlist"]["target_language"] = "de"  # not one of its FLORES codes
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="shortlist is for de"):
        Engine.load(tmp_path, device="cpu")
