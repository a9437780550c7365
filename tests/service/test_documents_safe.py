"""service/documents/safe.py and the format registry: hostile archives and XML are refused with
the right error type, and a rewritten archive keeps every entry it did not replace."""

from __future__ import annotations

import io
import zipfile

import pytest

from service.documents.base import Limits
from service.documents.formats import choose, extension
from service.documents.safe import OLE_MAGIC, Archive, DocumentError, parse_xml
from service.errors import ErrorType


def make_zip(entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()


DEFAULT = Limits()


def refused(data: bytes, limits: Limits = DEFAULT) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        Archive(data, limits, "docx")
    return caught.value


def test_zip_bomb_by_ratio_and_sizes_is_413() -> None:
    bomb = make_zip({"a.xml": b"\0" * (8 << 20)})
    error = refused(bomb)
    assert error.type is ErrorType.PAYLOAD_TOO_LARGE
    assert "compressed" in error.message and "zip bomb" in error.message
    too_big = refused(make_zip({"a": b"x" * 3000}), Limits(max_entry_bytes=2000))
    assert too_big.type is ErrorType.PAYLOAD_TOO_LARGE and "a" in too_big.message
    total = refused(make_zip({"a": b"x" * 600, "b": b"y" * 600}), Limits(max_total_bytes=1000))
    assert total.type is ErrorType.PAYLOAD_TOO_LARGE and "1200 bytes" in total.message
    many = refused(make_zip({str(i): b"" for i in range(5)}), Limits(max_entries=4))
    assert many.type is ErrorType.PAYLOAD_TOO_LARGE and "5 entries" in many.message


@pytest.mark.parametrize("name", ["../evil.xml", "/etc/passwd", "a/../../b", "C:/x", "a\\..\\b"])
def test_names_outside_the_archive_are_refused(name: str) -> None:
    error = refused(make_zip({"ok.xml": b"<a/>", name: b"x"}))
    assert error.type is ErrorType.INVALID_DOCUMENT and "outside" in error.message


def test_encrypted_entries_and_ole_files_are_named() -> None:
    data = bytearray(make_zip({"word/document.xml": b"garbage"}))
    for header, flags in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # the encrypted bit
        data[data.index(header) + flags] |= 0x1
    assert "encrypted" in refused(bytes(data)).message
    ole = refused(OLE_MAGIC + b"\0" * 512)
    assert ole.type is ErrorType.INVALID_DOCUMENT and "password" in ole.message
    assert "not a readable zip" in refused(b"PK\x03\x04 truncated").message


def test_rewrite_keeps_order_compression_and_bytes_of_other_entries() -> None:
    entries = {"mimetype": b"application/x", "b.xml": b"<b>old</b>", "c.png": bytes(range(256))}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("mimetype", entries["mimetype"], zipfile.ZIP_STORED)
        z.writestr("b.xml", entries["b.xml"], zipfile.ZIP_DEFLATED)
        z.writestr("c.png", entries["c.png"], zipfile.ZIP_STORED)
    archive = Archive(out.getvalue(), Limits(), "odt")
    rewritten = zipfile.ZipFile(io.BytesIO(archive.rewrite({"b.xml": b"<b>new</b>"})))
    before = zipfile.ZipFile(io.BytesIO(out.getvalue()))
    assert rewritten.namelist() == before.namelist()
    for old, new in zip(before.infolist(), rewritten.infolist(), strict=True):
        assert (old.compress_type, old.date_time) == (new.compress_type, new.date_time)
    assert rewritten.read("b.xml") == b"<b>new</b>"
    assert rewritten.read("c.png") == entries["c.png"]
    assert rewritten.read("mimetype") == entries["mimetype"]


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">]>
<lolz>&lol2;</lolz>"""
XXE = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><r>&xxe;</r>"""


@pytest.mark.parametrize("data", [BILLION_LAUGHS, XXE])
def test_xml_with_entities_is_refused(data: bytes) -> None:
    with pytest.raises(DocumentError, match="declares XML entities"):
        parse_xml(data, "the part")


def test_xml_that_is_broken_is_refused_and_plain_xml_is_read() -> None:
    with pytest.raises(DocumentError, match="not well-formed"):
        parse_xml(b"<a><b></a>", "the part")
    assert parse_xml(b'<?xml version="1.0"?><!DOCTYPE html><a>x</a>', "p").text == "x"


def test_registry_refuses_pdf_unknown_and_empty() -> None:
    pdf = choose_error("paper.pdf", None, b"%PDF-1.7 ...")
    assert pdf.type is ErrorType.UNSUPPORTED_MEDIA_TYPE and "PDF" in pdf.message
    assert "supported:" in pdf.message
    assert "PDF" in choose_error("paper.docx", None, b"%PDF-1.4").message
    unknown = choose_error("a.xyz", "application/x-thing", b"data")
    assert unknown.type is ErrorType.UNSUPPORTED_MEDIA_TYPE and "*.xyz" in unknown.message
    assert choose_error("a.docx", None, b"").type is ErrorType.INVALID_DOCUMENT
    assert extension("dir.v2/Report.DOCX") == ".docx" and extension(".bashrc") == ""


def choose_error(name: str, media_type: str | None, data: bytes) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        choose(name, media_type, data)
    return caught.value
