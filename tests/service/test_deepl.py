"""DeepL's API over the FakeModel (which upper-cases): the request shapes DeepL documents (form
and JSON bodies, one text or many), its answers, codes, statuses and error bodies, field by
field. The official clients against the real model: test_deepl_clients.py."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from service.http.app import create_app
from service.scheduling.runtime import Runtime
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio

KEY = {"Authorization": "DeepL-Auth-Key k1"}


@pytest.fixture
async def deepl(fake: FakeModel) -> AsyncIterator[httpx.AsyncClient]:
    """en -> de and de -> en, keys k1 and k2; no sentence cache (the tests read what reaches
    the model)."""
    models = [fake, FakeModel("de", "en")]
    settings = fast_settings(api_keys="k1,k2", cache=False)
    async with running(create_app(settings, models=models)) as client:
        yield client


def message(response: httpx.Response, status: int) -> str:
    """DeepL's error body: a message and nothing else."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"message"}
    text: str = body["message"]
    return text


async def test_form_body_with_texts_repeated_answers_deepls_shape(
    deepl: httpx.AsyncClient,
) -> None:
    form = {"text": ["A dog runs.", "Two cats."], "source_lang": "EN", "target_lang": "de"}
    response = await deepl.post("/v2/translate", data=form, headers=KEY)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "translations": [
            {"detected_source_language": "EN", "text": "A DOG RUNS."},
            {"detected_source_language": "EN", "text": "TWO CATS."},
        ]
    }


async def test_json_body_detects_the_source_and_bills_characters(
    deepl: httpx.AsyncClient,
) -> None:
    body = {
        "text": ["A man is riding a bike down the street.", "Ein Mann fährt Fahrrad."],
        "target_lang": "EN-US",
        "show_billed_characters": True,
        "model_type": "prefer_quality_optimized",
    }
    response = await deepl.post("/v2/translate", json=body, headers=KEY)
    assert response.json() == {
        "translations": [
            # Already English: as sent (the target is English).
            {
                "detected_source_language": "EN",
                "text": "A man is riding a bike down the street.",
                "billed_characters": 39,
                "model_type_used": "quality_optimized",
            },
            {
                "detected_source_language": "DE",
                "text": "EIN MANN FÄHRT FAHRRAD.",
                "billed_characters": 23,
                "model_type_used": "quality_optimized",
            },
        ]
    }


@pytest.mark.parametrize("target", ["EN", "EN-GB", "en-us"])
async def test_english_variants_are_the_served_english(
    deepl: httpx.AsyncClient, target: str
) -> None:
    form = {"text": "Ein Hund.", "source_lang": "de", "target_lang": target}
    response = await deepl.post("/v2/translate", data=form, headers=KEY)
    assert response.json()["translations"] == [
        {"detected_source_language": "DE", "text": "EIN HUND."}
    ]


@pytest.mark.parametrize(
    ("fields", "status", "expected"),
    [
        ({"target_lang": "DE"}, 400, "Parameter 'text' not specified."),
        ({"text": "a"}, 400, "Parameter 'target_lang' not specified."),
        ({"text": "a", "target_lang": "PT-BR"}, 400, "Value for 'target_lang' not supported."),
        ({"text": "a", "target_lang": "EN-GB", "source_lang": "EN-US"}, 400,
         "Value for 'source_lang' not supported."),
        ({"text": "a", "target_lang": "DE", "split_sentences": "2"}, 400,
         "Value for 'split_sentences' not supported."),
        ({"text": "a", "target_lang": "DE", "formality": "more"}, 400,
         "Target language 'DE' doesn't support formality."),
        ({"text": "a", "target_lang": "DE", "formality": "formal"}, 400,
         "Value for 'formality' not supported."),
        ({"text": "a", "target_lang": "DE", "tag_handling": "json"}, 400,
         "Value for 'tag_handling' not supported."),
        ({"text": "a", "target_lang": "DE", "preserve_formatting": "yes"}, 400,
         "Value for 'preserve_formatting' not supported."),
        ({"text": "a", "target_lang": "DE", "model_type": "best"}, 400,
         "Value for 'model_type' not supported."),
        ({"text": "a", "target_lang": "DE", "source_lang": "EN", "glossary_id": "g1"}, 404,
         "Glossary 'g1' not found."),
        ({"text": "a", "target_lang": "DE", "source_lang": "EN", "glossary_ids": "g2"}, 404,
         "Glossary 'g2' not found."),
        ({"text": "a", "target_lang": "DE", "source_lang": "EN", "glossary_ids": "g2,g3"}, 400,
         "Only one glossary per request is supported by this service."),
        ({"text": "a", "target_lang": "DE", "glossary_id": "g1"}, 400,
         "Use of a glossary requires the source_lang parameter to be specified"),
    ],
)  # fmt: skip
async def test_bad_parameters_get_deepls_status_and_message(
    deepl: httpx.AsyncClient, fields: dict[str, str], status: int, expected: str
) -> None:
    response = await deepl.post("/v2/translate", data=fields, headers=KEY)
    assert message(response, status) == expected


