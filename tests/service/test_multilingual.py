"""Serving imported M2M100 and NLLB models (random weights, tests/conftest.py) end to end
against transformers: the bundle's tokenizer gives the reference's ids (language tokens
included) and text on a multilingual sample, the engine gives generate's tokens and scores with
each sentence's target forced, texts for different targets sharing one batch, and the service
routes every pair a multilingual bundle serves, after a bilingual bundle for the same pair."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from model.data import read_lines
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import BundleError
from service.http.app import create_app
from service.inference import models
from service.inference.engine import Engine
from service.inference.models import load_models, model_bundle
from tests.conftest import MULTILINGUAL_SAMPLE
from tests.service.helpers import FakeModel, fast_settings, running
from tests.transformers_reference import (
    MULTILINGUAL_CASES,
    generate_mixed,
    generate_multilingual,
    multilingual_reference,
)

torch.set_num_threads(1)
MAX_LENGTH = 30


def _engine(bundle: Path) -> Engine:
    return Engine.load(bundle, device="cpu", intra_op_threads=1)


@pytest.mark.parametrize(("family", "source", "targets"), MULTILINGUAL_CASES)
def test_ids_and_text_equal_the_reference_tokenizer(
    family: str,
    source: str,
    targets: tuple[str, ...],
    multi30k: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The source's language token first, then the text's ids and </s>, on every script of the
    sample and on Multi30k's val sentences; the ids decode to the reference's text."""
    engine = _engine(request.getfixturevalue(f"{family}_bundle"))
    ref = multilingual_reference(request.getfixturevalue(f"{family}_dir"))
    texts = [*MULTILINGUAL_SAMPLE]
    for language in ("en", "de", "fr"):
        texts += read_lines(multi30k / f"val.{language}.gz")[:100]
    for language in (source, *targets):
        ids = engine.encode(texts, targets[0], language)
        assert ids == ref.encode(texts, language)
        assert {row[0] for row in ids} == {ref.language_id(language)}
    for row in engine.encode(texts, targets[0], source):
        body = row[1:-1]
        assert engine.decode(body) == ref.tokenizer.decode(body, skip_special_tokens=True)
    assert engine.decoder_prefix(targets[1]) == [ref.language_id(targets[1])]


