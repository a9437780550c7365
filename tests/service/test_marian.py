"""Serving imported Marian models (random weights, tests/conftest.py), end to end against
transformers: the bundle's tokenizer gives MarianTokenizer's ids and text, the engine gives
generate's tokens and scores, and several bundles serve their pairs side by side through
/translate, /languages, the LibreTranslate surface and /metrics."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from export.onnx_export import main as export_main
from model.data import read_lines
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import SentencePieceFiles, load_bundle
from service.bundle.tokenizer import SentencePieceTokenizer, load_tokenizer
from service.http.app import create_app
from service.inference.engine import Engine
from service.settings import Settings
from service.text import segment
from service.translate import translate_lines
from tests.service.helpers import fast_settings, model_translate, running
from tests.transformers_reference import decode, reference, source_texts
from tests.transformers_reference import generate as reference_generate

torch.set_num_threads(1)  # transformers' reference; more threads only contend on 2 cores
MAX_LENGTH = 40
SPECIAL = ("</s>", "<unk>", "<pad>")
# What the random models' target-language tokens are, per served target.
CASES = [
    ("marian", "de", None),
    ("marian_renormalized", "de", None),
    ("marian_separate", "fr", None),
    ("marian_multi", "en", ">>en<<"),
    ("marian_multi", "fr", ">>fr<<"),
]


def _sources(multi30k: Path, language: str, n: int = 20) -> list[str]:
    """Validation sentences that the service keeps as one segment each."""
    lines = read_lines(multi30k / f"val.{language}.gz")
    return [line for line in lines if segment.split(line, language).segments == (line,)][:n]


def _engine(bundle: Path) -> Engine:
    return Engine.load(bundle, device="cpu", intra_op_threads=1)


# --- Tokenizer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["marian", "marian_separate"])
def test_ids_equal_marian_tokenizer_on_the_multi30k_files(
    name: str, multi30k: Path, request: pytest.FixtureRequest
) -> None:
    ours = load_tokenizer(load_bundle(request.getfixturevalue(f"{name}_bundle")))
    theirs = reference(request.getfixturevalue(f"{name}_dir")).tokenizer
    for language in ("en", "de", "fr"):
        lines = [
            *read_lines(multi30k / f"val.{language}.gz"),
            *read_lines(multi30k / f"test_2016_flickr.{language}.gz"),
            *read_lines(multi30k / f"train.{language}.gz")[::10],
        ]
        assert ours.encode(lines) == theirs(lines)["input_ids"], language


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=60))
def test_ids_equal_marian_tokenizer_on_any_unicode(
    text: str, marian_bundle: Path, marian_dir: Path
) -> None:
    # The two deliberate differences (service/bundle/tokenizer.py): text spelling a special token or
    # a language code stays text here.
    assume(not any(s in text for s in SPECIAL) and not text.startswith(">>"))
    ours = load_tokenizer(load_bundle(marian_bundle)).encode([text])[0]
    theirs = reference(marian_dir).tokenizer(text)["input_ids"]
    # The engine never runs a text without tokens; MarianTokenizer gives it [</s>].
    assert ours == (theirs if len(theirs) > 1 else [])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("clean_up", [False, True])
def test_text_equals_marian_tokenizer_decode(
    data: st.DataObject, clean_up: bool, marian_bundle: Path, marian_dir: Path
) -> None:
    bundle = load_bundle(marian_bundle)
    files = bundle.manifest.tokenizer
    assert isinstance(files, SentencePieceFiles)
    ids, dims = bundle.manifest.special_ids, bundle.manifest.model
    ours = SentencePieceTokenizer(
        marian_bundle,
        files.model_copy(update={"clean_up_spaces": clean_up}),
        ids,
        (dims.vocab_size, dims.output_vocab_size),
    )
    theirs = reference(marian_dir).tokenizer
    sequence = data.draw(st.lists(st.integers(0, dims.output_vocab_size - 1), max_size=30))
    expected = theirs.decode(
        sequence, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up
    )
    assert ours.decode(sequence) == expected


def test_text_spelling_special_tokens_stays_text(
    marian_multi_bundle: Path, marian_multi_dir: Path
) -> None:
    engine = _engine(marian_multi_bundle)
    vocab = reference(marian_multi_dir).tokenizer.get_vocab()
    (ids,) = engine.encode([">>en<< Ein Hund </s> <pad> <unk>"], "fr")
    assert ids[0] == vocab[">>fr<<"] and ids[-1] == vocab["</s>"]
    # (<unk> may appear: the characters < and > are unknown to this SentencePiece model.)
    assert not {vocab[t] for t in (">>en<<", ">>fr<<", "</s>", "<pad>")} & set(ids[1:-1])


# --- Engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "target", "token"), CASES)
@pytest.mark.parametrize(("beam_size", "length_penalty"), [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_engine_gives_the_tokens_and_scores_of_generate(
    name: str,
    target: str,
    token: str | None,
    beam_size: int,
    length_penalty: float,
    multi30k: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The exported graphs and the numpy search give transformers' generate output (tests/
    transformers_reference.py has the conventions): equal tokens, beam scores within 1e-4."""
    engine = _engine(request.getfixturevalue(f"{name}_bundle"))
    ref = reference(request.getfixturevalue(f"{name}_dir"))
    texts = _sources(multi30k, engine.source_language)
    options = DecodingOptions(
        beam_size=beam_size, max_decoding_length=MAX_LENGTH, length_penalty=length_penalty
    )
    expected = reference_generate(
        ref,
        texts,
        beam_size=beam_size,
        max_decoding_length=MAX_LENGTH,
        length_penalty=length_penalty,
        target_token=token,
    )
    sources = engine.encode(texts, target)
    assert sources == ref.tokenizer(source_texts(texts, token))["input_ids"]
    nbest = engine.generate(sources, options)
    assert [hyps[0].ids for hyps in nbest] == [ids for ids, _ in expected]
    if beam_size > 1:
        for hyps, (_, score) in zip(nbest, expected, strict=True):
            assert hyps[0].score == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_reduced_precision_bundles_export_and_translate(
    dtype: str, marian_checkpoint: Path, multi30k: Path, tmp_path: Path
) -> None:
    out = tmp_path / f"opus-mt-en-de-{dtype}"
    args = ["--checkpoint", str(marian_checkpoint), "--out", str(out), "--dtype", dtype]
    assert export_main(args) == 0
    engine = _engine(out)
    assert engine.manifest.dtype == dtype
    texts = _sources(multi30k, "en", 8)
    nbest = engine.generate(engine.encode(texts), DecodingOptions(beam_size=2))
    pad = engine.manifest.special_ids.pad  # suppressed: never generated
    assert any(hyps[0].ids for hyps in nbest)
    assert not any(pad in hyps[0].ids for hyps in nbest)