async def test_a_preferred_formality_is_accepted_without_formality(
    deepl: httpx.AsyncClient,
) -> None:
    for formality in ("prefer_more", "PREFER_LESS", "default"):
        body = {"text": ["A dog."], "target_lang": "DE", "formality": formality}
        response = await deepl.post("/v2/translate", json=body, headers=KEY)
        assert response.json()["translations"][0]["text"] == "A DOG."


@pytest.mark.parametrize(
    ("split", "text", "segments"),
    [
        ("1", "A dog runs.\nA cat. Fish", ["A dog runs.", "A cat.", "Fish"]),
        ("nonewlines", "A dog\nruns. A cat\nsleeps.", ["A dog runs.", "A cat sleeps."]),
        ("0", "A dog runs. A cat.\nFish", ["A dog runs. A cat. Fish"]),
    ],
)
async def test_split_sentences_decides_what_the_model_reads(
    deepl: httpx.AsyncClient, fake: FakeModel, split: str, text: str, segments: list[str]
) -> None:
    """Each text comes back with its line breaks wherever it was cut."""
    form = {"text": text, "source_lang": "EN", "target_lang": "DE", "split_sentences": split}
    response = await deepl.post("/v2/translate", data=form, headers=KEY)
    assert response.json()["translations"][0]["text"] == text.upper()
    sources = fake.calls[-1][0]
    assert sorted("".join(chr(i) for i in ids[:-1]) for ids in sources) == sorted(segments)


async def test_html_and_xml_keep_their_tags_and_ignore_tags(deepl: httpx.AsyncClient) -> None:
    html = '<p>A <b>dog</b> runs. <span class="x">Keep me</span> now.</p>'
    body = {"text": [html], "target_lang": "DE", "source_lang": "EN", "tag_handling": "html"}
    response = await deepl.post(
        "/v2/translate", json={**body, "ignore_tags": ["span"]}, headers=KEY
    )
    assert response.json()["translations"][0]["text"] == (
        '<p>A <b>DOG</b> RUNS. <span class="x">Keep me</span> NOW.</p>'
    )
    xml = "<doc><p>A dog <code>x = 1</code> runs.</p><note>Keep</note></doc>"
    form = {"text": xml, "target_lang": "DE", "source_lang": "EN", "tag_handling": "xml"}
    response = await deepl.post(
        "/v2/translate", data={**form, "ignore_tags": "code,note"}, headers=KEY
    )
    assert response.json()["translations"][0]["text"] == (
        "<doc><p>A DOG <code>x = 1</code> RUNS.</p><note>Keep</note></doc>"
    )
    response = await deepl.post("/v2/translate", data={**form, "text": "<a>"}, headers=KEY)
    assert "text 0" in message(response, 400)
    # Detection reads no ignored element: German quoted in an English document.
    quoted = "<doc><p>Two dogs play.</p><q>Ein Mann fährt mit dem Fahrrad durch den Park.</q></doc>"
    form = {"text": quoted, "target_lang": "DE", "tag_handling": "xml", "ignore_tags": "q"}
    response = await deepl.post("/v2/translate", data=form, headers=KEY)
    assert response.json()["translations"] == [
        {"detected_source_language": "EN", "text": quoted.replace("Two dogs play", "TWO DOGS PLAY")}
    ]
    response = await deepl.post("/v2/translate", data={**form, "ignore_tags": []}, headers=KEY)
    assert response.json()["translations"] == [{"detected_source_language": "DE", "text": quoted}]


