"""Language detection (issue 30): the detector on real Multi30k sentences, `source: "auto"`
routing each text of a request to its own model, the texts that come back as sent, and /detect
in both APIs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from benchmarks.detect_bench import LANGUAGES, read_texts
from benchmarks.paths import MULTI30K
from service.http.app import create_app
from service.text import pipeline
from service.text.detect import Detector, detector_label
from tests.service.helpers import FakeModel, fast_settings, running

pytestmark = pytest.mark.anyio

LT = "/libretranslate"
# Not the warm-up's sentence, which is in the sentence cache from the start.
EN = ["A man is riding a horse.", "Two dogs play in the snow."]
FR = "Un homme fait du vélo."
DE = "Ein Mann fährt Fahrrad."
EMOJI = "🙂🎉 123"
# Accuracy floors on the first 300 test_2016_flickr lines of each language, restricted to
# en/de/fr (measured: 100%, 92.6% and 99.7%; on 1,000 lines: benchmarks/RESULTS.md).
FLOORS = {"sentence": 0.99, "1-3 words": 0.90, "4-10 words": 0.98}


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"no Multi30k data at {MULTI30K}")
def test_the_detector_is_accurate_on_real_short_sentences() -> None:
    detector = Detector(LANGUAGES)
    accuracy = {}
    for bucket, pairs in read_texts(300).items():
        texts = pipeline.detectable([text for text, _ in pairs], "text")
        found = [detector.rank(text) for text in texts]
        right = sum(
            bool(f) and f[0].language == want for f, (_, want) in zip(found, pairs, strict=True)
        )
        accuracy[bucket] = right / len(pairs)
    assert all(accuracy[bucket] >= floor for bucket, floor in FLOORS.items()), accuracy


@pytest.mark.parametrize(
    "text", ["🙂🎉", "https://example.com/a/page", "12 345,67", " \n\t", "@bob@mastodon.social #1"]
)
def test_a_text_without_letters_has_nothing_to_detect(text: str) -> None:
    (detectable,) = pipeline.detectable([text], "text")
    assert Detector(LANGUAGES).rank(detectable) is None


@pytest.fixture
def en() -> FakeModel:
    return FakeModel("en", "de")


@pytest.fixture
def fr() -> FakeModel:
    return FakeModel("fr", "de")


@pytest.fixture
async def client(en: FakeModel, fr: FakeModel) -> AsyncIterator[httpx.AsyncClient]:
    """Two models of different source languages into German."""
    async with running(create_app(fast_settings(), models=[en, fr])) as client:
        en.calls.clear()  # the warm-up's
        fr.calls.clear()
        yield client


def _decoded(model: FakeModel) -> list[list[str]]:
    """Each generate call's sources, as text."""
    return [[model.decode(ids[:-1]) for ids in sources] for sources, _ in model.calls]


