"""docx, pptx and xlsx through POST /documents with the shipped en->de model, files built with
python-docx, python-pptx and openpyxl and read back with them: the output opens, has the same
structure, each paragraph's text is the plain translation of its text (POST /translate), each
formatted run of the source is one run with the same formatting on the words the markup path
places it on, and every part that holds no text is byte for byte the source's."""

from __future__ import annotations

import asyncio
import csv
import datetime
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
from service.inference.engine import Engine
from tests.service.document_helpers import (
    ODF_NAMESPACES,
    SOFFICE,
    flat_odf,
    identity,
    libreoffice,
    needs_libreoffice,
    plain_translations,
    replace_entry,
    translate,
    unit_texts,
)
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


def make_pptx() -> bytes:
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
    return out.getvalue()


async def test_pptx_slides_and_speaker_notes(client: httpx.AsyncClient) -> None:
    sent = make_pptx()
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


def make_xlsx() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["A dog runs.", 3.5, "=B1*2"])
    sheet.append(["Two men talk.", "2024-01-01"])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


async def test_xlsx_strings_are_translated_and_numbers_dates_formulas_kept(
    client: httpx.AsyncClient,
) -> None:
    sent = make_xlsx()
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
    sent = replace_entry(make_docx(), "word/document.xml", BODY.encode())
    read = ooxml.DOCX.read(sent, Limits())
    units = [u.text for u in read.units]
    # The tab parts "page" from "now": a space before it, for the model.
    assert "<p>See <c0><c1>the page</c1></c0> <c2/> now <c3/> please.</p>" in units
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


def test_a_line_break_or_tab_parts_words_and_no_space_is_added_next_to_it() -> None:
    """A docx break and tab, a pptx break: the model reads the words on either side apart
    ("runs through", not "runsthrough": the unit has a space before the code), and the written
    paragraph has no space next to them that the source had not."""
    document = docx.Document()
    run = document.add_paragraph().add_run("A dog runs")
    run.add_break()
    run.add_text("through the grass.")
    run.add_tab()
    run.add_text("A cat sleeps.")
    out = io.BytesIO()
    document.save(out)
    sent = out.getvalue()
    assert unit_texts(ooxml.DOCX, sent) == [
        "<p>A dog runs <c0/>through the grass. <c1/>A cat sleeps.</p>"
    ]
    (paragraph,) = docx.Document(io.BytesIO(translate(ooxml.DOCX, sent))).paragraphs
    assert paragraph.text == "A DOG RUNS\nTHROUGH THE GRASS.\tA CAT SLEEPS."
    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "A dog runs\vthrough the grass."  # python-pptx: an a:br
    out = io.BytesIO()
    presentation.save(out)
    assert unit_texts(ooxml.PPTX, out.getvalue()) == ["<p>A dog runs <c0/>through the grass.</p>"]
    translated = pptx.Presentation(io.BytesIO(translate(ooxml.PPTX, out.getvalue())))
    assert translated.slides[0].shapes.title.text == "A DOG RUNS\vTHROUGH THE GRASS."


def test_a_cells_lines_stay_lines() -> None:
    """A cell's line break is a character of its string (Excel's Alt+Enter; LibreOffice writes
    a cell of two paragraphs so): it parts the words and comes back, not a space."""
    book = openpyxl.Workbook()
    book.active.append(["Two dogs run.\nA cat sleeps.", "A dog\r\nsleeps."])
    out = io.BytesIO()
    book.save(out)
    result = openpyxl.load_workbook(io.BytesIO(translate(ooxml.XLSX, out.getvalue())))
    assert [c.value for c in result.active[1]] == [
        "TWO DOGS RUN.\nA CAT SLEEPS.",
        "A DOG\r\nSLEEPS.",
    ]


# --- Files LibreOffice made, translated, opened in LibreOffice ----------------------------------