async def test_splitting_and_non_splitting_tags_decide_the_blocks(
    deepl: httpx.AsyncClient, fake: FakeModel
) -> None:
    seen = 0

    def segments() -> list[str]:
        """The sentences the engine read since the last look (a request's sentences that need
        their alignment and those that do not are decoded apart)."""
        nonlocal seen
        calls, seen = fake.calls[seen:], len(fake.calls)
        return ["".join(chr(i) for i in ids[:-1]) for sources, _ in calls for ids in sources]

    base = {"source_lang": "EN", "target_lang": "DE"}
    html = "<div>A dog <span>runs fast</span> now.<div>Two</div> cats.</div>"
    body = {**base, "text": [html], "tag_handling": "html", "splitting_tags": ["span"]}
    segments()
    response = await deepl.post(
        "/v2/translate", json={**body, "non_splitting_tags": "div"}, headers=KEY
    )
    assert response.json()["translations"][0]["text"] == (
        "<div>A DOG <span>RUNS FAST</span> NOW.<div>TWO</div> CATS.</div>"
    )
    assert sorted(segments()) == ["A dog", "now.Two cats.", "runs fast"]
    xml = "<r><p><b>A dog</b> <i>runs.</i></p></r>"
    form = {**base, "text": xml, "tag_handling": "xml"}
    response = await deepl.post("/v2/translate", data=form, headers=KEY)
    assert sorted(segments()) == ["A dog", "runs."]  # two runs: nothing but elements
    response = await deepl.post(
        "/v2/translate", data={**form, "non_splitting_tags": "b"}, headers=KEY
    )
    assert segments() == ["A dog runs."]
    assert response.json()["translations"][0]["text"] == "<r><p><b>A DOG</b> <i>RUNS</i>.</p></r>"


async def test_the_key_in_the_header_or_the_auth_key_field(deepl: httpx.AsyncClient) -> None:
    form = {"text": "A dog.", "target_lang": "DE"}
    assert (await deepl.post("/v2/translate", data={**form, "auth_key": "k2"})).status_code == 200
    assert (await deepl.post("/v2/translate?auth_key=k2", data=form)).status_code == 200
    response = await deepl.post("/v2/translate?auth_key=k2", json={**form, "text": ["A dog."]})
    assert response.status_code == 200  # a JSON body's fields over the query's
    for headers in ({}, {"Authorization": "DeepL-Auth-Key nope"}, {"Authorization": "k1"}):
        response = await deepl.post("/v2/translate", data=form, headers=headers)
        assert message(response, 403)
        assert "www-authenticate" not in response.headers
    # A body that cannot be read tells a client without a key only that it has none.
    broken = {"content-type": "application/json"}
    response = await deepl.post("/v2/translate", content=b"{", headers=broken)
    assert response.status_code == 403
    response = await deepl.post("/v2/translate", content=b"{", headers={**broken, **KEY})
    assert "JSON" in message(response, 400)
    assert (await deepl.get("/v2/languages")).status_code == 403
    assert (await deepl.get("/v2/usage")).status_code == 403


async def test_languages_as_sources_and_as_targets(deepl: httpx.AsyncClient) -> None:
    response = await deepl.get("/v2/languages", headers=KEY)
    assert response.json() == [
        {"language": "DE", "name": "German"},
        {"language": "EN", "name": "English"},
    ]
    # As the Python client asks: a GET with a form body; a POST with a query too.
    target = await deepl.request("GET", "/v2/languages", data={"type": "target"}, headers=KEY)
    assert target.json() == [
        {"language": "DE", "name": "German", "supports_formality": False},
        {"language": "EN", "name": "English", "supports_formality": False},
        {"language": "EN-GB", "name": "English (British)", "supports_formality": False},
        {"language": "EN-US", "name": "English (American)", "supports_formality": False},
    ]
    assert (await deepl.post("/v2/languages?type=target", headers=KEY)).json() == target.json()
    response = await deepl.get("/v2/languages?type=both", headers=KEY)
    assert "'source' and 'target'" in message(response, 400)


async def test_nllbs_codes_are_deepls() -> None:
    """FLORES codes as DeepL's: ISO 639-1, Chinese by script."""
    model = FakeModel("eng_Latn", "deu_Latn", more_targets=("zho_Hans", "zho_Hant"))
    async with running(create_app(fast_settings(), models=[model])) as client:
        response = await client.get("/v2/languages?type=target")
        assert [(lang["language"], lang["name"]) for lang in response.json()] == [
            ("DE", "German"),
            ("ZH", "Chinese"),
            ("ZH-HANS", "Chinese (simplified)"),
            ("ZH-HANT", "Chinese (traditional)"),
        ]
        for target, served in (("de", "deu_Latn"), ("ZH", "zho_Hans"), ("zh-hant", "zho_Hant")):
            form = {"text": "A dog.", "source_lang": "EN", "target_lang": target}
            response = await client.post("/v2/translate", data=form)
            assert response.json()["translations"] == [
                {"detected_source_language": "EN", "text": "A DOG."}
            ]
            assert model.encoded_for[-1] == served
        response = await client.post("/v2/translate", data={"text": "A dog.", "target_lang": "DE"})
        assert response.json()["translations"][0]["detected_source_language"] == "EN"


