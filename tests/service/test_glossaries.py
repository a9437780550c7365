"""Glossaries (service/glossaries.py, service/http/glossaries.py): made from entries, TSV or
CSV, listed, read back, deleted, owned by an API key, kept in a directory across restarts;
bad input named; a request's glossary matched by words (service/text/terms.py) and handed to
the search as constraints."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.errors import ServiceError
from service.glossaries import Entry
from service.http.app import create_app
from service.inference.engine import Engine
from service.text import pipeline, terms
from service.text.terms import Terms
from service.translate import read_glossary, translate_lines
from tests.service.helpers import FakeModel, fast_settings, running

pytestmark = pytest.mark.anyio
SHOP = {"name": "shop", "source": "en", "target": "de"}


def entries_of(response: httpx.Response) -> Any:
    return response.json()["entries"]


async def test_made_from_entries_tsv_and_csv_listed_read_deleted() -> None:
    async with running(create_app(fast_settings(), models=[FakeModel()])) as client:
        made = await client.post(
            "/glossaries",
            json={**SHOP, "entries": [{"source": "checkout", "target": "Kasse"}]},
        )
        assert made.status_code == 201 and made.json()["entry_count"] == 1
        tsv = await client.post(
            "/glossaries", json={**SHOP, "entries": "bike\tRad\n\n dog \tHund\n"}
        )
        csv = await client.post(
            "/glossaries",
            json={**SHOP, "entries": '"a, b",Ab\nc,"D ""e"""\nf,g,en,de', "entries_format": "csv"},
        )
        assert tsv.status_code == csv.status_code == 201
        ids = [r.json()["glossary_id"] for r in (made, tsv, csv)]
        listed = (await client.get("/glossaries")).json()["glossaries"]
        assert [g["glossary_id"] for g in listed] == ids
        read = await client.get(f"/glossaries/{ids[2]}/entries")
        assert [(e["source"], e["target"]) for e in entries_of(read)] == [
            ("a, b", "Ab"), ("c", 'D "e"'), ("f", "g")
        ]  # fmt: skip
        assert [
            e["source"] for e in entries_of(await client.get(f"/glossaries/{ids[1]}/entries"))
        ] == ["bike", "dog"]
        assert (await client.delete(f"/glossaries/{ids[0]}")).status_code == 204
        assert (await client.get(f"/glossaries/{ids[0]}")).status_code == 404
        assert (await client.delete(f"/glossaries/{ids[0]}")).status_code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"entries": [{"source": "bike", "target": " "}]},
            "entry 0 ('bike' -> ' '): a term is empty",
        ),
        (
            {"entries": "bike\tRad\ndog\tHund\nBike\tFahrrad"},
            "entry 2 ('Bike' -> 'Fahrrad'): its source term is already translated as 'Rad'",
        ),
        ({"entries": "a\tb\tc"}, "line 1: 3 fields"),
        ({"entries": "a,b,en,fr", "entries_format": "csv"}, "line 1: its languages en -> fr"),
        ({"entries": "a\tb\nc\td\ne\tf\ng\th"}, "4 entries; the limit is 3"),
        ({"entries": "snow\tSchnee☃"}, "entry 0 ('snow' -> 'Schnee☃'): fake-en-de cannot spell"),
        ({"target": "fr", "entries": "a\tb"}, "no model translates en -> fr"),
    ],
)
async def test_bad_entries_are_refused_naming_the_entry(body: dict[str, Any], message: str) -> None:
    async with running(
        create_app(fast_settings(max_glossary_entries=3), models=[FakeModel()])
    ) as client:
        response = await client.post("/glossaries", json={**SHOP, **body})
        assert response.status_code in (404, 422) and message in response.text
        assert (await client.get("/glossaries")).json()["glossaries"] == []


async def test_a_glossary_belongs_to_its_key_and_keys_have_a_bound(tmp_path: Path) -> None:
    settings = fast_settings(api_keys="k1,k2", max_glossaries_per_key=1, glossary_dir=tmp_path)
    one, two = {"X-API-Key": "k1"}, {"X-API-Key": "k2"}
    body = {**SHOP, "entries": "bike\tRad"}
    async with running(create_app(settings, models=[FakeModel()])) as client:
        assert (await client.post("/glossaries", json=body)).status_code == 401
        made = (await client.post("/glossaries", json=body, headers=one)).json()
        again = await client.post("/glossaries", json=body, headers=one)
        assert again.status_code == 422 and "max_glossaries_per_key" in again.text
        assert (
            await client.get(f"/glossaries/{made['glossary_id']}", headers=two)
        ).status_code == 404
        assert (await client.get("/glossaries", headers=two)).json()["glossaries"] == []
        translate = {"text": "a bike", "source": "en", "target": "de"}
        other = await client.post(
            "/translate", json={**translate, "glossary_id": made["glossary_id"]}, headers=two
        )
        assert other.status_code == 404
    assert "k1" not in "".join(p.read_text() + str(p) for p in tmp_path.rglob("*") if p.is_file())
    # A restart finds it in the directory.
    async with running(create_app(settings, models=[FakeModel()])) as client:
        listed = (await client.get("/glossaries", headers=one)).json()["glossaries"]
        assert [g["glossary_id"] for g in listed] == [made["glossary_id"]]


