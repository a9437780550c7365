"""benchmarks.document_placement: the files it makes read back to the runs it drew, in every
format; its readers read the service's own translations of them (FakeModel: upper case, every
character aligned to itself, so each run comes back on the same words) and hand-made outputs
with runs moved, split, nested or lost; and the scoring of one file. The span arithmetic and
eflomal's reference are tests/benchmarks/test_tag_placement.py's."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx
import pytest
from lxml import etree

from benchmarks.document_placement import (
    FORMATS,
    KINDS,
    Formatted,
    Marks,
    draw,
    read_docx,
    read_markdown,
    read_odt,
    score,
)
from benchmarks.reference_alignment import read_words
from service.documents.formats import by_name
from tests.service.document_helpers import odf_document, translate

PARAGRAPHS = [
    Formatted(["A", "man", "pulling", "some", "luggage."], (3, 5), "bold"),
    Formatted(["Two", "dogs", "play."], (0, 1), "italic"),
    Formatted(["A", "girl", "*jumps*", "[high]", "&", "#1", "<b>"], (2, 4), "link"),
    Formatted(["-", "a", "list?", "No."], (1, 3), "bold"),
    Formatted(["Alone"], (0, 1), "link"),
]


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_reads_back_its_runs(name: str, multi30k: Path) -> None:
    made = FORMATS[name].make
    read = FORMATS[name].read
    paragraphs = [*PARAGRAPHS, *draw(read_words(multi30k / "val.en.gz", 100), seed=1)]
    for item, marks in zip(paragraphs, read(made(paragraphs)), strict=True):
        assert marks.tagged(item.kind) == (" ".join(item.words), item.span, 1), item
        others = [kind for kind in KINDS if kind != item.kind]
        assert all(marks.tagged(kind).span is None for kind in others)  # nothing else marked


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_services_translation_reads_back(name: str) -> None:
    """The service's document path writes each run back on the words its source words align
    to: with a translator that aligns every character to itself, the same words."""
    data = translate(by_name(name), FORMATS[name].make(PARAGRAPHS))
    for item, marks in zip(PARAGRAPHS, FORMATS[name].read(data), strict=True):
        assert marks.tagged(item.kind) == (" ".join(item.words).upper(), item.span, 1)


def _docx(*paragraphs: str) -> bytes:
    """A docx whose paragraphs' XML is given (w: and r: declared)."""
    document = docx.Document()
    body = document.element.body
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    r = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    for xml in paragraphs:
        body.append(etree.fromstring(f'<w:p xmlns:w="{w}" xmlns:r="{r}">{xml}</w:p>'))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_reader_sees_split_bold_links_and_inherited_formatting() -> None:
    bold = "<w:r><w:rPr><w:b/></w:rPr><w:t>{}</w:t></w:r>"
    plain = '<w:r><w:t xml:space="preserve">{}</w:t></w:r>'
    split, link, off = read_docx(
        _docx(
            bold.format("Ein")
            + plain.format(" roter ")
            + bold.format("Ball")
            + plain.format(" rollt"),
            plain.format("Siehe ")
            + '<w:hyperlink r:id="rId99"><w:r><w:rPr><w:i/></w:rPr><w:t>die Seite</w:t></w:r>'
            "</w:hyperlink>",
            '<w:r><w:rPr><w:b w:val="0"/></w:rPr><w:t>nicht fett</w:t></w:r>',
        )
    )
    assert split.tagged("bold") == ("Ein roter Ball rollt", (0, 3), 2)
    assert split.stretches("bold") == 2 and link.stretches("link") == 1
    assert link.tagged("link").span == link.tagged("italic").span == (1, 3)
    assert link.tagged("bold").span is None
    assert off.tagged("bold").span is None  # w:b w:val="0" is not bold