# Flat OpenDocument that LibreOffice converts to docx, pptx and xlsx: bold, italic and linked
# runs, a table, a header, a footer with a page number field, a footnote, a line break and a
# tab; slides with a title, a linked and a bold run, a line break and speaker notes; cells with
# text (one of two lines, one with a bold run), a number, a date and formulas.
LO_TEXT = """<office:automatic-styles>
<style:style style:name="B" style:family="text"><style:text-properties fo:font-weight="bold"/></style:style>
<style:style style:name="I" style:family="text"><style:text-properties fo:font-style="italic"/></style:style>
<style:page-layout style:name="pm1"><style:header-style/><style:footer-style/></style:page-layout>
</office:automatic-styles><office:master-styles><style:master-page style:name="Standard" style:page-layout-name="pm1">
<style:header><text:p>A boy jumps into the water.</text:p></style:header>
<style:footer><text:p>Page <text:page-number text:select-page="current">1</text:page-number></text:p></style:footer>
</style:master-page></office:master-styles><office:body><office:text>
<text:p>A man in a <text:span text:style-name="B">blue</text:span> shirt rides a <text:a xlink:type="simple" xlink:href="http://example.com/bike">red bike</text:a>.<text:note text:id="n1" text:note-class="footnote"><text:note-citation>1</text:note-citation><text:note-body><text:p>A note about the bike.</text:p></text:note-body></text:note></text:p>
<text:p>Two <text:span text:style-name="I">young girls</text:span> are playing in the park.</text:p>
<table:table table:name="T"><table:table-column table:number-columns-repeated="2"/><table:table-row>
<table:table-cell office:value-type="string"><text:p>A woman is reading a book.</text:p></table:table-cell>
<table:table-cell office:value-type="string"><text:p>Three people walk down the street.</text:p></table:table-cell>
</table:table-row></table:table>
<text:p>A dog runs<text:line-break/>through the<text:tab/>green grass.<text:tab/>A cat sleeps.</text:p>
</office:text></office:body>"""  # noqa: E501
LO_SLIDES = """<office:automatic-styles>
<style:style style:name="B" style:family="text"><style:text-properties fo:font-weight="bold"/></style:style>
</office:automatic-styles><office:body><office:presentation>
<draw:page draw:name="p1">
<draw:frame svg:x="2cm" svg:y="1cm" svg:width="20cm" svg:height="3cm"><draw:text-box><text:p>A dog catches a ball.</text:p></draw:text-box></draw:frame>
<draw:frame svg:x="2cm" svg:y="5cm" svg:width="20cm" svg:height="9cm"><draw:text-box><text:p>Two <text:span text:style-name="B">young girls</text:span> are playing in the <text:a xlink:href="http://example.com/park">park</text:a>.</text:p></draw:text-box></draw:frame>
<presentation:notes><draw:frame svg:x="2cm" svg:y="14cm" svg:width="17cm" svg:height="9cm"><draw:text-box><text:p>What the speaker says.</text:p></draw:text-box></draw:frame></presentation:notes>
</draw:page><draw:page draw:name="p2">
<draw:frame svg:x="2cm" svg:y="1cm" svg:width="20cm" svg:height="3cm"><draw:text-box><text:p>A dog runs<text:line-break/>through the grass.</text:p></draw:text-box></draw:frame>
</draw:page></office:presentation></office:body>"""  # noqa: E501
LO_SHEET = """<office:automatic-styles>
<number:date-style style:name="N1"><number:year number:style="long"/><number:text>-</number:text><number:month number:style="long"/><number:text>-</number:text><number:day number:style="long"/></number:date-style>
<style:style style:name="D" style:family="table-cell" style:data-style-name="N1"/>
<style:style style:name="B" style:family="text"><style:text-properties fo:font-weight="bold"/></style:style>
</office:automatic-styles><office:body><office:spreadsheet><table:table table:name="Dogs">
<table:table-row>
<table:table-cell office:value-type="string"><text:p>Two dogs run.</text:p><text:p>A cat sleeps.</text:p></table:table-cell>
<table:table-cell office:value-type="float" office:value="3.5"><text:p>3.5</text:p></table:table-cell>
<table:table-cell table:style-name="D" office:value-type="date" office:date-value="2026-11-28"><text:p>2026-11-28</text:p></table:table-cell>
<table:table-cell table:formula="of:=[.B1]*2" office:value-type="float" office:value="7"><text:p>7</text:p></table:table-cell>
</table:table-row><table:table-row>
<table:table-cell office:value-type="string"><text:p>A <text:span text:style-name="B">big</text:span> dog sleeps.</text:p></table:table-cell>
<table:table-cell table:formula="of:=LOWER(&quot;A DOG&quot;)" office:value-type="string" office:string-value="a dog"><text:p>a dog</text:p></table:table-cell>
</table:table-row></table:table></office:spreadsheet></office:body>"""  # noqa: E501
LO_MADE = {
    "docx": ("fodt", "application/vnd.oasis.opendocument.text", LO_TEXT),
    "pptx": ("fodp", "application/vnd.oasis.opendocument.presentation", LO_SLIDES),
    "xlsx": ("fods", "application/vnd.oasis.opendocument.spreadsheet", LO_SHEET),
}
FORMATS = {"docx": ooxml.DOCX, "pptx": ooxml.PPTX, "xlsx": ooxml.XLSX}