async def test_usage_counts_each_keys_characters(deepl: httpx.AsyncClient) -> None:
    await deepl.post(
        "/v2/translate", data={"text": ["A dog.", "Hi"], "target_lang": "DE"}, headers=KEY
    )
    other = {"Authorization": "DeepL-Auth-Key k2"}
    await deepl.post("/v2/translate", data={"text": "Fish", "target_lang": "DE"}, headers=other)
    response = await deepl.get("/v2/usage", headers=KEY)
    assert response.json() == {"character_count": 8, "character_limit": 1_000_000_000_000}
    assert (await deepl.post("/v2/usage", data={"auth_key": "k2"})).json()["character_count"] == 4


async def test_size_limits_are_413_and_a_full_queue_429(fake: FakeModel) -> None:
    settings = fast_settings(max_body_bytes=200, max_characters=30, max_queue_segments=2)
    app = create_app(settings, models=[fake])
    async with running(app) as client:
        response = await client.post("/v2/translate", data={"text": "a" * 300, "target_lang": "DE"})
        assert "larger than the limit" in message(response, 413)
        response = await client.post("/v2/translate", data={"text": "a" * 40, "target_lang": "DE"})
        assert "max_characters" in message(response, 413)
        runtime: Runtime = app.state.runtime
        fake.gate, fake.entered = threading.Event(), threading.Event()
        form: dict[str, Any] = {"source_lang": "EN", "target_lang": "DE"}
        try:
            busy = asyncio.ensure_future(client.post("/v2/translate", data={**form, "text": "a"}))
            await asyncio.to_thread(fake.entered.wait, 5)
            queued = asyncio.ensure_future(
                client.post("/v2/translate", data={**form, "text": "B\nC"})
            )
            await async_wait_for(lambda: runtime.batchers[fake.name].depth == 2)
            response = await client.post("/v2/translate", data={**form, "text": "d"})
            assert message(response, 429)
            assert response.headers["retry-after"] == "2"
        finally:
            fake.gate.set()
        assert [(await r).status_code for r in (busy, queued)] == [200, 200]


async def test_a_setting_moves_deepls_api_or_turns_it_off(fake: FakeModel) -> None:
    form = {"text": "A dog.", "target_lang": "DE"}
    async with running(create_app(fast_settings(deepl_prefix="/deepl/"), models=[fake])) as c:
        assert (await c.post("/deepl/v2/translate", data=form)).status_code == 200
        response = await c.post("/v2/translate", data=form)
        assert response.status_code == 404 and "error" in response.json()
        assert message(await c.get("/deepl/v2/nothing"), 404)
    async with running(create_app(fast_settings(deepl=False), models=[fake])) as c:
        response = await c.post("/v2/translate", data=form)
        assert response.status_code == 404 and "error" in response.json()


# --- Glossaries and documents ------------------------------------------------------------------

K2 = {"Authorization": "DeepL-Auth-Key k2"}
CREATED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