async def test_a_translation_hands_its_terms_to_the_search_with_a_beam() -> None:
    fake = FakeModel()
    async with running(create_app(fast_settings(), models=[fake, FakeModel("de", "en")])) as client:
        made = (await client.post("/glossaries", json={**SHOP, "entries": "bike\tRAD"})).json()
        body = {"text": "a bike, bikes. A BIKE", "source": "en", "target": "de", "beam_size": 1}
        fake.constraints.clear()
        ok = await client.post("/translate", json={**body, "glossary_id": made["glossary_id"]})
        assert ok.status_code == 200
        (sentences,) = [c for c in fake.constraints if any(c)]  # the renderings' call has none
        rad = tuple(map(ord, "RAD"))
        assert [c.terms for c in sentences] == [(rad,), (rad,)]  # "bikes" is another word
        assert fake.calls[-1][1].beam_size == 4
        entries = [{"source": "bike", "target": "RAD"}]
        libre = {"q": "a bike", "source": "en", "target": "de", "glossary": entries}
        inline = await client.post("/libretranslate/translate", json=libre)
        assert inline.status_code == 200
        wrong = await client.post(
            "/translate",
            json={**body, "source": "de", "target": "en", "glossary_id": made["glossary_id"]},
        )
        assert wrong.status_code == 422 and "is for en -> de, not de -> en" in wrong.text
        unknown = await client.post("/translate", json={**body, "glossary_id": "0" * 32})
        assert unknown.status_code == 404
        both = await client.post(
            "/translate", json={**body, "glossary_id": made["glossary_id"], "glossary": []}
        )
        assert both.status_code == 422


async def test_a_document_names_a_glossary_and_its_terms_reach_the_search(
    tmp_path: Path,
) -> None:
    """POST /documents and LibreTranslate's /translate_file take a glossary_id: checked when the
    file is sent (another key's or pair's is refused then), its entries kept with the job and
    enforced in each paragraph's search."""
    fake = FakeModel()
    settings = fast_settings(documents_dir=tmp_path, api_keys="k1,k2")
    models = [fake, FakeModel("de", "en")]
    async with running(create_app(settings, models=models)) as client:
        mine = {"X-API-Key": "k1"}
        made = await client.post("/glossaries", json={**SHOP, "entries": "bike\tRAD"}, headers=mine)
        glossary_id = made.json()["glossary_id"]
        files = {"file": ("a.txt", b"A bike waits.\n", "text/plain")}
        form = {"source": "en", "target": "de", "glossary_id": glossary_id}
        fake.constraints.clear()
        sent = await client.post("/documents", data=form, files=files, headers=mine)
        assert sent.status_code == 202, sent.text
        for _ in range(200):
            status = (await client.get(f"/documents/{sent.json()['id']}", headers=mine)).json()
            if status["status"] == "done":
                break
            await asyncio.sleep(0.02)
        assert status["status"] == "done", status
        (sentences,) = [c for c in fake.constraints if any(c)]
        assert [c.terms for c in sentences] == [(tuple(map(ord, "RAD")),)]
        theirs = await client.post(
            "/documents", data=form, files=files, headers={"X-API-Key": "k2"}
        )
        assert theirs.status_code == 404  # another key's glossary is not found
        reverse = {**form, "source": "de", "target": "en"}
        wrong = await client.post("/documents", data=reverse, files=files, headers=mine)
        assert wrong.status_code == 422 and "is for en -> de" in wrong.text


def test_matching_by_words_case_longest_first_and_token_boundaries() -> None:
    glossary = Terms(
        [
            Entry("bike", "Rad"),
            Entry("mountain bike", "Mountainbike"),
            Entry("US", "USA", case_sensitive=True),
        ]
    )
    sentences = ["A Mountain Bike and a bike.", "bikes, us, US", "e-bike"]
    found = glossary.matches(FakeModel(), sentences)
    assert [[e.target for e in own] for own in found] == [
        ["Mountainbike", "Rad"], ["USA"], ["Rad"]
    ]  # fmt: skip