@pytest.fixture(scope="module")
def libreoffice_made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """docx, pptx and xlsx that LibreOffice wrote (from the flat OpenDocument above)."""
    if SOFFICE is None:
        pytest.skip("LibreOffice (soffice) is not installed")
    directory = tmp_path_factory.mktemp("libreoffice")
    for kind, (flat, media_type, body) in LO_MADE.items():
        (directory / f"made.{flat}").write_text(flat_odf(media_type, body))
        libreoffice(directory / "profile", directory, "--convert-to", kind, f"made.{flat}")
    return {kind: (directory / f"made.{kind}").read_bytes() for kind in LO_MADE}


def paragraphs(document: Any) -> list[str]:
    """A docx's paragraphs' texts: the body's, its tables', the first section's header and
    footer."""
    cells = [c.text for table in document.tables for row in table.rows for c in row.cells]
    section = document.sections[0]
    edges = [p.text for p in (*section.header.paragraphs, *section.footer.paragraphs)]
    return [*(p.text for p in document.paragraphs), *cells, *edges]


def shapes(presentation: Any) -> list[list[str]]:
    """Each slide's paragraphs' texts, its notes' last (python-pptx makes notes for a slide
    whose notes it is asked for: only when it has them)."""
    return [
        [
            p.text
            for shape in (
                *slide.shapes,
                *(slide.notes_slide.shapes if slide.has_notes_slide else ()),
            )
            if shape.has_text_frame
            for p in shape.text_frame.paragraphs
        ]
        for slide in presentation.slides
    ]


def cells(data: bytes) -> list[list[Any]]:
    return [[c.value for c in row] for row in openpyxl.load_workbook(io.BytesIO(data)).active]


def part_texts(data: bytes, name: str) -> list[str]:
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(data)).read(name))
    return ["".join(p.itertext()) for p in root.iter(f"{{{W}}}p")]


