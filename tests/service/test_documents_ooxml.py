"""docx, pptx and xlsx through POST /documents with the shipped en->de model, files built with
python-docx, python-pptx and openpyxl and read back with them: the output opens, has the same
structure, each paragraph's text is the plain translation of its text (POST /translate), each
formatted run of the source is one run with the same formatting on the words the markup path
places it on, and every part that holds no text is byte for byte the source's."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docx
import httpx
import openpyxl
import pptx
import pytest
from docx.shared import RGBColor
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from service.documents.base import Limits, read_inline
from service.documents.formats import ooxml
from service.http.app import create_app
from tests.service.helpers import fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}
# (before, formatting, formatted words, after): Multi30k-like sentences, 1-3 words formatted.
SENTENCES = [
    ("A man pulling ", "bold", "some luggage", " at the airport."),
    ("Two ", "italic", "young girls", " are playing in the park."),
    ("A dog runs through the ", "color", "green grass", ". A man sits on a bench."),
]


@pytest.fixture
async def client(shipped_bundle: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = fast_settings(bundle=[shipped_bundle], documents_dir=tmp_path)
    async with running(create_app(settings)) as client:
        yield client


async def translate_file(client: httpx.AsyncClient, name: str, data: bytes) -> bytes:
    response = await client.post("/documents", files={"file": (name, data)}, data=EN_DE)
    assert response.status_code == 202, response.text
    id = response.json()["id"]
    for _ in range(600):
        status = (await client.get(f"/documents/{id}")).json()
        if status["status"] in ("done", "error"):
            break
        await asyncio.sleep(0.05)
    assert status["status"] == "done", status
    assert status["progress"]["done"] == status["progress"]["total"] > 0
    return (await client.get(f"/documents/{id}/result")).content


async def plain(client: httpx.AsyncClient, texts: list[str], format: str = "text") -> list[str]:
    body = {"text": texts, "format": format, **EN_DE}
    response = await client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    return [t["text"] for t in response.json()["translations"]]


async def placed(client: httpx.AsyncClient, before: str, words: str, after: str) -> str:
    """The words the markup path puts a tag around in this sentence's translation."""
    (xml,) = await plain(client, [f"<p>{before}<c0>{words}</c0>{after}</p>"], "xml")
    return next(str(c.children[0]) for c in read_inline(xml) if not isinstance(c, str))


def unchanged_parts(before: bytes, after: bytes, changed: set[str]) -> None:
    old, new = zipfile.ZipFile(io.BytesIO(before)), zipfile.ZipFile(io.BytesIO(after))
    assert new.namelist() == old.namelist()
    for info in old.infolist():
        if info.filename not in changed:
            assert new.read(info.filename) == old.read(info.filename), info.filename
        assert new.getinfo(info.filename).compress_type == info.compress_type


def formatted(run: Any, how: str) -> bool:
    if how == "bold":
        return bool(run.bold)
    if how == "italic":
        return bool(run.italic)
    return run.font.color.type is not None and run.font.color.rgb == RGBColor(0xFF, 0, 0)


def make_docx() -> bytes:
    document = docx.Document()
    for before, how, words, after in SENTENCES:
        paragraph = document.add_paragraph(before)
        run = paragraph.add_run(words)
        if how == "bold":
            run.bold = True
        elif how == "italic":
            run.italic = True
        else:
            run.font.color.rgb = RGBColor(0xFF, 0, 0)
        paragraph.add_run(after)
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "A woman is reading a book."
    table.cell(0, 1).text = "1,234.5"
    document.sections[0].header.paragraphs[0].text = "A boy jumps into the water."
    document.sections[0].footer.paragraphs[0].text = "Three people walk down the street."
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