@pytest.mark.parametrize(("family", "source", "targets"), MULTILINGUAL_CASES)
@pytest.mark.parametrize(("beam_size", "length_penalty"), [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_engine_gives_generate_s_tokens_and_scores_with_mixed_targets_in_one_batch(
    family: str,
    source: str,
    targets: tuple[str, ...],
    beam_size: int,
    length_penalty: float,
    request: pytest.FixtureRequest,
) -> None:
    engine = _engine(request.getfixturevalue(f"{family}_bundle"))
    ref = multilingual_reference(request.getfixturevalue(f"{family}_dir"))
    texts = MULTILINGUAL_SAMPLE
    wanted, expected = generate_mixed(
        ref, texts, source=source, targets=targets, beam_size=beam_size,
        max_decoding_length=MAX_LENGTH, length_penalty=length_penalty,
    )  # fmt: skip
    options = DecodingOptions(
        beam_size=beam_size, max_decoding_length=MAX_LENGTH, length_penalty=length_penalty
    )
    nbest = engine.generate(
        engine.encode(texts, wanted[0], source),
        options,
        prefixes=[engine.decoder_prefix(target) for target in wanted],
    )
    assert [hyps[0].ids for hyps in nbest] == [ids for ids, _ in expected]
    if beam_size > 1:
        for hyps, (_, score) in zip(nbest, expected, strict=True):
            assert hyps[0].score == pytest.approx(score, abs=1e-4)


@pytest.mark.anyio
async def test_every_pair_is_served_and_a_bilingual_model_comes_first(
    m2m100_bundle: Path, m2m100_dir: Path
) -> None:
    """The M2M100 bundle serves its 8 languages to each other (56 pairs) through both APIs;
    a bilingual en -> de model takes that pair, unless prefer_multilingual."""
    ref = multilingual_reference(m2m100_dir)
    engine = _engine(m2m100_bundle)
    bilingual = FakeModel("en", "de")
    for prefer, expected in ((False, bilingual.name), (True, engine.name)):
        settings = fast_settings(prefer_multilingual=prefer)
        async with running(create_app(settings, models=[bilingual, engine])) as client:
            pairs = (await client.get("/languages")).json()
            assert len(pairs) == 8 * 7
            assert {p["model"] for p in pairs if (p["source"], p["target"]) == ("en", "de")} == {
                expected
            }
            lt = (await client.get("/libretranslate/languages")).json()
            assert {language["code"] for language in lt} == set(engine.source_languages)
            response = await client.post(
                "/translate", json={"text": "Ein Hund läuft.", "source": "de", "target": "ru"}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == engine.name
            [(ids, _)] = generate_multilingual(
                ref, ["Ein Hund läuft."], source="de", target="ru", beam_size=1,
                max_decoding_length=256,
            )  # fmt: skip
            assert body["translations"][0]["text"] == ref.tokenizer.decode(
                ids, skip_special_tokens=True
            )
            status = (await client.get("/status")).json()
            [multilingual] = [m for m in status["models"] if m["name"] == engine.name]
            assert (multilingual["source"], len(multilingual["sources"])) == ("mul", 8)
            # One info series for the model, not one per pair (NLLB would have 40,602).
            metrics = (await client.get("/metrics")).text.splitlines()
            info = [line for line in metrics if line.startswith("mt_model_info{")]
            assert [line for line in info if f'model="{engine.name}"' in line] == [
                f'mt_model_info{{model="{engine.name}",provider="CPUExecutionProvider",'
                'source="mul",target="mul"} 1.0'
            ]


def test_a_transformers_folder_is_imported_once_and_served(
    m2m100_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model DIR`: import and export on first start into the cache, keyed by the folder's
    content; the same content later is served from the cache without importing again."""
    cache = tmp_path / "cache"
    settings = fast_settings(model=[m2m100_dir], model_cache=cache, device="cpu")
    [engine] = load_models(settings)
    assert engine.source_languages == ("en", "ha", "is", "ja", "cs", "ru", "zh", "de")
    assert engine.license == "mit"
    [bundle] = [path for path in cache.iterdir() if path.is_dir()]
    assert bundle.name.startswith("m2m100-") and (bundle / "manifest.json").is_file()

    def no_import(command: list[str]) -> None:
        raise AssertionError(f"imported again: {command}")

    def no_hashing(directory: Path) -> str:
        raise AssertionError("hashed again")

    monkeypatch.setattr(models, "_run", no_import)
    monkeypatch.setattr(models, "_content_hash", no_hashing)
    assert model_bundle(m2m100_dir, cache) == bundle  # the files' sizes and times say it
    # A bundle an older release left, of another format version or with its graphs holding
    # their weights (no data files), is made again.
    manifest = json.loads((bundle / "manifest.json").read_text())
    inline = {name: e for name, e in manifest["files"].items() if not name.endswith(".data")}
    saved = shutil.copytree(bundle, tmp_path / "saved")
    for older in ({"format_version": 5}, {"files": inline}):
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.copytree(saved, bundle)
        (bundle / "manifest.json").write_text(json.dumps({**manifest, **older}))
        with pytest.raises(AssertionError, match="imported again"):
            model_bundle(m2m100_dir, cache)
    # Without torch the one with inline weights is served as it is (it costs memory only).
    monkeypatch.setattr(models, "_can_export", lambda package: False)
    assert model_bundle(m2m100_dir, cache) == bundle
    monkeypatch.undo()
    monkeypatch.setattr(models, "_run", no_import)
    changed = tmp_path / "m2m100"
    shutil.copytree(m2m100_dir, changed)
    (changed / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    with pytest.raises(AssertionError, match="imported again"):
        model_bundle(changed, cache)


def test_a_folder_that_is_no_checkpoint_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "downloads").mkdir()
    with pytest.raises(BundleError, match=r"config\.json is missing"):
        model_bundle(tmp_path / "downloads", tmp_path / "cache")
    with pytest.raises(BundleError, match="no such directory"):
        model_bundle(tmp_path / "nowhere", tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*/manifest.json"))


@pytest.mark.anyio
async def test_auto_routes_each_text_to_its_nllb_pair(nllb_bundle: Path) -> None:
    """`source: "auto"` on an NLLB bundle: each text detected as its FLORES-200 code and
    translated from it, as a request naming that code translates it."""
    engine = _engine(nllb_bundle)
    texts = ["Ein Hund läuft durch den Park.", "Un chien court dans le parc.", "A dog runs."]
    async with running(create_app(fast_settings(), models=[engine])) as client:

        async def translate(text: str | list[str], source: str) -> list[dict[str, Any]]:
            body = {"text": text, "source": source, "target": "eng_Latn"}
            response = await client.post("/translate", json=body)
            assert response.status_code == 200, response.text
            return list(response.json()["translations"])

        translations = await translate(texts, "auto")
        detected = [t["detected_language"]["language"] for t in translations]
        assert detected == ["deu_Latn", "fra_Latn", "eng_Latn"]
        assert (translations[2]["text"], translations[2]["untranslated"]) == (
            texts[2],
            "source_is_target",
        )
        for text, source, translation in zip(texts[:2], detected, translations, strict=False):
            [named] = await translate(text, source)
            assert translation["text"] == named["text"] and named["text"] != text