@needs_libreoffice
def test_files_libreoffice_made_open_in_it_translated(
    libreoffice_made: dict[str, bytes], tmp_path: Path
) -> None:
    """docx, pptx and xlsx that LibreOffice wrote, and the same made by python-docx,
    python-pptx and openpyxl, translated (FakeModel): the same structure, each paragraph the
    plain translation of its text, each formatted run one run with its formatting on the same
    words, fields, numbers, dates and formulas as they were (the sheets' parts byte for byte);
    and LibreOffice opens every translation (one call per kind) and reads the translated
    text."""
    made = libreoffice_made
    out = {f"lo.{kind}": translate(FORMATS[kind], data) for kind, data in made.items()}
    library = {"docx": make_docx(), "pptx": make_pptx(), "xlsx": make_xlsx()}
    out |= {f"lib.{kind}": translate(FORMATS[kind], data) for kind, data in library.items()}

    source, target = (
        docx.Document(io.BytesIO(made["docx"])),
        docx.Document(io.BytesIO(out["lo.docx"])),
    )
    assert (len(target.paragraphs), len(target.tables)) == (len(source.paragraphs), 1)
    assert paragraphs(target) == plain_translations(paragraphs(source))
    assert paragraphs(target)[2] == "A DOG RUNS\nTHROUGH THE\tGREEN GRASS.\tA CAT SLEEPS."
    assert paragraphs(target)[-1] == "PAGE 1"  # the field's result as it was
    first, second = target.paragraphs[:2]
    assert [r.text for r in first.runs if r.bold] == ["BLUE"]
    assert [r.text for r in second.runs if r.italic] == ["YOUNG GIRLS"]
    assert [(h.text, h.address) for h in first.hyperlinks] == [
        ("RED BIKE", "http://example.com/bike")
    ]
    assert part_texts(out["lo.docx"], "word/footnotes.xml")[-1] == "A NOTE ABOUT THE BIKE."
    changed = {f"word/{name}.xml" for name in ("document", "header1", "footer1", "footnotes")}
    unchanged_parts(made["docx"], out["lo.docx"], changed)

    slides = pptx.Presentation(io.BytesIO(out["lo.pptx"]))
    before = shapes(pptx.Presentation(io.BytesIO(made["pptx"])))
    assert shapes(slides) == [plain_translations(texts) for texts in before]
    assert shapes(slides)[0][-1] == "WHAT THE SPEAKER SAYS."  # the notes
    assert shapes(slides)[1] == ["A DOG RUNS\vTHROUGH THE GRASS."]
    runs = slides.slides[0].shapes[1].text_frame.paragraphs[0].runs
    assert [r.text for r in runs if r.font.bold] == ["YOUNG GIRLS"]
    assert [(r.text, r.hyperlink.address) for r in runs if r.hyperlink.address] == [
        ("PARK", "http://example.com/park")
    ]
    unchanged_parts(
        made["pptx"],
        out["lo.pptx"],
        {"ppt/slides/slide1.xml", "ppt/slides/slide2.xml", "ppt/notesSlides/notesSlide1.xml"},
    )

    assert cells(out["lo.xlsx"]) == [
        ["TWO DOGS RUN.\nA CAT SLEEPS.", 3.5, datetime.datetime(2026, 11, 28), "=B1*2"],
        ["A BIG DOG SLEEPS.", '=LOWER("A DOG")', None, None],
    ]
    rich = openpyxl.load_workbook(io.BytesIO(out["lo.xlsx"]), rich_text=True).active["A2"].value
    assert [block.text for block in rich if block.font.b] == ["BIG"]
    # LibreOffice gives a sheet its default print header and footer: the sheet's name, "Page &P",
    # in its default font (named in a code: Times New Roman, or DejaVu Serif without the
    # Liberation fonts), which stays as it was.
    header, footer = printed(made["xlsx"])[:2]
    assert header is not None and header.endswith("&12&A")
    assert footer is not None and footer.endswith("&12Page &P")
    assert printed(out["lo.xlsx"])[:2] == [header, footer.replace("Page", "PAGE")]
    unchanged_parts(
        made["xlsx"], out["lo.xlsx"], {"xl/sharedStrings.xml", "xl/worksheets/sheet1.xml"}
    )

    for name, data in out.items():
        (tmp_path / name).write_bytes(data)
    profile = tmp_path / "profile"
    libreoffice(profile, tmp_path, "--convert-to", "txt:Text", "lo.docx", "lib.docx")
    libreoffice(profile, tmp_path, "--convert-to", "csv", "lo.xlsx", "lib.xlsx")
    libreoffice(profile, tmp_path, "--convert-to", "fodp", "lo.pptx", "lib.pptx")
    read = {n: (tmp_path / f"{n}.txt").read_text(encoding="utf-8-sig") for n in ("lo", "lib")}
    assert read["lo"].splitlines() == [
        "A MAN IN A BLUE SHIRT RIDES A RED BIKE.1",  # the footnote's number
        "TWO YOUNG GIRLS ARE PLAYING IN THE PARK.",
        "A WOMAN IS READING A BOOK.",
        "THREE PEOPLE WALK DOWN THE STREET.",
        "A DOG RUNS",
        "THROUGH THE\tGREEN GRASS.\tA CAT SLEEPS.",
    ]
    sentences = ["".join((before, words, after)).upper() for before, _, words, after in SENTENCES]
    assert read["lib"].splitlines() == [*sentences, "A WOMAN IS READING A BOOK.", "1,234.5"]
    with (tmp_path / "lo.csv").open(newline="") as sheet:
        assert list(csv.reader(sheet)) == [
            ["TWO DOGS RUN.\nA CAT SLEEPS.", "3.5", "2026-11-28", "7"],
            ["A BIG DOG SLEEPS.", "a dog", "", ""],
        ]
    with (tmp_path / "lib.csv").open(newline="") as sheet:
        assert list(csv.reader(sheet)) == [
            ["A DOG RUNS.", "3.5", "7"],
            ["TWO MEN TALK.", "2024-01-01", ""],
        ]
    for name in ("lo", "lib"):
        root = etree.parse(str(tmp_path / f"{name}.fodp")).getroot()
        written = {"".join(p.itertext()) for p in root.iter(f"{{{ODF_NAMESPACES['text']}}}p")}
        expected = shapes(pptx.Presentation(io.BytesIO(out[f"{name}.pptx"])))
        assert {t.replace("\v", "") for texts in expected for t in texts} <= written, (
            name,
            written,
        )