# --- Serving several bundles -------------------------------------------------------------------


@pytest.mark.anyio
async def test_several_bundles_serve_their_pairs_with_transformers_text(
    marian_bundle: Path,
    marian_multi_bundle: Path,
    marian_dir: Path,
    marian_multi_dir: Path,
    multi30k: Path,
) -> None:
    """`--bundle A --bundle B`: en -> de from one model, de -> en and de -> fr from a
    multi-target one; each answer is what transformers decodes for the same input."""
    settings = fast_settings(
        bundle=[marian_bundle, marian_multi_bundle], device="cpu", intra_op_threads=1
    )
    names = {"opus-mt-en-de", "opus-mt-de-mul"}
    async with running(create_app(settings)) as client:
        languages = (await client.get("/languages")).json()
        assert languages == [
            {"source": "en", "target": "de", "model": "opus-mt-en-de"},
            {"source": "de", "target": "en", "model": "opus-mt-de-mul"},
            {"source": "de", "target": "fr", "model": "opus-mt-de-mul"},
        ]
        for directory, source, target, token in (
            (marian_dir, "en", "de", None),
            (marian_multi_dir, "de", "fr", ">>fr<<"),
        ):
            texts = _sources(multi30k, source, 8)
            response = await client.post(
                "/translate",
                json={
                    "text": texts,
                    "source": source,
                    "target": target,
                    "beam_size": 4,
                    "length_penalty": 1.0,  # transformers' default, not the service's
                    "max_decoding_length": MAX_LENGTH,
                },
            )
            assert response.status_code == 200, response.text
            ref = reference(directory)
            expected = reference_generate(
                ref, texts, beam_size=4, max_decoding_length=MAX_LENGTH, target_token=token
            )
            actual = [t["text"] for t in response.json()["translations"]]
            assert actual == [decode(ref, ids) for ids, _ in expected]

        # LibreTranslate: every language, with its targets; greedy (the settings' default).
        libre = (await client.get("/libretranslate/languages")).json()
        assert [(x["code"], x["targets"]) for x in libre] == [
            ("de", ["en", "fr"]),
            ("en", ["de"]),
            ("fr", []),
        ]
        text = _sources(multi30k, "de", 1)[0]
        response = await client.post(
            "/libretranslate/translate", json={"q": text, "source": "de", "target": "en"}
        )
        ref = reference(marian_multi_dir)
        limit = ref.model.config.max_position_embeddings  # the service caps lengths there
        ((ids, _),) = reference_generate(
            ref, [text], beam_size=1, max_decoding_length=limit, target_token=">>en<<"
        )
        assert response.json()["translatedText"] == decode(ref, ids)

        response = await client.post(
            "/translate", json={"text": "A dog.", "source": "en", "target": "fr"}
        )
        assert response.status_code == 422
        assert "en -> de, de -> en, de -> fr" in response.json()["error"]["message"]

        metrics = text_string_to_metric_families((await client.get("/metrics")).text)
        labelled = {
            sample.labels["model"]
            for family in metrics
            for sample in family.samples
            if "model" in sample.labels
        }
        assert labelled == names  # one label value per model, whatever the pairs
        info = (await client.get("/metrics")).text
        assert info.count("mt_model_info{") == 3


def test_file_translation_asks_a_multi_target_model_for_its_target(
    marian_multi_bundle: Path, multi30k: Path
) -> None:
    engine = _engine(marian_multi_bundle)
    lines = _sources(multi30k, "de", 3)
    options = DecodingOptions(beam_size=1, max_decoding_length=MAX_LENGTH)
    out = io.StringIO()
    limit = Settings().max_segment_characters
    translate_lines(engine, lines, options, out=out, max_segment_characters=limit, target="fr")
    expected = [text for ((text, _),) in model_translate(engine, lines, options, target="fr")]
    assert out.getvalue().splitlines() == expected
    with pytest.raises(ValueError, match="translates into en, fr, not None"):
        translate_lines(engine, lines, options, out=io.StringIO(), max_segment_characters=limit)
