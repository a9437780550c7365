"""Plain text and HTML files, through the paths `POST /translate` already has: a text file's
paragraphs are text units, an HTML file is one html unit (service/text/markup.py reads and
writes it). What these formats add is the file's encoding, read and kept (`decode`), which the
subtitle and Markdown formats use too.

Encoding: a byte order mark (UTF-8, UTF-16, UTF-32) says it; else, in HTML, the `<meta
charset>` (or `http-equiv` content type) and, in XHTML, the XML declaration, within the first
1,024 bytes as browsers look; else UTF-8 when the bytes are UTF-8; else windows-1252, the
legacy encoding of Western European text and what browsers fall back to (ISO-8859-1 for the
five bytes it leaves undefined). A file in another legacy encoding must say so (HTML) or be
sent as UTF-8: guessing was measured wrong on subtitle-sized text (charset-normalizer 3.5.3
read "Noël." in windows-1252 as Big5, a French sentence as windows-1250 and a Russian line in
windows-1251 as cp1125). The translation is written
in the same encoding with the same mark; a character that a legacy encoding cannot hold becomes
a character reference in HTML, and makes a text file UTF-8 (without a mark) rather than lose it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass

from service.documents.base import Extracted, Limits, Unit, UnitFormat
from service.documents.safe import DocumentError

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16's, which it starts with
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SNIFFED = 1024
_SNIFFED_TEXT = 4096
# What starts an XML document: a declaration, a comment, a doctype or an element.
_XML_START = re.compile(r"\s*<[?!a-zA-Z]")
_META_CHARSET = re.compile(
    rb"""<meta\s[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE
)
_XML_ENCODING = re.compile(rb"""^<\?xml\s[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
# Paragraphs of a text file: what lies between runs of blank lines (captured: kept).
_BLANK_LINES = re.compile(r"((?:\r?\n|\r)(?:[ \t]*(?:\r?\n|\r))+)")


@dataclass(frozen=True)
class Decoded:
    """A file's text, and how to write text back as that file was written."""

    text: str
    encoding: str  # a Python codec name
    bom: bytes = b""

    def encode(self, text: str, *, references: bool = False) -> bytes:
        """`text` in the file's encoding after its byte order mark; what the encoding cannot
        hold becomes a character reference (`references`, HTML and XML), or else the whole
        text UTF-8."""
        try:
            return self.bom + text.encode(self.encoding)
        except UnicodeEncodeError:
            if references:
                return self.bom + text.encode(self.encoding, "xmlcharrefreplace")
            return text.encode("utf-8")


def decode(data: bytes, limits: Limits, *, markup: bool = False) -> Decoded:
    """`data`'s text and encoding (the module's docstring says how it is found); `markup`:
    look for a meta charset and an XML declaration too. Over `limits.max_characters`, or not
    text at all, is a DocumentError."""
    decoded = _decode(data, markup)
    if len(decoded.text) > limits.max_characters:
        raise DocumentError(
            f"{len(decoded.text)} characters, more than the limit of {limits.max_characters}"
        )
    if "\x00" in decoded.text:
        raise DocumentError("not a text file: it holds NUL characters")
    return decoded


def text_head(data: bytes, *, markup: bool = False) -> str | None:
    """The text that `data` starts with (its first 4 KB decoded as `decode` would), or None
    when it is not text (undecodable, or NUL characters): what the text formats' `sniff`
    reads."""
    try:
        text = _decode(data[:_SNIFFED_TEXT], markup, final=len(data) <= _SNIFFED_TEXT).text
    except DocumentError:
        return None
    return None if "\x00" in text else text


def _decode(data: bytes, markup: bool, final: bool = True) -> Decoded:
    """`final`: `data` is the whole file, not its start (which may end inside a character)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return Decoded(_strict(data[len(bom) :], encoding, final), encoding, bom)
    if markup:
        head = data[:_SNIFFED]
        declared = _XML_ENCODING.search(head) or _META_CHARSET.search(head)
        if declared is not None:
            codec = _codec(declared.group(1).decode("ascii"))
            if codec is not None:
                return Decoded(_strict(data, codec, final), codec)
    for encoding in ("utf-8", "cp1252"):
        try:
            return Decoded(_strict(data, encoding, final), encoding)
        except DocumentError:
            pass
    return Decoded(data.decode("latin-1"), "latin-1")  # cp1252's five undefined bytes


def _codec(label: str) -> str | None:
    """The codec of an encoding label; HTML reads ISO-8859-1 and ASCII as windows-1252."""
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return None
    return "cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name


def _strict(data: bytes, encoding: str, final: bool = True) -> str:
    try:
        return codecs.getincrementaldecoder(encoding)().decode(data, final)
    except UnicodeDecodeError as e:
        raise DocumentError(f"not {encoding} text, as the file says it is: {e.reason}") from e


def tight_breaks(text: str) -> str:
    """`text` without the spaces and tabs around its line breaks (line by line: the regular
    expression [ \\t]*\\n[ \\t]* takes time quadratic in a run of spaces)."""
    lines = text.split("\n")
    last = len(lines) - 1
    return "\n".join(
        line.rstrip(" \t") if i == 0 else line.lstrip(" \t") if i == last else line.strip(" \t")
        for i, line in enumerate(lines)
    )


@dataclass(frozen=True)
class _Paragraphs:
    """A text file: its paragraphs as units, between the blank lines kept as they were."""

    decoded: Decoded
    pieces: list[str]  # paragraph, separator, paragraph, ...: units are the even ones

    @property
    def units(self) -> Sequence[Unit]:
        return [Unit(piece) for piece in self.pieces[::2]]

    def write(self, translations: Sequence[str]) -> bytes:
        pieces = list(self.pieces)
        pieces[::2] = translations
        return self.decoded.encode("".join(pieces))


@dataclass(frozen=True)
class _Html:
    """A markup file: one unit, the whole document."""

    decoded: Decoded
    format: UnitFormat

    @property
    def units(self) -> Sequence[Unit]:
        return [Unit(self.decoded.text, self.format)]

    def write(self, translations: Sequence[str]) -> bytes:
        (translation,) = translations
        return self.decoded.encode(translation, references=True)


class TextFormat:
    name = "txt"
    extensions = (".txt",)
    media_type = "text/plain"

    def sniff(self, data: bytes) -> bool:
        return text_head(data) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        decoded = decode(data, limits)
        return _Paragraphs(decoded, _BLANK_LINES.split(decoded.text))


class HtmlFormat:
    name = "html"
    extensions = (".html", ".htm")
    media_type = "text/html"

    def sniff(self, data: bytes) -> bool:
        """Any text: the HTML parser reads anything, as browsers do."""
        return text_head(data, markup=True) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        return _Html(decode(data, limits, markup=True), "html")


class XhtmlFormat:
    """XHTML is XML: read and written by the XML path, so that it stays well-formed (an EPUB
    reader refuses what the HTML serialiser writes, `<br>` for `<br/>`). Written in UTF-8, as
    the XML path writes its declaration."""

    name = "xhtml"
    extensions = (".xhtml",)
    media_type = "application/xhtml+xml"

    def sniff(self, data: bytes) -> bool:
        head = text_head(data, markup=True)
        return head is not None and _XML_START.match(head) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        decoded = decode(data, limits, markup=True)
        return _Html(Decoded(decoded.text, "utf-8", decoded.bom and codecs.BOM_UTF8), "xml")


FORMATS = (TextFormat(), HtmlFormat(), XhtmlFormat())
