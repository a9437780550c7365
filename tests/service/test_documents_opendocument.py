"""OpenDocument files (service/documents/formats/opendocument.py): paragraphs translated with
their spans and links as codes, string cells only, headers, footers, notes, text boxes,
speaker notes and the title; every other entry byte for byte, the mimetype first and stored;
files made by LibreOffice open in it again."""

# ruff: noqa: E501 (the XML parts below keep their long lines, as LibreOffice writes them)

from __future__ import annotations

import copy
import io
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from service.documents.base import Limits
from service.documents.formats.opendocument import ODP, ODS, ODT
from service.documents.safe import DocumentError
from service.inference.engine import Engine
from tests.service.document_helpers import (
    ODF_NAMESPACES,
    flat_odf,
    identity,
    libreoffice,
    needs_libreoffice,
    odf_document,
    translate,
    unit_texts,
)


def odf(media_type: str, content: str, styles: str = "", meta: str = "") -> bytes:
    """A package as LibreOffice writes one: the mimetype first and stored, then the parts."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        package.writestr("mimetype", media_type, compress_type=zipfile.ZIP_STORED)
        package.writestr("content.xml", content, compress_type=zipfile.ZIP_DEFLATED)
        package.writestr(
            "styles.xml", styles or odf_document("document-styles", ""), zipfile.ZIP_DEFLATED
        )
        package.writestr(
            "meta.xml", meta or odf_document("document-meta", ""), zipfile.ZIP_DEFLATED
        )
        package.writestr("Pictures/dog.png", b"\x89PNG not really", zipfile.ZIP_DEFLATED)
        package.writestr("META-INF/manifest.xml", "<manifest/>", zipfile.ZIP_DEFLATED)
    return out.getvalue()


TEXT_BODY = """<office:body><office:text>
<text:h text:outline-level="1">A <text:span text:style-name="T1">big</text:span> dog</text:h>
<text:p>A man in a <text:span text:style-name="B">blue</text:span> shirt rides a
<text:a xlink:href="http://example.com/bike" xlink:type="simple">red bike</text:a>.<text:note text:id="n1"
text:note-class="footnote"><text:note-citation>1</text:note-citation><text:note-body><text:p>A note
about the bike.</text:p></text:note-body></text:note></text:p>
<text:p><text:span text:style-name="T2">All in </text:span><text:span text:style-name="T3">two spans.</text:span></text:p>
<text:p>Page <text:page-number>3</text:page-number> of the<text:tab/>story.</text:p>
<table:table><table:table-row><table:table-cell><text:p>A cell.</text:p></table:table-cell></table:table-row></table:table>
<text:p><draw:frame draw:name="box"><draw:text-box><text:p>Text in a box.</text:p></draw:text-box></draw:frame></text:p>
<text:p><office:annotation><text:p>A comment stays.</text:p></office:annotation>Commented text.</text:p>
</office:text></office:body>"""

TEXT_STYLES = """<office:master-styles><style:master-page style:name="Standard">
<style:header><text:p>The header.</text:p></style:header><style:footer><text:p>The footer.</text:p></style:footer>
</style:master-page></office:master-styles>"""

TEXT_META = (
    "<office:meta><dc:title>A dog story</dc:title><dc:creator>Ann</dc:creator></office:meta>"
)


def odt() -> bytes:
    return odf(
        ODT.media_type,
        odf_document("document-content", TEXT_BODY),
        odf_document("document-styles", TEXT_STYLES),
        odf_document("document-meta", TEXT_META),
    )


def parts(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        return {info.filename: package.read(info) for info in package.infolist()}


def xml(data: bytes, name: str) -> etree._Element:
    return etree.fromstring(parts(data)[name])


def texts(root: etree._Element) -> list[str]:
    return ["".join(p.itertext()) for p in root.iterfind(".//text:p", ODF_NAMESPACES)]


def test_paragraphs_are_units_with_spans_and_links_as_codes() -> None:
    units = unit_texts(ODT, odt())
    assert units[0] == "<p>A <c0>big</c0> dog</p>"
    assert units[1].startswith(
        "<p>A man in a <c0>blue</c0> shirt rides a\n<c1>red bike</c1>.<c2/></p>"
    )
    assert "<p>A note\nabout the bike.</p>" in units
    # All words in spans: the longest is the paragraph's base, the other a code.
    assert "<p><c0>All in </c0>two spans.</p>" in units
    assert "<p>Page <c0/> of the <c1/>story.</p>" in units  # the tab parts "the" and "story"
    assert "<p>A comment stays.</p>" not in units
    assert units[-3:] == ["<p>The header.</p>", "<p>The footer.</p>", "A dog story"]


def test_the_identity_gives_every_entry_back_byte_for_byte() -> None:
    assert parts(identity(ODT, odt())) == parts(odt())


def test_an_odt_is_translated_where_it_has_text_and_nowhere_else() -> None:
    source = odt()
    out = translate(ODT, source)
    before, after = parts(source), parts(out)
    # Entries in the same order; the mimetype first and stored; untouched ones byte for byte.
    with zipfile.ZipFile(io.BytesIO(out)) as package:
        first = package.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
    assert list(after) == list(before)
    for name in ("mimetype", "Pictures/dog.png", "META-INF/manifest.xml"):
        assert after[name] == before[name]
    content = xml(out, "content.xml")
    paragraphs = texts(content)
    # The note, a paragraph of one run, goes as the plain text it is (its line break, a space
    # to ODF, comes back where it was).
    assert paragraphs[0] == "A MAN IN A BLUE SHIRT RIDES A RED BIKE.1A NOTE\nABOUT THE BIKE."
    assert paragraphs[-2:] == ["A comment stays.COMMENTED TEXT.", "A comment stays."]
    assert "A CELL." in paragraphs and "TEXT IN A BOX." in paragraphs
    span = content.find(".//text:span[@text:style-name='B']", ODF_NAMESPACES)
    assert span.text == "BLUE"
    link = content.find(".//text:a", ODF_NAMESPACES)
    assert (link.text, link.get(f"{{{ODF_NAMESPACES['xlink']}}}href")) == (
        "RED BIKE",
        "http://example.com/bike",
    )
    assert content.find(".//text:page-number", ODF_NAMESPACES).text == "3"  # a field: as it was
    spans = content.findall(".//text:p/text:span", ODF_NAMESPACES)
    # The base span takes the words outside the other codes (the space between them stays
    # outside both).
    assert [(s.get(f"{{{ODF_NAMESPACES['text']}}}style-name"), s.text) for s in spans][-2:] == [
        ("T2", "ALL IN"),
        ("T3", "TWO SPANS."),
    ]
    assert "ALL IN TWO SPANS." in paragraphs
    assert texts(xml(out, "styles.xml")) == ["THE HEADER.", "THE FOOTER."]
    meta = xml(out, "meta.xml")
    assert meta.findtext(".//dc:title", namespaces=ODF_NAMESPACES) == "A DOG STORY"
    assert meta.findtext(".//dc:creator", namespaces=ODF_NAMESPACES) == "Ann"


SHEET_BODY = """<office:body><office:spreadsheet><table:table table:name="Sheet1">
<table:table-row>
<table:table-cell office:value-type="string"><text:p>Two dogs</text:p></table:table-cell>
<table:table-cell office:value-type="float" office:value="3.5"><text:p>3.5</text:p></table:table-cell>
<table:table-cell office:value-type="date" office:date-value="2026-11-28"><text:p>Nov 28</text:p></table:table-cell>
<table:table-cell table:formula="of:=LOWER(&quot;A DOG&quot;)" office:value-type="string" office:string-value="a dog"><text:p>a dog</text:p></table:table-cell>
<table:table-cell><text:p>No type</text:p></table:table-cell>
</table:table-row></table:table></office:spreadsheet></office:body>"""


def test_only_string_cells_of_a_spreadsheet_are_translated() -> None:
    source = odf(ODS.media_type, odf_document("document-content", SHEET_BODY))
    out = texts(xml(translate(ODS, source), "content.xml"))
    # A formula's cell is a string the formula computes: its text is the formula's, not ours.
    assert out == ["TWO DOGS", "3.5", "Nov 28", "a dog", "NO TYPE"]


SLIDES_BODY = """<office:body><office:presentation><draw:page draw:name="p1">
<draw:frame presentation:class="title"><draw:text-box><text:p>A slide title</text:p></draw:text-box></draw:frame>
<presentation:notes><draw:frame><draw:text-box><text:p>What the speaker says.</text:p></draw:text-box></draw:frame></presentation:notes>
</draw:page></office:presentation></office:body>"""


def test_slides_and_their_speaker_notes_are_translated() -> None:
    source = odf(ODP.media_type, odf_document("document-content", SLIDES_BODY))
    assert texts(xml(translate(ODP, source), "content.xml")) == [
        "A SLIDE TITLE",
        "WHAT THE SPEAKER SAYS.",
    ]


def test_a_package_of_another_kind_or_with_entities_is_refused() -> None:
    with pytest.raises(DocumentError, match="mimetype entry is not"):
        ODT.read(odf(ODS.media_type, odf_document("document-content", SHEET_BODY)), Limits())
    assert ODS.sniff(odf(ODS.media_type, odf_document("document-content", SHEET_BODY)))
    assert not ODT.sniff(odf(ODS.media_type, odf_document("document-content", SHEET_BODY)))
    bomb = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>'
    with pytest.raises(DocumentError, match="entities"):
        ODT.read(odf(ODT.media_type, bomb), Limits())


def test_a_line_break_or_tab_parts_words_and_no_space_is_added_next_to_it() -> None:
    """The model reads "runs through", not "runsthrough" (the unit has a space before the
    break's code), and the written paragraph has no space next to the break or tab."""
    body = (
        "<office:body><office:text><text:p>A dog runs<text:line-break/>through the grass."
        "<text:tab/>A cat sleeps.</text:p></office:text></office:body>"
    )
    source = odf(ODT.media_type, odf_document("document-content", body))
    assert unit_texts(ODT, source) == [
        "<p>A dog runs <c0/>through the grass. <c1/>A cat sleeps.</p>"
    ]
    (paragraph,) = xml(translate(ODT, source), "content.xml").iterfind(".//text:p", ODF_NAMESPACES)
    assert etree.tostring(paragraph, encoding="unicode").split(">", 1)[1] == (
        "A DOG RUNS<text:line-break/>THROUGH THE GRASS.<text:tab/>A CAT SLEEPS.</text:p>"
    )


def test_the_real_model_puts_a_span_on_the_translated_word(shipped_engine: Engine) -> None:
    out = translate(ODT, odt(), shipped_engine)
    span = xml(out, "content.xml").find(".//text:span[@text:style-name='B']", ODF_NAMESPACES)
    assert span.text.startswith("blau"), span.text


@needs_libreoffice
def test_files_libreoffice_made_open_in_it_translated(tmp_path: Path) -> None:
    """LibreOffice writes an odt, an ods and an odp from flat XML; each is translated, and
    LibreOffice converts the translations to text, CSV and flat XML: they open, with the
    translated words."""
    (tmp_path / "doc.fodt").write_text(flat_odf(ODT.media_type, TEXT_BODY))
    (tmp_path / "sheet.fods").write_text(flat_odf(ODS.media_type, SHEET_BODY))
    (tmp_path / "slides.fodp").write_text(flat_odf(ODP.media_type, SLIDES_BODY))
    profile, out = tmp_path / "profile", tmp_path / "out"
    libreoffice(profile, tmp_path, "--convert-to", "odt", "doc.fodt")
    libreoffice(profile, tmp_path, "--convert-to", "ods", "sheet.fods")
    libreoffice(profile, tmp_path, "--convert-to", "odp", "slides.fodp")
    out.mkdir()
    for name, format in (("doc.odt", ODT), ("sheet.ods", ODS), ("slides.odp", ODP)):
        (out / name).write_bytes(translate(format, (tmp_path / name).read_bytes()))
    libreoffice(profile, out, "--convert-to", "txt:Text", "doc.odt")
    libreoffice(profile, out, "--convert-to", "csv", "sheet.ods")
    libreoffice(profile, out, "--convert-to", "fodp", "slides.odp")
    text = (out / "doc.txt").read_text(encoding="utf-8-sig")
    assert "A MAN IN A BLUE SHIRT RIDES A RED BIKE." in text and "A comment stays" not in text
    assert (out / "sheet.csv").read_text().splitlines()[0].startswith("TWO DOGS,3.5,")
    slides = etree.parse(str(out / "slides.fodp")).getroot()
    written = [text for text in texts(slides) if text]
    assert "A SLIDE TITLE" in written and "WHAT THE SPEAKER SAYS." in written, written


# --- Any paragraph: its words translated, its elements kept -----------------------------------

odf_words = st.lists(st.text("abcdefghij", min_size=1, max_size=6), min_size=1, max_size=4).map(
    " ".join
)
inline_piece = st.one_of(
    odf_words,
    st.builds(
        '<text:span text:style-name="S{}">{}</text:span>'.format, st.integers(0, 3), odf_words
    ),
    st.builds('<text:a xlink:href="http://e.com/{}">{}</text:a>'.format, odf_words, odf_words),
    st.sampled_from(["<text:tab/>", '<text:s text:c="2"/>', "<text:line-break/>"]),
)
odf_paragraph = st.lists(inline_piece, min_size=1, max_size=6).map(" ".join)


def elements(paragraph: etree._Element) -> Counter[str]:
    """Its elements' start tags, each span's once (a paragraph's base span comes back as one
    copy per stretch of its words)."""
    tags = [etree.tostring(e, with_tail=False).split(b">")[0].decode() for e in paragraph.iter()]
    spans = {tag for tag in tags if "text:span" in tag}
    return Counter(tag for tag in tags if "text:span" not in tag) + Counter(spans)


@settings(max_examples=40, deadline=None)
@given(st.lists(odf_paragraph, min_size=1, max_size=4))
def test_any_paragraphs_keep_their_elements_and_get_their_words_translated(
    paragraphs: list[str],
) -> None:
    body = "".join(f"<text:p>{p}</text:p>" for p in paragraphs)
    source = odf(
        ODT.media_type,
        odf_document(
            "document-content", f"<office:body><office:text>{body}</office:text></office:body>"
        ),
    )
    assert parts(identity(ODT, source)) == parts(source)
    before = xml(source, "content.xml").findall(".//text:p", ODF_NAMESPACES)
    after = xml(translate(ODT, source), "content.xml").findall(".//text:p", ODF_NAMESPACES)
    for old, new in zip(before, after, strict=True):
        assert elements(new) == elements(old)
        assert words(new) == words(old).upper()


def words(paragraph: etree._Element) -> str:
    """Its words, one space apart (a tab or line break parts words as a space does)."""
    paragraph = copy.deepcopy(paragraph)
    for part in paragraph.iter(
        *(f"{{{ODF_NAMESPACES['text']}}}{n}" for n in ("tab", "line-break"))
    ):
        part.text = " "
    return " ".join("".join(paragraph.itertext()).split())
