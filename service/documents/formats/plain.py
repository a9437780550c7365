"""Plain text and HTML files, through the paths `POST /translate` already has: a text file's
paragraphs are text units, an HTML file is one html unit (service/text/markup.py reads and
writes it). What these formats add is the file's encoding, read and kept (`decode`), which the
subtitle and Markdown formats use too.

Encoding: a byte order mark (UTF-8, UTF-16, UTF-32) says it; else, in HTML, the `<meta
charset>` (or `http-equiv` content type) and, in XHTML, the XML declaration, within the first
1,024 bytes as browsers look; else UTF-8 when the bytes are UTF-8; else what charset-normalizer
finds likeliest (a legacy Windows or ISO-8859 subtitle or text file). The translation is written
in the same encoding with the same mark; a character that a legacy encoding cannot hold becomes
a character reference in HTML, and makes a text file UTF-8 (without a mark) rather than lose it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass

from charset_normalizer import from_bytes

from service.documents.base import Extracted, Limits, Unit, UnitFormat

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16's, which it starts with
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SNIFFED = 1024
_META_CHARSET = re.compile(
    rb"""<meta\s[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE
)
_XML_ENCODING = re.compile(rb"""^<\?xml\s[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
# Paragraphs of a text file: what lies between runs of blank lines (captured: kept).
_BLANK_LINES = re.compile(r"((?:\r?\n|\r)(?:[ \t]*(?:\r?\n|\r))+)")


class DocumentError(ValueError):
    """A file this format cannot read: the message says what is wrong with it."""


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


def _decode(data: bytes, markup: bool) -> Decoded:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return Decoded(_strict(data[len(bom) :], encoding), encoding, bom)
    if markup:
        head = data[:_SNIFFED]
        declared = _XML_ENCODING.search(head) or _META_CHARSET.search(head)
        if declared is not None:
            codec = _codec(declared.group(1).decode("ascii"))
            if codec is not None:
                return Decoded(_strict(data, codec), codec)
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        pass
    best = from_bytes(data).best()
    if best is None:
        raise DocumentError("not a text file: no text encoding reads it")
    return Decoded(str(best), best.encoding)


def _codec(label: str) -> str | None:
    """The codec of an encoding label; HTML reads ISO-8859-1 and ASCII as windows-1252."""
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return None
    return "cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name


def _strict(data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise DocumentError(f"not {encoding} text, as the file says it is: {e.reason}") from e


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

    def read(self, data: bytes, limits: Limits) -> Extracted:
        decoded = decode(data, limits)
        return _Paragraphs(decoded, _BLANK_LINES.split(decoded.text))


class HtmlFormat:
    name = "html"
    extensions = (".html", ".htm")
    media_type = "text/html"

    def read(self, data: bytes, limits: Limits) -> Extracted:
        return _Html(decode(data, limits, markup=True), "html")


class XhtmlFormat:
    """XHTML is XML: read and written by the XML path, so that it stays well-formed (an EPUB
    reader refuses what the HTML serialiser writes, `<br>` for `<br/>`). Written in UTF-8, as
    the XML path writes its declaration."""

    name = "xhtml"
    extensions = (".xhtml",)
    media_type = "application/xhtml+xml"

    def read(self, data: bytes, limits: Limits) -> Extracted:
        decoded = decode(data, limits, markup=True)
        return _Html(Decoded(decoded.text, "utf-8", decoded.bom and codecs.BOM_UTF8), "xml")


FORMATS = (TextFormat(), HtmlFormat(), XhtmlFormat())