def test_libreoffice_made_files_get_each_paragraphs_plain_translation(
    libreoffice_made: dict[str, bytes], shipped_engine: Engine
) -> None:
    """The shipped model: each paragraph of LibreOffice's docx, pptx and xlsx is translated as
    its text alone is (a line break or tab read as a space; the footer, whose page number is a
    field, aside), and each bold, italic or linked run is on words of it."""
    out = {
        kind: translate(FORMATS[kind], data, shipped_engine)
        for kind, data in libreoffice_made.items()
    }

    def same(before: list[str], after: list[str]) -> None:
        expected = plain_translations([" ".join(t.split()) for t in before], shipped_engine)
        assert [" ".join(t.split()) for t in after] == expected

    def on_words(runs: list[str], paragraph: str) -> None:
        assert len(runs) == 1 and runs[0].strip() and runs[0] in paragraph, (runs, paragraph)

    source = docx.Document(io.BytesIO(libreoffice_made["docx"]))
    target = docx.Document(io.BytesIO(out["docx"]))
    same(paragraphs(source)[:-1], paragraphs(target)[:-1])
    first, second = target.paragraphs[:2]
    on_words([r.text for r in first.runs if r.bold], first.text)
    on_words([r.text for r in second.runs if r.italic], second.text)
    on_words([h.text for h in first.hyperlinks], first.text)
    before = shapes(pptx.Presentation(io.BytesIO(libreoffice_made["pptx"])))
    slides = pptx.Presentation(io.BytesIO(out["pptx"]))
    same([t for texts in before for t in texts], [t for texts in shapes(slides) for t in texts])
    body = slides.slides[0].shapes[1].text_frame.paragraphs[0]
    on_words([r.text for r in body.runs if r.font.bold], body.text)
    on_words([r.text for r in body.runs if r.hyperlink.address], body.text)
    strings = [row[0] for row in cells(libreoffice_made["xlsx"])]
    same(strings, [row[0] for row in cells(out["xlsx"])])
    rich = openpyxl.load_workbook(io.BytesIO(out["xlsx"]), rich_text=True).active["A2"].value
    on_words([block.text for block in rich if block.font.b], str(rich))


