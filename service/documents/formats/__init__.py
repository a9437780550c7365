"""One module per family of file formats, each a filter over service/documents/base.py, each
exposing its formats as `FORMATS`. `choose` picks the format of a file sent by its name (or,
without a known extension, its declared media type) and checks its content: a file whose
content is not what its name says is refused, as is PDF (415 naming the formats there are)."""

from __future__ import annotations

from collections.abc import Sequence

from service.documents.base import DocumentFormat
from service.documents.formats import (
    epub,
    localization,
    markdown,
    ooxml,
    opendocument,
    plain,
    subtitles,
)
from service.documents.safe import DocumentError
from service.errors import ErrorType

FORMATS: tuple[DocumentFormat, ...] = (
    *ooxml.FORMATS,
    *opendocument.FORMATS,
    *epub.FORMATS,
    *subtitles.FORMATS,
    *markdown.FORMATS,
    *localization.FORMATS,
    *plain.FORMATS,
)

PDF_MAGIC = b"%PDF-"
# Media types that say nothing of a file's format (curl's default, a browser's guess).
_GENERIC_TYPES = frozenset({"", "application/octet-stream", "binary/octet-stream"})
# Media types clients give any text or XML file (httpx and browsers send text/plain for .srt,
# .md and .po): they do not name a format against a file's extension.
_TEXT_TYPES = frozenset({"text/plain", "text/xml", "application/xml"})


def names(formats: Sequence[DocumentFormat] = FORMATS) -> list[str]:
    return [f.name for f in formats]


def by_name(name: str, formats: Sequence[DocumentFormat] = FORMATS) -> DocumentFormat:
    for f in formats:
        if f.name == name:
            return f
    raise unsupported(f"no document format is named {name!r}", formats)


def unsupported(why: str, formats: Sequence[DocumentFormat] = FORMATS) -> DocumentError:
    supported = ", ".join(f"{f.name} ({' '.join(f.extensions)})" for f in formats)
    return DocumentError(f"{why}; supported: {supported}", ErrorType.UNSUPPORTED_MEDIA_TYPE)


def extension(filename: str) -> str:
    """The file name's extension, lower case with its dot ('' if none)."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return "." + base.rsplit(".", 1)[1].lower() if "." in base.strip(".") else ""


def choose(
    filename: str,
    media_type: str | None,
    data: bytes,
    formats: Sequence[DocumentFormat] = FORMATS,
) -> DocumentFormat:
    """The format of a file sent as `filename` with `media_type` (a form part's Content-Type),
    checked against its content."""
    suffix = extension(filename)
    declared = (media_type or "").split(";", 1)[0].strip().lower()
    if suffix == ".pdf" or declared == "application/pdf" or data.startswith(PDF_MAGIC):
        raise unsupported("PDF files are not translated", formats)
    if not data:
        raise DocumentError(f"{filename or 'the file'} is empty")
    by_type = next((f for f in formats if f.media_type == declared), None)
    chosen = next((f for f in formats if suffix in f.extensions), None) if suffix else None
    if chosen is None:
        chosen = by_type
    if chosen is None:
        what = f"files named *{suffix}" if suffix else "files without an extension"
        if declared not in _GENERIC_TYPES:
            what += f" and of type {declared}"
        raise unsupported(f"{what} are not translated", formats)
    if by_type is not None and by_type is not chosen and declared not in _TEXT_TYPES:
        raise unsupported(
            f"{filename} is named as a {chosen.name} file but sent as {declared} ({by_type.name})",
            formats,
        )
    if not chosen.sniff(data):
        others = [f.name for f in formats if f is not chosen and f.sniff(data)]
        looks = f" (its content is {' or '.join(others)})" if others else ""
        raise unsupported(
            f"{filename or 'the file'} is not a {chosen.name} file by its content{looks}", formats
        )
    return chosen