async def test_docx_paragraphs_tables_headers_footers_and_runs(
    client: httpx.AsyncClient,
) -> None:
    sent = make_docx()
    result = await translate_file(client, "story.docx", sent)
    source, target = docx.Document(io.BytesIO(sent)), docx.Document(io.BytesIO(result))
    assert len(target.paragraphs) == len(source.paragraphs)
    expected = await plain(client, [p.text for p in source.paragraphs])
    assert [p.text for p in target.paragraphs] == expected
    for (before, how, words, after), paragraph in zip(SENTENCES, target.paragraphs, strict=False):
        runs = [run for run in paragraph.runs if formatted(run, how)]
        assert len(runs) == 1, [(r.text, how) for r in paragraph.runs]
        assert runs[0].text == await placed(client, before, words, after)
    cells = [c.text for c in target.tables[0].rows[0].cells]
    assert cells == [*(await plain(client, ["A woman is reading a book."])), "1,234.5"]
    section = target.sections[0]
    assert [section.header.paragraphs[0].text, section.footer.paragraphs[0].text] == await plain(
        client, ["A boy jumps into the water.", "Three people walk down the street."]
    )
    unchanged_parts(sent, result, {"word/document.xml", "word/header1.xml", "word/footer1.xml"})


async def test_the_file_cli_writes_what_the_api_answers(
    client: httpx.AsyncClient, shipped_bundle: Path, tmp_path: Path
) -> None:
    sent = make_docx()
    (tmp_path / "in.docx").write_bytes(sent)
    command = [sys.executable, "-m", "service.translate", "--bundle", str(shipped_bundle)]
    command += ["--file", str(tmp_path / "in.docx"), "--out", str(tmp_path / "out.docx")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.docx").read_bytes() == await translate_file(client, "in.docx", sent)
    (tmp_path / "in.pdf").write_bytes(b"%PDF-1.4")
    command[-3:] = [str(tmp_path / "in.pdf"), "--out", str(tmp_path / "out.pdf")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "PDF" in refused.stderr


async def test_pptx_slides_and_speaker_notes(client: httpx.AsyncClient) -> None:
    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "A dog catches a ball."
    body = slide.placeholders[1].text_frame
    body.text = "Two "
    run = body.paragraphs[0].add_run()
    run.text, run.font.italic = "young girls", True
    body.paragraphs[0].add_run().text = " are playing in the park."
    slide.notes_slide.notes_text_frame.text = "A man sits on a bench."
    out = io.BytesIO()
    presentation.save(out)
    sent = out.getvalue()
    result = await translate_file(client, "talk.pptx", sent)
    translated = pptx.Presentation(io.BytesIO(result)).slides[0]
    texts = [translated.shapes.title.text, translated.placeholders[1].text_frame.text]
    notes = translated.notes_slide.notes_text_frame.text
    expected = await plain(
        client,
        [
            "A dog catches a ball.",
            "Two young girls are playing in the park.",
            "A man sits on a bench.",
        ],
    )
    assert [*texts, notes] == expected
    runs = translated.placeholders[1].text_frame.paragraphs[0].runs
    italic = [r.text for r in runs if r.font.italic]
    assert italic == [await placed(client, "Two ", "young girls", " are playing in the park.")]
    unchanged_parts(sent, result, {"ppt/slides/slide1.xml", "ppt/notesSlides/notesSlide1.xml"})


async def test_xlsx_strings_are_translated_and_numbers_dates_formulas_kept(
    client: httpx.AsyncClient,
) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["A dog runs.", 3.5, "=B1*2"])
    sheet.append(["Two men talk.", "2024-01-01"])
    out = io.BytesIO()
    book.save(out)
    sent = out.getvalue()
    result = await translate_file(client, "table.xlsx", sent)
    rows = [[c.value for c in row] for row in openpyxl.load_workbook(io.BytesIO(result)).active]
    one, two = await plain(client, ["A dog runs.", "Two men talk."])
    assert rows == [[one, 3.5, "=B1*2"], [two, "2024-01-01", None]]
    # openpyxl writes its strings inline, in the sheet (shared strings: the test below).
    unchanged_parts(sent, result, {"xl/worksheets/sheet1.xml"})


W = ooxml.W
# A paragraph with what is not text: a hyperlink around a bold run, a PAGE field, a tab, a
# bookmark, a text box (its own paragraph inside a drawing), and a footnote reference.
BODY = f"""<w:document xmlns:w="{W}"
 xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"
 xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape"><w:body>
<w:p><w:pPr><w:pStyle w:val="Normal"/></w:pPr><w:bookmarkStart w:id="0" w:name="a"/>
<w:r><w:t xml:space="preserve">See </w:t></w:r><w:hyperlink r:id="rId9"><w:r><w:rPr><w:b/></w:rPr>
<w:t>the page</w:t></w:r></w:hyperlink><w:r><w:tab/><w:t xml:space="preserve"> now </w:t></w:r>
<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText>PAGE</w:instrText></w:r>
<w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>7</w:t></w:r>
<w:r><w:fldChar w:fldCharType="end"/></w:r><w:r><w:t xml:space="preserve"> please.</w:t></w:r>
<w:r><w:drawing><wps:txbx><w:txbxContent><w:p><w:r><w:t>Boxed text.</w:t></w:r></w:p>
</w:txbxContent></wps:txbx></w:drawing></w:r><w:r><w:footnoteReference w:id="1"/></w:r>
<w:bookmarkEnd w:id="0"/></w:p></w:body></w:document>"""


def test_docx_fields_links_tabs_text_boxes_are_codes_and_come_back() -> None:
    """Read into units, written back with the units' own text upper-cased (a translation that
    moves nothing): the hyperlink, its bold run, the field with its result, the tab, the
    drawing with its text box (translated as a paragraph of its own), the footnote reference
    and the bookmarks are all there, in order."""
    sent = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_docx())) as source, zipfile.ZipFile(sent, "w") as z:
        for info in source.infolist():
            body = BODY.encode() if info.filename == "word/document.xml" else source.read(info)
            z.writestr(info, body)
    read = ooxml.DOCX.read(sent.getvalue(), Limits())
    units = [u.text for u in read.units]
    assert "<p>See <c0><c1>the page</c1></c0><c2/> now <c3/> please.</p>" in units
    assert "<p>Boxed text.</p>" in units
    upper = [etree.tostring(_upper(etree.fromstring(u)), encoding="unicode") for u in units]
    out = zipfile.ZipFile(io.BytesIO(read.write(upper))).read("word/document.xml")
    root = etree.fromstring(out)
    paragraph = root.find(f".//{{{W}}}p")
    assert paragraph is not None
    tags = [etree.QName(child).localname for child in paragraph]
    assert tags[:3] == ["pPr", "bookmarkStart", "r"] and tags[-1] == "bookmarkEnd"
    text = "".join("".join(paragraph.itertext()).split())  # the source's line breaks aside
    assert text == "SEETHEPAGENOWPAGE7PLEASE.BOXEDTEXT."
    assert paragraph.find(f"{{{W}}}hyperlink/{{{W}}}r/{{{W}}}rPr/{{{W}}}b") is not None
    assert len(paragraph.findall(f".//{{{W}}}fldChar")) == 3
    assert paragraph.find(f".//{{{W}}}footnoteReference") is not None
    assert paragraph.find(f".//{{{W}}}tab") is not None