def test_xlsx_print_headers_and_footers_are_translated_and_their_codes_kept() -> None:
    """A sheet's print header and footer (`headerFooter`): each of their left, centre and right
    parts with words is a unit; the codes before its first word and after its last (a font, a
    size, the page number at the end) stay where they are, those among its words (a page number
    with an offset, a line break) are placed by alignment, `&&` is an ampersand both ways; a
    part of codes alone is kept as it was, and the cells' strings are translated as before."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["A dog runs."])
    sheet.oddHeader.left.text = "Tom && Jerry"
    sheet.oddHeader.center.text = "Draft of &[Date]"
    sheet.oddHeader.right.text = "&[Page]"
    sheet.oddFooter.center.text = "Page &P+1 of &[Pages]"
    sheet.oddFooter.right.font = "Arial,Bold"
    sheet.oddFooter.right.size = 14
    sheet.oddFooter.right.text = "Sheet &[Tab]"
    sheet.evenFooter.left.text = "Two men talk.\nA dog runs."
    made = io.BytesIO()
    book.save(made)
    # A line break as Excel writes it in a header (openpyxl escapes it as _x000a_).
    name = "xl/worksheets/sheet1.xml"
    sheet_xml = zipfile.ZipFile(made).read(name)
    sent = replace_entry(made.getvalue(), name, sheet_xml.replace(b"_x000a_", b"\n"))
    units = unit_texts(ooxml.XLSX, sent)
    assert units[1:] == [
        "<p>Tom &amp; Jerry</p>",
        "<p>Draft of</p>",
        "<p>Page <c0/> of</p>",
        "<p>Sheet</p>",  # openpyxl wrote '&"Arial,Bold"&14 Sheet &A'
        "<p>Two men talk. <c0/>A dog runs.</p>",
    ]
    result = translate(ooxml.XLSX, sent)
    translated = openpyxl.load_workbook(io.BytesIO(result)).active
    assert translated["A1"].value == "A DOG RUNS."
    header, footer = translated.oddHeader, translated.oddFooter
    assert (header.left.text, header.center.text, header.right.text) == (
        "TOM && JERRY",
        "DRAFT OF &D",  # openpyxl reads the codes as they are written: &D, &P, &N, &A
        "&P",
    )
    assert footer.center.text == "PAGE &P+1 OF &N"
    assert (footer.right.font, footer.right.size, footer.right.text) == (
        "Arial,Bold",
        14,
        "SHEET &A",
    )
    assert translated.evenFooter.left.text == "TWO MEN TALK.\nA DOG RUNS."
    # Written back from its own units, the headers and footers are what they were.
    assert printed(identity(ooxml.XLSX, sent)) == printed(sent)


def test_xlsx_print_header_of_a_sheet_without_strings_and_a_size_before_digits() -> None:
    """A sheet whose cells hold no string (numbers; or indices into the shared strings) is not
    parsed whole: its print headers and footers are read from its bytes and written into them,
    every other byte kept. A font size written before a translation that starts with a digit
    is kept apart from it ("&14" then "2024" would read as size 142 and "024")."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append([1.5, 2])
    sheet.oddHeader.center.text = "&14Report && more"  # written as it is
    out = io.BytesIO()
    book.save(out)
    sent = out.getvalue()
    sheet_xml = zipfile.ZipFile(io.BytesIO(sent)).read("xl/worksheets/sheet1.xml")
    assert b"inlineStr" not in sheet_xml
    assert unit_texts(ooxml.XLSX, sent) == ["<p>Report &amp; more</p>"]
    extracted = ooxml.XLSX.read(sent, Limits())
    result = extracted.write(["<p>2024 Bericht &amp; mehr</p>"])
    written = zipfile.ZipFile(io.BytesIO(result)).read("xl/worksheets/sheet1.xml")
    assert written == sheet_xml.replace(
        b"&amp;14Report &amp;&amp; more", b"&amp;14 2024 Bericht &amp;&amp; mehr"
    )
    assert [c.value for c in openpyxl.load_workbook(io.BytesIO(result)).active[1]] == [1.5, 2]


