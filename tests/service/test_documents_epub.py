"""EPUB books (service/documents/formats/epub.py): chapters through the XML markup path, the
navigation document, toc.ncx's labels and the package's title and description translated;
every other entry byte for byte; the output's XHTML parses in lxml."""

from __future__ import annotations

import io
import zipfile

import pytest
from lxml import etree

from service.documents.base import Limits
from service.documents.formats.epub import EpubFormat
from service.documents.safe import DocumentError
from tests.service.document_helpers import translate

EPUB = EpubFormat()
XHTML = "http://www.w3.org/1999/xhtml"
NS = {"h": XHTML, "opf": "http://www.idpf.org/2007/opf", "dc": "http://purl.org/dc/elements/1.1/",
      "ncx": "http://www.daisy.org/z3986/2005/ncx/"}  # fmt: skip

CONTAINER = """<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles>
    <rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>
  </rootfiles>
</container>"""

OPF = """<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:identifier id="id">urn:uuid:1</dc:identifier>
    <dc:title>Two dogs</dc:title>
    <dc:description>A book about two dogs.</dc:description>
    <dc:creator>Ann Smith</dc:creator>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="c1" href="text/chapter%201.xhtml" media-type="application/xhtml+xml"/>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="css" href="style.css" media-type="text/css"/>
  </manifest>
  <spine toc="ncx"><itemref idref="c1"/></spine>
</package>"""

NAV = """<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">
<head><title>Contents</title></head>
<body><nav epub:type="toc"><ol>
<li><a href="text/chapter%201.xhtml">The first day</a></li>
</ol></nav></body>
</html>"""

CHAPTER = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml">
<head><title>The first day</title><link rel="stylesheet" href="../style.css"/></head>
<body>
<h1>The first day</h1>
<p>A <b>big</b> dog runs.<br/>It <a href="#x">plays</a>.</p>
<pre>code stays</pre>
</body>
</html>"""

NCX = """<?xml version="1.0" encoding="UTF-8"?>
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">
  <docTitle><text>Two dogs</text></docTitle>
  <navMap><navPoint id="n1" playOrder="1"><navLabel><text>The first day</text></navLabel>
  <content src="text/chapter%201.xhtml"/></navPoint></navMap>
</ncx>"""


def epub(**replaced: str) -> bytes:
    entries = {
        "META-INF/container.xml": CONTAINER,
        "OEBPS/content.opf": OPF,
        "OEBPS/nav.xhtml": NAV,
        "OEBPS/text/chapter 1.xhtml": CHAPTER,
        "OEBPS/toc.ncx": NCX,
        "OEBPS/style.css": "p { color: red }",
    }
    entries.update(replaced)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        for name, text in entries.items():
            book.writestr(name, text)
    return out.getvalue()


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as book:
        return {info.filename: book.read(info) for info in book.infolist()}


def test_chapters_navigation_and_metadata_are_translated_and_the_rest_stays() -> None:
    source = epub()
    out = translate(EPUB, source)
    before, after = entries(source), entries(out)
    assert list(after) == list(before)
    for name in ("mimetype", "META-INF/container.xml", "OEBPS/style.css"):
        assert after[name] == before[name]
    chapter = etree.fromstring(after["OEBPS/text/chapter 1.xhtml"])
    assert chapter.findtext("h:head/h:title", namespaces=NS) == "THE FIRST DAY"
    assert chapter.findtext("h:body/h:h1", namespaces=NS) == "THE FIRST DAY"
    paragraph = chapter.find("h:body/h:p", NS)
    assert "".join(paragraph.itertext()) == "A BIG DOG RUNS.IT PLAYS."
    assert paragraph.findtext("h:b", namespaces=NS) == "BIG"
    assert paragraph.find("h:br", NS) is not None
    assert paragraph.find("h:a", NS).get("href") == "#x"
    assert chapter.findtext("h:body/h:pre", namespaces=NS) == "code stays"
    assert after["OEBPS/text/chapter 1.xhtml"].startswith(b"<?xml")
    nav = etree.fromstring(after["OEBPS/nav.xhtml"])
    assert nav.findtext(".//h:a", namespaces=NS) == "THE FIRST DAY"
    ncx = etree.fromstring(after["OEBPS/toc.ncx"])
    assert [t.text for t in ncx.iterfind(".//ncx:text", NS)] == ["TWO DOGS", "THE FIRST DAY"]
    opf = etree.fromstring(after["OEBPS/content.opf"])
    metadata = opf.find("opf:metadata", NS)
    assert metadata.findtext("dc:title", namespaces=NS) == "TWO DOGS"
    assert metadata.findtext("dc:description", namespaces=NS) == "A BOOK ABOUT TWO DOGS."
    assert metadata.findtext("dc:creator", namespaces=NS) == "Ann Smith"


def test_what_is_no_epub_or_unsafe_is_refused() -> None:
    with pytest.raises(DocumentError, match="mimetype"):
        EPUB.read(epub().replace(b"application/epub+zip", b"application/epub+zap"), Limits())
    bomb = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><html>&a;</html>'
    with pytest.raises(DocumentError, match="entities"):
        EPUB.read(epub(**{"OEBPS/text/chapter 1.xhtml": bomb}), Limits())
    with pytest.raises(DocumentError, match="characters"):
        EPUB.read(epub(), Limits(max_characters=100))
    assert EPUB.sniff(epub()) and not EPUB.sniff(b"PK\x03\x04 not a zip")
