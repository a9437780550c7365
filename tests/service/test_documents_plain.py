"""Text, HTML and XHTML files (service/documents/formats/plain.py): through the paths that
exist (text units, one html or xml unit), the file's encoding found and kept."""

from __future__ import annotations

import codecs

import pytest
from lxml import etree

from service.documents.base import Limits
from service.documents.formats.plain import HtmlFormat, TextFormat, XhtmlFormat
from service.documents.formats.subtitles import SrtFormat, VttFormat
from service.documents.safe import DocumentError
from tests.service.document_helpers import identity, translate, unit_texts

TEXT, HTML, XHTML = TextFormat(), HtmlFormat(), XhtmlFormat()


def test_a_text_file_is_its_paragraphs_and_its_blank_lines_stay() -> None:
    source = "Two dogs play.\nThey run.\r\n\r\n  \r\nA man rides a bike.\n"
    assert unit_texts(TEXT, source.encode()) == [
        "Two dogs play.\nThey run.",
        "A man rides a bike.\n",
    ]
    assert identity(TEXT, source.encode()) == source.encode()
    assert translate(TEXT, source.encode()) == source.upper().encode()


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig", "cp1252"])
def test_a_text_file_keeps_its_encoding_and_byte_order_mark(encoding: str) -> None:
    text = "Ça coûte très cher à Noël.\n"
    assert translate(TEXT, text.encode(encoding)) == text.upper().encode(encoding)


def test_a_character_the_legacy_encoding_cannot_hold_makes_a_text_file_utf8() -> None:
    extracted = TEXT.read("Noël.\n".encode("cp1252"), Limits())
    assert extracted.write(["Ωμέγα.\n"]) == "Ωμέγα.\n".encode()


def test_an_html_file_is_one_html_unit_in_its_declared_charset() -> None:
    source = (
        '<!DOCTYPE html><html><head><meta charset="windows-1252"><title>Noël</title></head>'
        "<body><p>A <b>big</b> dog.</p></body></html>"
    )
    (unit,) = HTML.read(source.encode("cp1252"), Limits()).units
    assert unit.format == "html" and unit.text == source
    out = translate(HTML, source.encode("cp1252"))
    assert out == source.replace("Noël", "NOËL").replace(
        "A <b>big</b> dog.", "A <b>BIG</b> DOG."
    ).encode("cp1252")
    extracted = HTML.read(source.encode("cp1252"), Limits())
    # What windows-1252 cannot hold becomes a character reference.
    assert b"&#937;" in extracted.write([source.replace("Noël", "Ω")])


def test_xhtml_goes_through_the_xml_path_and_stays_well_formed() -> None:
    source = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">'
        "<head><title>A dog</title></head><body><p>A <em>big</em> dog<br/>runs.</p></body></html>"
    )
    out = translate(XHTML, source.encode())
    root = etree.fromstring(out)
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert root.findtext("h:head/h:title", namespaces=ns) == "A DOG"
    assert root.find("h:body/h:p/h:br", namespaces=ns) is not None
    assert root.findtext("h:body/h:p/h:em", namespaces=ns) == "BIG"


def test_too_many_characters_and_binary_data_are_refused() -> None:
    with pytest.raises(DocumentError, match="more than the limit of 10"):
        TEXT.read(b"eleven characters", Limits(max_characters=10))
    with pytest.raises(DocumentError, match="NUL"):
        TEXT.read(b"\x00\x01\x02binary", Limits())


def test_each_format_knows_its_content() -> None:
    srt = b"1\n00:00:01,000 --> 00:00:02,000\nHi\n"
    vtt = b"WEBVTT\n\n00:01.000 --> 00:02.000\nHi\n"
    assert SrtFormat().sniff(srt) and not SrtFormat().sniff(b"Hi there\n")
    assert VttFormat().sniff(codecs.BOM_UTF8 + vtt) and not VttFormat().sniff(srt)
    assert TEXT.sniff("Grüße".encode("utf-16")) and not TEXT.sniff(b"PK\x03\x04\x00\x00\x00")
    assert XHTML.sniff(b"<?xml version='1.0'?><html/>") and not XHTML.sniff(b"plain words")
    # A multi-byte character cut by the 4 KB that sniff reads is still text.
    assert TEXT.sniff(("a" * 4095 + "é").encode())