def test_the_shipped_model_writes_the_glossarys_terms_in_place(shipped_engine: Engine) -> None:
    """In the sentence, not beside the model's own word for it; a tag around the source term
    is around the target term (placed by the alignment as any tag)."""
    engine = shipped_engine
    glossary = Terms([Entry("bike", "Rad"), Entry("woman", "Dame"), Entry("street", "Gasse")])

    def rendering(term: str) -> str:  # greedy, as the runtime translates a term alone
        greedy = pipeline.DecodingOptions(max_length_a=3, max_length_b=10)
        return engine.decode(engine.generate(engine.encode([term]), greedy)[0][0].ids)

    def translate(texts: list[str], format: pipeline.Format = "text") -> list[str]:
        prepared = pipeline.prepare(
            engine, texts, None, max_segment_characters=1000, terms=glossary, format=format
        )
        options = prepared.decoding(pipeline.DecodingOptions(beam_size=1, alignments=True))
        assert options.beam_size == pipeline.TERMS_BEAM
        constraints = terms.constraints(engine, prepared.matched, rendering)
        nbest = engine.generate(prepared.sources, options, constraints=constraints)
        return [r.texts[0] for r in pipeline.assemble(engine, prepared, nbest, 1)]

    texts = ["A man is riding a bike.", "A woman in a red dress walks down the street."]
    assert translate(texts) == [
        "Ein Mann fährt auf einem Rad.",
        "Eine Dame in einem roten Kleid geht die Gasse entlang.",
    ]
    assert translate(["<p>A man is riding a <b>bike</b>.</p>"], "html") == [
        "<p>Ein Mann fährt auf einem <b>Rad</b>.</p>"
    ]


def test_terms_the_model_already_writes_leave_its_translation_as_it_was(
    shipped_engine: Engine,
) -> None:
    """Where the plain beam search's translation already holds each term, the constrained
    search returns it: beams shared evenly among term progress lost it in the first steps
    ("Ein Mann in einem orangefarbenen Hemd und mit Helm.", "... auf dem Feld" without its full
    stop), and the model's articles avoided beside a term it already says ("eines", "einer"
    from "Dach eines Dachs." and "Eine Jacke in einer Jacke.") changed the rest; and the model
    writes "antikes" as "ant" + "ik" + "es", the glossary's pieces are "ant" + "ikes" (not
    counted as the term, it was written a second time: "... herum, das ein antikes Rennauto
    steht. antikes ist.")."""
    engine = shipped_engine
    entries = [("man", "Mann"), ("field", "Feld"), ("dog", "Hund"), ("roof", "Dach"),
               ("jacket", "Jacke"), ("chair", "Stuhl"), ("antique", "antikes")]  # fmt: skip
    texts = [
        "A man wearing an orange shirt and helmet.",
        "Two soccer teams are on the field.",
        "A brown dog about to catch a green Frisbee.",
        "People are fixing the roof of a house.",
        "A woman in an orange jacket sits on a bench.",
        "A man in a vest is sitting in a chair and holding magazines.",
        "Several men standing around an antique race car",
    ]
    greedy = pipeline.DecodingOptions(max_length_a=3, max_length_b=10)
    sources = [source for source, _ in entries]
    alone = engine.generate(engine.encode(sources), greedy)
    rendering = dict(zip(sources, (engine.decode(h[0].ids) for h in alone), strict=True))

    def translate(glossary: Terms | None) -> list[str]:
        prepared = pipeline.prepare(
            engine, texts, None, max_segment_characters=1000, terms=glossary
        )
        matched = prepared.matched if glossary else []
        constraints = terms.constraints(engine, matched, rendering.__getitem__) or None
        options = pipeline.DecodingOptions(beam_size=4)
        nbest = engine.generate(prepared.sources, options, constraints=constraints)
        return [r.texts[0] for r in pipeline.assemble(engine, prepared, nbest, 1)]

    plain = translate(None)
    for text, out in zip(texts, plain, strict=True):  # each term is in the plain translation
        for source, target in entries:
            assert not re.search(rf"\b{source}\b", text) or re.search(rf"\b{target}\b", out)
    assert translate(Terms([Entry(*entry) for entry in entries])) == plain


def test_the_file_cli_reads_a_glossary_file(shipped_bundle: Path, tmp_path: Path) -> None:
    engine = Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)
    path = tmp_path / "shop.csv"
    path.write_text('bike,Rad\n"street",Gasse,en,de\n', encoding="utf-8")
    glossary = read_glossary(path, engine, ("en", "de"), 10)
    out = io.StringIO()
    lines = ["A man is riding a bike.", "Two dogs play in the snow."]
    options = pipeline.DecodingOptions(beam_size=4, max_length_a=3, max_length_b=10)
    translate_lines(engine, lines, options, out=out, max_segment_characters=1000, glossary=glossary)
    assert out.getvalue() == "Ein Mann fährt auf einem Rad.\nZwei Hunde spielen im Schnee.\n"
    bad = tmp_path / "bad.tsv"
    bad.write_text("snow\t雪\n", encoding="utf-8")
    with pytest.raises(ServiceError, match=r"entry 0 .* cannot spell"):
        read_glossary(bad, engine, ("en", "de"), 10)
    with pytest.raises(ValueError, match="--glossary"):
        read_glossary(tmp_path / "missing.tsv", engine, ("en", "de"), 10)