def test_an_xlsx_print_header_is_kept_within_excels_255_characters() -> None:
    """Excel shows a print header or footer of at most 255 characters, codes included (and
    ClosedXML opens no file with a longer one): a part whose translation would take its header
    past that stays as it was, and the header's other parts are translated. Within the limit the
    same part is translated; a footer already longer (not Excel's) may not grow."""
    center = "Two men talk on the street. " * 8  # 224 characters
    book = openpyxl.Workbook()
    book.active.append([1])
    book.active.oddHeader.left.text = "Monthly report"
    book.active.oddHeader.center.text = center.strip()
    book.active.oddFooter.center.text = (center * 2).strip()
    made = io.BytesIO()
    book.save(made)
    sent = made.getvalue()
    header, footer = printed(sent)[:2]
    assert header is not None and len(header) <= ooxml.PRINT_TEXT_LIMIT
    assert footer is not None and len(footer) > ooxml.PRINT_TEXT_LIMIT
    assert unit_texts(ooxml.XLSX, sent) == [
        "<p>Monthly report</p>",
        f"<p>{center.strip()}</p>",
        f"<p>{(center * 2).strip()}</p>",
    ]
    longer = "Zwei Männer unterhalten sich auf der Straße. " * 6  # 270 characters
    result = ooxml.XLSX.read(sent, Limits()).write(
        ["<p>Monatsbericht</p>", f"<p>{longer.strip()}</p>", f"<p>{(longer * 2).strip()}</p>"]
    )
    written = openpyxl.load_workbook(io.BytesIO(result)).active
    assert written.oddHeader.left.text == "Monatsbericht"
    assert written.oddHeader.center.text == center.strip()
    assert printed(result)[:2] == [header.replace("Monthly report", "Monatsbericht"), footer]
    shorter = "Zwei Männer reden."
    result = ooxml.XLSX.read(sent, Limits()).write(
        ["<p>Monatsbericht</p>", f"<p>{shorter}</p>", f"<p>{shorter}</p>"]
    )
    written = openpyxl.load_workbook(io.BytesIO(result)).active
    assert written.oddHeader.center.text == written.oddFooter.center.text == shorter


def printed(data: bytes) -> list[str | None]:
    """The texts of the first sheet's print headers and footers."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        root = etree.fromstring(archive.read("xl/worksheets/sheet1.xml"))
    return [e.text for e in root.iter(f"{{{ooxml.S}}}headerFooter") for e in e]


TRACKED = f"""<w:document xmlns:w="{W}"><w:body><w:p>
<w:r><w:t xml:space="preserve">A </w:t></w:r>
<w:ins w:id="7" w:author="Ann" w:date="2026-01-02T03:04:05Z">
<w:r><w:t xml:space="preserve">big </w:t></w:r></w:ins>
<w:r><w:t xml:space="preserve">dog </w:t></w:r>
<w:del w:id="8" w:author="Ann" w:date="2026-01-02T03:04:05Z">
<w:r><w:delText xml:space="preserve">slowly </w:delText></w:r></w:del>
<w:r><w:t>runs.</w:t></w:r></w:p></w:body></w:document>"""


# Content controls (Word's fields of a form or template): one inside a paragraph around an
# italic run, one around a whole paragraph.
CONTROLS = f"""<w:document xmlns:w="{W}"><w:body>
<w:p><w:r><w:t xml:space="preserve">The title is </w:t></w:r><w:sdt><w:sdtPr>
<w:alias w:val="Title"/><w:tag w:val="title"/><w:id w:val="42"/></w:sdtPr><w:sdtContent><w:r>
<w:rPr><w:i/></w:rPr><w:t>annual report</w:t></w:r></w:sdtContent></w:sdt><w:r><w:t>.</w:t></w:r>
</w:p><w:sdt><w:sdtPr><w:id w:val="43"/></w:sdtPr><w:sdtContent><w:p><w:r>
<w:t>A block control.</w:t></w:r></w:p></w:sdtContent></w:sdt></w:body></w:document>"""


def shown(element: etree._Element) -> str:
    """The text of a docx element's `w:t`s."""
    return "".join(t.text or "" for t in element.iter(f"{{{W}}}t"))