async def test_auto_sends_each_text_to_the_model_of_its_language(
    client: httpx.AsyncClient, en: FakeModel, fr: FakeModel
) -> None:
    texts = [EN[0], FR, DE, EN[1], EMOJI]
    response = await client.post(
        "/translate", json={"text": texts, "source": "auto", "target": "de"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "fake-en-de, fake-fr-de" and body["source"] == "auto"
    translations = body["translations"]
    assert [t["text"] for t in translations] == [
        EN[0].upper(),
        FR.upper(),
        DE,
        EN[1].upper(),
        EMOJI,
    ]
    detected = [t["detected_language"] for t in translations]
    assert [d["language"] for d in detected] == ["en", "fr", "de", "en", "und"]
    assert all(0.5 < d["confidence"] <= 1 for d in detected[:4]) and detected[4]["confidence"] == 0
    untranslated = [t.get("untranslated") for t in translations]
    assert untranslated == [None, None, "source_is_target", None, "nothing_to_detect"]
    assert translations[2]["segments"] == [] and translations[4]["segments"] == []
    # The English texts went to their model together, in order; the French one to its own.
    assert _decoded(en) == [[EN[0].upper(), EN[1].upper()]]
    assert _decoded(fr) == [[FR.upper()]]


async def test_auto_refuses_a_detected_pair_that_no_model_serves() -> None:
    models = [FakeModel("en", "de"), FakeModel("fr", "de"), FakeModel("de", "en")]
    async with running(create_app(fast_settings(), models=models)) as client:
        # fr and en are served, but no model translates fr -> en.
        response = await client.post(
            "/translate", json={"text": [DE, FR], "source": "auto", "target": "en"}
        )
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["type"] == "unsupported_language_pair"
        assert error["message"].startswith("text 1 is in fr (detected, confidence 0.")
        assert "no model translates fr -> en" in error["message"]
        response = await client.post(
            "/translate", json={"text": EMOJI, "source": "auto", "target": "es"}
        )
        assert response.status_code == 422
        assert "no model translates into es" in response.json()["error"]["message"]
    assert all(len(model.calls) == 1 for model in models)  # the warm-up's: nothing after it


async def test_a_models_share_fails_the_request_with_its_own_error_and_text_index() -> None:
    # Room for the warm-up sentence (24 tokens), not for this one (55).
    long_french = "Deux chiens jouent dans la neige avec un ballon rouge."
    models = [FakeModel("en", "de"), FakeModel("fr", "de", max_input_tokens=30)]
    async with running(create_app(fast_settings(), models=models)) as client:
        response = await client.post(
            "/translate",
            json={"text": [EN[0], EN[1], long_french], "source": "auto", "target": "de"},
        )
    assert response.status_code == 422
    error = response.json()["error"]
    # The French text is the third of the request (the first of its model's share).
    assert error["type"] == "input_too_long"
    assert error["message"].startswith("text 2, sentence 0: 55 tokens"), error


async def test_auto_keeps_a_document_already_in_the_target_byte_for_byte(
    client: httpx.AsyncClient, en: FakeModel
) -> None:
    html = '<p>Ein <b>Mann</b> fährt <a href="https://example.com">Fahrrad</a>.</p>'
    response = await client.post(
        "/translate",
        json={
            "text": [html, f"<p>{EN[0]}</p>"],
            "source": "auto",
            "target": "de",
            "format": "html",
        },
    )
    assert response.status_code == 200, response.text
    first, second = response.json()["translations"]
    assert first["text"] == html and first["untranslated"] == "source_is_target"
    assert second["text"] == f"<p>{EN[0].upper()}</p>" and "untranslated" not in second


async def test_native_detect_ranks_the_served_languages_per_text(client: httpx.AsyncClient) -> None:
    response = await client.post("/detect", json={"text": [EN[0], FR, EMOJI]})
    assert response.status_code == 200, response.text
    english, french, nothing = response.json()["detections"]
    assert english[0]["language"] == "en" and french[0]["language"] == "fr" and nothing == []
    for ranked in (english, french):
        confidences = [c["confidence"] for c in ranked]
        assert confidences == sorted(confidences, reverse=True)
        assert {c["language"] for c in ranked} <= {"en", "fr", "de"}
        assert 0 <= sum(confidences) <= 1.0001
    response = await client.post("/detect", json={"text": f"<p>{DE}</p>", "format": "html"})
    assert response.json()["detections"][0][0]["language"] == "de"
    response = await client.post("/detect", json={"text": ["<a>ok</a>", "<a>"], "format": "xml"})
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("text 1: malformed XML")
    response = await client.post("/detect", json={"text": 1})
    assert response.status_code == 422


async def test_libretranslate_detect_ranks_the_served_languages(client: httpx.AsyncClient) -> None:
    response = await client.post(f"{LT}/detect", data={"q": FR})
    ranked = response.json()
    assert ranked[0]["language"] == "fr" and 50 < ranked[0]["confidence"] <= 100
    assert [c["confidence"] for c in ranked] == sorted(
        (c["confidence"] for c in ranked), reverse=True
    )
    response = await client.post(f"{LT}/detect", json={"q": EMOJI})
    assert response.json() == [{"confidence": 0.0, "language": "und"}]
    response = await client.post(f"{LT}/detect", json={})
    assert response.status_code == 400
    assert response.json() == {"error": "Invalid request: missing q parameter"}


async def test_libretranslate_detects_each_text_of_a_batch(
    client: httpx.AsyncClient, en: FakeModel, fr: FakeModel
) -> None:
    response = await client.post(
        f"{LT}/translate", json={"q": [FR, EN[0], DE, EMOJI], "source": "auto", "target": "de"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["translatedText"] == [FR.upper(), EN[0].upper(), DE, EMOJI]
    assert [d["language"] for d in body["detectedLanguage"]] == ["fr", "en", "de", "und"]
    assert all(50 < d["confidence"] <= 100 for d in body["detectedLanguage"][:3])
    assert body["untranslated"] == [None, None, "source_is_target", "nothing_to_detect"]
    assert _decoded(en) == [[EN[0].upper()]] and _decoded(fr) == [[FR.upper()]]
    response = await client.post(
        f"{LT}/translate", json={"q": DE, "source": "auto", "target": "de", "alternatives": 2}
    )
    body = response.json()
    assert body["translatedText"] == DE and body["untranslated"] == "source_is_target"
    assert body["detectedLanguage"]["language"] == "de" and body["alternatives"] == []


def test_the_words_after_a_long_run_of_digits_are_read() -> None:
    assert Detector(["en", "de"]).rank("1" * 1200 + " " + DE)[0].language == "de"  # type: ignore[index]


def test_flores_codes_are_detected_as_their_languages() -> None:
    """NLLB names languages by FLORES-200 codes: each is ranked by fastText's label for it,
    two codes of one label (Chinese in two scripts) at the same confidence."""
    detector = Detector(["eng_Latn", "deu_Latn", "fra_Latn", "arb_Arab", "zho_Hans", "zho_Hant"])
    assert detector.rank(DE)[0].language == "deu_Latn"  # type: ignore[index]
    assert detector.rank(FR)[0].language == "fra_Latn"  # type: ignore[index]
    assert detector.rank("الكلب يركض في الحديقة")[0].language == "arb_Arab"  # type: ignore[index]
    first, second = detector.rank("一只狗在公园里跑。")[:2]  # type: ignore[index]
    assert (first.language, second.language) == ("zho_Hans", "zho_Hant")
    assert first.confidence == second.confidence > 0.5
    assert [detector_label(code) for code in ("nob_Latn", "als_Latn", "pes_Arab", "hye_Armn")] == [
        "no", "sq", "fa", "hy"
    ]  # fmt: skip


def _multilingual(name: str, languages: tuple[str, ...]) -> FakeModel:
    """A fake of several source languages, each into every other (as an NLLB bundle)."""
    model = FakeModel(languages[0], languages[1], more_targets=languages[2:] + languages[:1])
    model.name, model.source_languages = name, languages
    return model


async def test_auto_picks_the_code_that_has_a_model_into_the_target() -> None:
    """ "en" (a bilingual model's) and "eng_Latn" (NLLB's) are one language to the detector:
    an English text into deu_Latn goes to the model that has eng_Latn -> deu_Latn."""
    bilingual = FakeModel("en", "de")
    nllb = _multilingual("fake-nllb", ("eng_Latn", "deu_Latn"))
    async with running(create_app(fast_settings(), models=[bilingual, nllb])) as client:
        for target, model, language in (
            ("deu_Latn", nllb.name, "eng_Latn"),
            ("de", bilingual.name, "en"),
        ):
            response = await client.post(
                "/translate", json={"text": EN[0], "source": "auto", "target": target}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == model
            assert body["translations"][0]["detected_language"]["language"] == language


@pytest.mark.parametrize("prefer", [False, True])
def test_two_bilingual_models_of_a_pair_are_refused_whatever_else_is_served(prefer: bool) -> None:
    from service.metrics import Metrics
    from service.scheduling.runtime import Runtime

    models = [
        FakeModel("en", "de"),
        _multilingual("fake-mul", ("en", "de", "fr")),
        FakeModel("en", "de"),
    ]
    models[2].name = "fake-en-de-2"
    with pytest.raises(ValueError, match="two models for en -> de"):
        Runtime(fast_settings(prefer_multilingual=prefer), Metrics(), models)


async def test_auto_routes_between_the_shipped_directions(
    shipped_bundle: Path, shipped_de_en_bundle: Path
) -> None:
    """Out of the box: English into German by multi30k-en-de, German into English by
    multi30k-de-en, each text detected on its own; a text already in the target comes back."""
    from service.inference.engine import Engine

    engines = [
        Engine.load(bundle, device="cpu", intra_op_threads=1)
        for bundle in (shipped_bundle, shipped_de_en_bundle)
    ]
    english, german = "A man rides a bike.", "Ein Mann fährt Fahrrad."
    async with running(create_app(fast_settings(), models=engines)) as client:
        for target, model, translated in (("de", "multi30k-en-de", 0), ("en", "multi30k-de-en", 1)):
            response = await client.post(
                "/translate", json={"text": [english, german], "source": "auto", "target": target}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == model
            translations = body["translations"]
            assert [t["detected_language"]["language"] for t in translations] == ["en", "de"]
            done, kept = translations[translated], translations[1 - translated]
            assert done["segments"] and done["text"] != [english, german][translated]
            assert kept["untranslated"] == "source_is_target"