def test_odt_reader_follows_styles_nesting_and_spaces() -> None:
    content = odf_document(
        "document-content",
        "<office:automatic-styles>"
        '<style:style style:name="B" style:family="text">'
        '<style:text-properties fo:font-weight="bold"/></style:style>'
        '<style:style style:name="U" style:family="text">'
        '<style:text-properties style:text-underline-style="solid"/></style:style>'
        "</office:automatic-styles><office:body><office:text>"
        '<text:p>Ein<text:s text:c="2"/><text:a xlink:href="x"><text:span text:style-name="B">'
        "roter</text:span> Ball</text:a> rollt</text:p>"
        '<text:h>Kein <text:span text:style-name="U">Fett</text:span></text:h>'
        "</office:text></office:body>",
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        package.writestr("content.xml", content)
    nested, heading = read_odt(out.getvalue())
    assert nested.text == "Ein  roter Ball rollt"
    assert nested.tagged("link").span == (1, 3) and nested.tagged("bold").span == (1, 2)
    assert heading.tagged("bold") == ("Kein Fett", None, 0)


def test_markdown_reader_reads_emphasis_links_and_escapes() -> None:
    text = b"Ein **roter** Ball\n\n*ein* [Hund \\*](https://x) __da__\n\n```\n**code**\n```\n"
    first, second = read_markdown(text)
    assert first.tagged("bold") == ("Ein roter Ball", (1, 2), 1)
    assert second.text == "ein Hund * da"
    assert second.tagged("italic").span == (0, 1)
    assert second.tagged("link").span == (1, 3)
    assert second.tagged("bold").span == (3, 4)


def _marks(text: str, kind: str, inside: str) -> Marks:
    """`text` with the characters under non-spaces of `inside` formatted as `kind`."""
    marks = Marks()
    for character, mark in zip(text, inside.ljust(len(text)), strict=True):
        marks.add(character, {kind} if mark != " " else set())
    return marks


def test_score_counts_exact_overlap_lost_split_and_same_text() -> None:
    paragraphs = [
        Formatted(["a", "red", "ball"], (1, 2), "bold"),
        Formatted(["a", "red", "ball"], (1, 3), "italic"),
        Formatted(["a", "dog"], (1, 2), "link"),
        Formatted(["a", "cat"], (0, 1), "bold"),
        Formatted(["one", "two", "three"], (0, 3), "bold"),
        Formatted(["a", "thing."], (1, 2), "bold"),
        Formatted(["a", "thing."], (0, 1), "bold"),
    ]
    read = [
        _marks("ein roter Ball", "bold", "    xxxxx"),  # exact
        _marks("ein roter Ball", "italic", "    xxxxx"),  # overlaps (1, 3)
        _marks("ein Hund", "bold", "    xxxx"),  # a link gone, bold instead: lost
        _marks("eine Katze", "bold", "     xxxxx"),  # no reference: not scored
        _marks("eins zwei drei", "bold", "xxxx      xxxx"),  # split
        _marks("ein Ding.", "bold", "    xxxx "),  # exact; no split: the full stop is plain
        _marks("ein Ding.", "bold", "xxx     x"),  # exact, but the full stop bold apart: split
    ]
    plain = [
        "ein roter Ball", "ein roter  Ball", "ein Hund", "eine Katze", "eins drei zwei",
        "ein Ding.", "ein Ding.",
    ]  # fmt: skip
    references = [(1, 2), (1, 3), (1, 2), None, (0, 2), (1, 2), (0, 1)]
    html = [(1, 2), (1, 2), (1, 2), (0, 1), (0, 3), (1, 2), (0, 1)]
    result = score(paragraphs, read, plain, references, html)
    scores = result["scores"]
    assert (scores["scored"], scores["exact"], scores["overlap"]) == (6, 3, 5)
    assert result["misses"][3]["output"] == "[ein] Ding[.]"
    assert scores["no_prediction"] == 1
    assert (result["runs_lost"], result["runs_split"]) == (1, 2)
    assert result["same_text"] == 6  # whitespace collapsed; the fifth one's words differ
    assert result["as_html"] == 4  # not the lost run, nor the words that are not the plain ones
    assert [m["paragraph"] for m in result["misses"]] == [1, 2, 4, 6]
    assert result["misses"][0]["output"] == "ein [roter] Ball"
    assert result["misses"][0]["reference"] == "ein [roter Ball]"
    assert result["misses"][1]["output"] == "ein Hund (run lost)"
    assert result["misses"][2]["output"] == "[eins] zwei [drei]"
    assert result["misses"][2]["overlap"] and not result["misses"][2]["same_text"]
    with pytest.raises(ValueError, match="7 paragraphs sent, 6 read back"):
        score(paragraphs, read[:6], plain, references, html)