def test_plain_text_is_the_base_even_where_formatting_has_most_characters() -> None:
    """A run formatted over most of its paragraph is a code like any other (placed by
    alignment) while the paragraph has plain words: as the base, its formatting went to every
    target word no other run aligned to (a pptx link on the full stop, a bold run split around
    an unaligned word). A paragraph formatted throughout keeps its majority as the base."""
    document = docx.Document()
    for runs in (
        [("A biker jumps", True), (" an obstacle.", False)],  # a tie
        [("A ", False), ("long-haired, male musician", True), (" plays.", False)],
        [("All ", True), ("bold", True), (" here", True)],
        [("Bold", True), (" ", False), ("words", True)],  # a plain space is not a base
    ):
        paragraph = document.add_paragraph()
        for text, bold in runs:
            paragraph.add_run(text).bold = bold or None
    sent = io.BytesIO()
    document.save(sent)
    units = [u.text for u in ooxml.DOCX.read(sent.getvalue(), Limits()).units]
    assert units == [
        "<p><c0>A biker jumps</c0> an obstacle.</p>",
        "<p>A <c0>long-haired, male musician</c0> plays.</p>",
        "<p>All bold here</p>",
        "<p>Bold<c0> </c0>words</p>",
    ]
    presentation = pptx.Presentation()
    frame = presentation.slides.add_slide(presentation.slide_layouts[6]).shapes.add_textbox(
        0, 0, 100, 100
    )
    paragraph = frame.text_frame.paragraphs[0]
    for text, link in (("A ", False), ("long-haired, male musician", True), (" plays.", False)):
        run = paragraph.add_run()
        run.text = text
        if link:
            run.hyperlink.address = "https://example.com/"
    sent = io.BytesIO()
    presentation.save(sent)
    (unit,) = ooxml.PPTX.read(sent.getvalue(), Limits()).units
    assert unit.text == "<p>A <c0>long-haired, male musician</c0> plays.</p>"