def test_docx_content_controls_are_translated_and_stay_controls(tmp_path: Path) -> None:
    """The runs inside an inline content control (`w:sdt`) are the paragraph's words, in a code
    of their own around their formatting, written back inside a control with the same
    properties (its alias, tag and id); a control around a paragraph holds a paragraph of its
    own. LibreOffice reads the translated text."""
    sent = replace_entry(make_docx(), "word/document.xml", CONTROLS.encode())
    texts = unit_texts(ooxml.DOCX, sent)
    assert texts[0] == "<p>The title is <c0><c1>annual report</c1></c0>.</p>"
    assert texts[1] == "<p>A block control.</p>"
    out = translate(ooxml.DOCX, sent)
    body = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("word/document.xml"))[0]
    paragraph, block = body[0], body[1]
    control = paragraph.find(f"{{{W}}}sdt")
    assert control is not None
    assert [etree.QName(child).localname for child in control] == ["sdtPr", "sdtContent"]
    properties = control.find(f"{{{W}}}sdtPr")
    assert properties is not None
    assert [(etree.QName(p).localname, p.get(f"{{{W}}}val")) for p in properties] == [
        ("alias", "Title"),
        ("tag", "title"),
        ("id", "42"),
    ]
    run = control.find(f"{{{W}}}sdtContent/{{{W}}}r")
    assert run is not None and run.find(f"{{{W}}}rPr/{{{W}}}i") is not None
    assert shown(control) == "ANNUAL REPORT"
    assert shown(paragraph) == "THE TITLE IS ANNUAL REPORT."
    assert block.tag == f"{{{W}}}sdt" and shown(block) == "A BLOCK CONTROL."
    if SOFFICE is not None:
        (tmp_path / "controls.docx").write_bytes(out)
        libreoffice(tmp_path / "profile", tmp_path, "--convert-to", "txt", "controls.docx")
        read = (tmp_path / "controls.txt").read_text(encoding="utf-8-sig").split("\n")
        assert read[:2] == ["THE TITLE IS ANNUAL REPORT.", "A BLOCK CONTROL."]


def test_docx_tracked_insertions_are_translated_and_stay_insertions() -> None:
    """Runs inside a tracked insertion (`w:ins`) are the paragraph's words (an inline code, as a
    hyperlink is), translated and written back inside an insertion with its author, date and
    id; a tracked deletion keeps its deleted text as it was."""
    sent = replace_entry(make_docx(), "word/document.xml", TRACKED.encode())
    # (The other units: make_docx's header and footer.)
    assert unit_texts(ooxml.DOCX, sent)[0] == "<p>A <c0>big </c0>dog <c1/>runs.</p>"
    out = zipfile.ZipFile(io.BytesIO(translate(ooxml.DOCX, sent)))
    paragraph = etree.fromstring(out.read("word/document.xml")).find(f".//{{{W}}}p")
    assert paragraph is not None
    inserted = paragraph.find(f"{{{W}}}ins")
    assert inserted is not None
    assert dict(inserted.attrib) == {
        f"{{{W}}}id": "7",
        f"{{{W}}}author": "Ann",
        f"{{{W}}}date": "2026-01-02T03:04:05Z",
    }
    assert "".join(inserted.itertext()).strip() == "BIG"
    assert "".join(paragraph.itertext()).split() == ["A", "BIG", "DOG", "slowly", "RUNS."]
    assert paragraph.find(f"{{{W}}}del/{{{W}}}r/{{{W}}}delText") is not None