async def test_v2_glossaries_are_the_services_own(
    deepl: httpx.AsyncClient, fake: FakeModel
) -> None:
    """Made from TSV (a form) or CSV (JSON), listed, read, their entries as TSV, used by
    /v2/translate, another key's a 404, deleted; the same glossaries as /glossaries."""
    form = {"name": "shop", "source_lang": "EN", "target_lang": "DE", "entries_format": "tsv",
            "entries": "bike\tRAD\ncar\tWAGEN"}  # fmt: skip
    made = await deepl.post("/v2/glossaries", data=form, headers=KEY)
    assert made.status_code == 201, made.text
    glossary = made.json()
    assert re.fullmatch(CREATED, glossary.pop("creation_time"))
    id = glossary.pop("glossary_id")
    assert glossary == {"name": "shop", "ready": True, "source_lang": "en", "target_lang": "de",
                        "entry_count": 2}  # fmt: skip
    csv = {**form, "name": "csv", "entries_format": "csv", "entries": 'car,"WAGEN, AUTO",en,de'}
    assert (await deepl.post("/v2/glossaries", json=csv, headers=KEY)).status_code == 201
    listed = (await deepl.get("/v2/glossaries", headers=KEY)).json()["glossaries"]
    assert [(g["name"], g["entry_count"]) for g in listed] == [("shop", 2), ("csv", 1)]
    assert (await deepl.get(f"/v2/glossaries/{id}", headers=KEY)).json()["glossary_id"] == id
    native = await deepl.get(f"/glossaries/{id}", headers={"X-API-Key": "k1"})
    assert native.json()["entry_count"] == 2
    entries = await deepl.get(f"/v2/glossaries/{id}/entries", headers=KEY)
    assert entries.headers["content-type"] == "text/tab-separated-values; charset=utf-8"
    assert entries.text == "bike\tRAD\ncar\tWAGEN"
    fake.constraints.clear()
    body = {"text": "a bike", "source_lang": "EN", "target_lang": "DE", "glossary_id": id}
    assert (await deepl.post("/v2/translate", data=body, headers=KEY)).status_code == 200
    (sentences,) = [c for c in fake.constraints if any(c)]
    assert [c.terms for c in sentences] == [(tuple(map(ord, "RAD")),)]
    for path in (f"/v2/glossaries/{id}", f"/v2/glossaries/{id}/entries"):
        assert message(await deepl.get(path, headers=K2), 404) == f"Glossary '{id}' not found."
    other = await deepl.post("/v2/translate", data=body, headers=K2)
    assert message(other, 404) == f"Glossary '{id}' not found."
    assert (await deepl.delete(f"/v2/glossaries/{id}", headers=K2)).status_code == 404
    assert (await deepl.delete(f"/v2/glossaries/{id}", headers=KEY)).status_code == 204
    assert (await deepl.get(f"/v2/glossaries/{id}", headers=KEY)).status_code == 404
    pairs = (await deepl.get("/v2/glossary-language-pairs", headers=KEY)).json()
    de_en, en_de = pairs["supported_languages"]
    assert (de_en, en_de) == (
        {"source_lang": "de", "target_lang": "en"},
        {"source_lang": "en", "target_lang": "de"},
    )
    assert (await deepl.get("/v2/glossaries")).status_code == 403


BAD_GLOSSARIES = [
    ({"source_lang": "EN", "target_lang": "DE", "entries_format": "tsv"},
     "Missing or invalid argument: name"),
    ({"name": "g", "source_lang": "EN", "target_lang": "DE", "entries_format": "xlsx",
      "entries": "a\tb"}, "Unsupported entry format specified"),
    ({"name": "g", "target_lang": "DE", "entries_format": "tsv", "entries": "a\tb"},
     "Missing or invalid argument: source_lang"),
    ({"name": "g", "source_lang": "EN", "target_lang": "FR", "entries_format": "tsv",
      "entries": "a\tb"}, "Value for 'target_lang' not supported."),
    ({"name": "g", "source_lang": "EN", "target_lang": "DE", "entries_format": "tsv",
      "entries": "a\tb\tc"}, "line 1: 3 fields"),
]  # fmt: skip


async def test_a_bad_glossary_is_deepls_400(deepl: httpx.AsyncClient) -> None:
    for fields, expected in BAD_GLOSSARIES:
        response = await deepl.post("/v2/glossaries", data=fields, headers=KEY)
        assert expected in message(response, 400), fields


async def test_v3_glossaries_of_one_dictionary(deepl: httpx.AsyncClient) -> None:
    dictionary = {"source_lang": "de", "target_lang": "en", "entries": "Rad\tbike",
                  "entries_format": "tsv"}  # fmt: skip
    made = await deepl.post(
        "/v3/glossaries", json={"name": "m", "dictionaries": [dictionary]}, headers=KEY
    )
    assert made.status_code == 201, made.text
    glossary = made.json()
    id = glossary["glossary_id"]
    assert re.fullmatch(CREATED, glossary["creation_time"])
    assert glossary["dictionaries"] == [
        {"source_lang": "de", "target_lang": "en", "entry_count": 1}
    ]
    listed = (await deepl.get("/v3/glossaries", headers=KEY)).json()["glossaries"]
    assert [g["glossary_id"] for g in listed] == [id]
    assert (await deepl.get(f"/v3/glossaries/{id}", headers=KEY)).json() == glossary
    entries = await deepl.get(
        f"/v3/glossaries/{id}/entries", params={"source_lang": "DE", "target_lang": "EN"},
        headers=KEY,
    )  # fmt: skip
    assert entries.json() == {"dictionaries": [{**dictionary, "source_lang": "de"}]}
    wrong = await deepl.get(
        f"/v3/glossaries/{id}/entries", params={"source_lang": "en", "target_lang": "de"},
        headers=KEY,
    )  # fmt: skip
    assert message(wrong, 404) == "The glossary has no dictionary en -> de"
    two = {"name": "m", "dictionaries": [dictionary, dictionary]}
    assert "one dictionary" in message(
        await deepl.post("/v3/glossaries", json=two, headers=KEY), 400
    )
    assert (await deepl.delete(f"/v3/glossaries/{id}", headers=KEY)).status_code == 204
    assert (await deepl.get(f"/v2/glossaries/{id}", headers=KEY)).status_code == 404