def _upper(element: etree._Element) -> etree._Element:
    for node in element.iter():
        node.text = node.text.upper() if node.text else node.text
        node.tail = node.tail.upper() if node.tail else node.tail
    return element


S = ooxml.S
SHARED = f"""<sst xmlns="{S}" count="3" uniqueCount="3"><si><t>A dog runs.</t></si>
<si><r><t xml:space="preserve">Two </t></r><r><rPr><b/></rPr><t>big</t></r><r><t> dogs.</t></r>
<rPh sb="0" eb="1"><t>x</t></rPh></si><si><t>42</t></si></sst>"""
TYPES = f"""<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
<Default Extension="xml" ContentType="application/xml"/>
<Override PartName="/xl/workbook.xml" ContentType="{ooxml.XLSX.main}"/>
<Override PartName="/xl/sharedStrings.xml"
 ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>
</Types>"""


def test_xlsx_shared_strings_rich_and_plain() -> None:
    """A shared string is a unit (a rich one's bold run a code, its phonetic run kept); one
    whose runs all come back plain is a single <t> again."""
    sent = io.BytesIO()
    with zipfile.ZipFile(sent, "w") as z:
        z.writestr("[Content_Types].xml", TYPES)
        z.writestr("xl/workbook.xml", f'<workbook xmlns="{S}"/>')
        z.writestr("xl/sharedStrings.xml", SHARED)
    read = ooxml.XLSX.read(sent.getvalue(), Limits())
    units = [u.text for u in read.units]
    assert units == ["<p>A dog runs.</p>", "<p>Two <c0>big</c0> dogs.</p>", "<p>42</p>"]
    out = read.write(["<p>Ein Hund rennt.</p>", "<p>Zwei <c0>große</c0> Hunde.</p>", "<p>42</p>"])
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("xl/sharedStrings.xml"))
    first, second, third = root.findall(f"{{{S}}}si")
    assert [etree.QName(c).localname for c in first] == ["t"] and first[0].text == "Ein Hund rennt."
    assert "".join(second.itertext()) == "Zwei große Hunde.x"
    bold = second.find(f"{{{S}}}r/{{{S}}}rPr/{{{S}}}b/../..")
    assert bold is not None and bold.findtext(f"{{{S}}}t") == "große"
    assert etree.QName(second[-1]).localname == "rPh"
    assert third.findtext(f"{{{S}}}t") == "42"


RUN = st.tuples(st.text(alphabet="ab cD.é,", min_size=1, max_size=8), st.booleans(), st.booleans())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(RUN, min_size=1, max_size=5), min_size=1, max_size=4))
def test_written_back_as_read_every_character_keeps_its_formatting(
    paragraphs: list[list[tuple[str, bool, bool]]],
) -> None:
    """Any paragraphs of bold and italic runs, read into units and written back with the
    units' own text: the same text, each character as bold and as italic as it was."""
    document = docx.Document()
    for runs in paragraphs:
        paragraph = document.add_paragraph()
        for text, bold, italic in runs:
            run = paragraph.add_run(text)
            run.bold, run.italic = bold, italic
    out = io.BytesIO()
    document.save(out)
    read = ooxml.DOCX.read(out.getvalue(), Limits())
    written = docx.Document(io.BytesIO(read.write([u.text for u in read.units])))

    def characters(paragraph: Any) -> list[tuple[str, bool, bool]]:
        return [(c, bool(r.bold), bool(r.italic)) for r in paragraph.runs for c in r.text]

    source = docx.Document(io.BytesIO(out.getvalue()))
    assert [characters(p) for p in written.paragraphs] == [characters(p) for p in source.paragraphs]