SRT = b"1\n00:00:01,000 --> 00:00:02,000\nA dog runs.\n"


async def test_a_document_uploaded_polled_and_downloaded_once(
    deepl: httpx.AsyncClient, fake: FakeModel
) -> None:
    fake.gate = threading.Event()  # held: the first answers are before it is done
    fields = {"source_lang": "EN", "target_lang": "DE"}
    sent = await deepl.post(
        "/v2/document", files={"file": ("talk.srt", SRT)}, data=fields, headers=KEY
    )
    assert sent.status_code == 200, sent.text
    handle = sent.json()
    assert set(handle) == {"document_id", "document_key"}
    id, key = handle["document_id"], {"document_key": handle["document_key"]}
    assert re.fullmatch("[0-9a-f]{32}", key["document_key"]) and key["document_key"] != id
    early = await deepl.post(f"/v2/document/{id}/result", json=key, headers=KEY)
    assert message(early, 503) == "Document translation is not done"
    status = (await deepl.post(f"/v2/document/{id}", json=key, headers=KEY)).json()
    assert status["document_id"] == id and status["status"] in ("queued", "translating")
    for wrong in ({"document_key": "0" * 32}, {}):
        answer = await deepl.post(f"/v2/document/{id}", json=wrong, headers=KEY)
        assert message(answer, 404) == "Document not found"
    fake.gate.set()

    for _ in range(500):
        status = (await deepl.post(f"/v2/document/{id}", data=key, headers=KEY)).json()
        if status["status"] == "done":
            break
        await asyncio.sleep(0.02)
    billed = status.pop("billed_characters")
    assert status == {"document_id": id, "status": "done"}
    result = await deepl.post(f"/v2/document/{id}/result", json=key, headers=KEY)
    assert result.content == SRT.replace(b"A dog runs.", b"A DOG RUNS.")
    again = await deepl.post(f"/v2/document/{id}/result", json=key, headers=KEY)
    assert message(again, 404) == "Document not found"  # DeepL's: removed once downloaded
    usage = (await deepl.get("/v2/usage", headers=KEY)).json()
    assert usage["character_count"] == billed >= len("A dog runs.")  # what was charged


BAD_UPLOADS = [
    ({"source_lang": "EN"}, "Parameter 'target_lang' not specified."),
    ({"target_lang": "FR"}, "Value for 'target_lang' not supported."),
    ({"target_lang": "DE", "glossary_id": "g"},
     "Use of a glossary requires the source_lang parameter to be specified"),
    ({"target_lang": "DE", "output_format": "pdf"},
     "Value for 'output_format' not supported: a document is translated into its own format."),
]  # fmt: skip


async def test_a_bad_document_upload_is_deepls_400(deepl: httpx.AsyncClient) -> None:
    wrong_key = {"Authorization": "DeepL-Auth-Key nope"}
    for fields, expected in BAD_UPLOADS:
        file = {"file": ("talk.srt", SRT)}
        answer = await deepl.post("/v2/document", files=file, data=fields, headers=KEY)
        assert message(answer, 400) == expected
        refused = await deepl.post("/v2/document", files=file, data=fields, headers=wrong_key)
        assert refused.status_code == 403  # the key before the fields
    glossary = {"target_lang": "DE", "source_lang": "EN", "glossary_id": "g"}
    answer = await deepl.post("/v2/document", files=file, data=glossary, headers=KEY)
    assert message(answer, 404) == "Glossary 'g' not found."
    unknown = await deepl.post(
        "/v2/document", files={"file": ("talk.xyz", SRT)}, data={"target_lang": "DE"}, headers=KEY
    )
    assert "supported: docx" in message(unknown, 400)
