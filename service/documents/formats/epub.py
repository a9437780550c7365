"""EPUB 2 and 3 books, over service/documents/safe.py's archive (limits, no entities, names
inside the book) and its `rewrite` (every entry not translated comes back byte for byte, the
mimetype first and stored).

What is translated: each XHTML document of the package's manifest (chapters, and EPUB 3's
navigation document, whose entries are its table of contents) as one unit through the XML
markup path that `POST /translate` with format "xml" uses (XHTML's script, style, code, pre...
kept, inline elements placed by alignment, well-formed XML out: a reading system refuses what
an HTML serialiser writes); EPUB 2's table of contents (toc.ncx: the book's title and each
navigation label) and the package's dc:title and dc:description, as plain text.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from service.documents.base import Extracted, Limits, Unit
from service.documents.safe import Archive, DocumentError, parse_xml, serialize_xml
from service.text.markup import translatable

_CONTAINER = "META-INF/container.xml"
_MEDIA_TYPE = "application/epub+zip"
_OPF = "http://www.idpf.org/2007/opf"
_NCX = "http://www.daisy.org/z3986/2005/ncx/"
_DC = "http://purl.org/dc/elements/1.1/"
_CONTAINER_NS = "urn:oasis:names:tc:opendocument:xmlns:container"
_XHTML_TYPE = "application/xhtml+xml"
_NCX_TYPE = "application/x-dtbncx+xml"


@dataclass(frozen=True)
class _Text:
    """A text of an XML part (OPF, NCX): the part and the element holding it."""

    part: str
    element: Any


@dataclass(frozen=True)
class _Book:
    archive: Archive
    chapters: list[tuple[str, str]]  # (entry name, its XHTML text)
    texts: list[_Text]
    roots: dict[str, Any]  # the OPF's and NCX's trees, by entry name

    @property
    def units(self) -> Sequence[Unit]:
        return [Unit(text, "xml") for _, text in self.chapters] + [
            Unit(text.element.text) for text in self.texts
        ]

    def write(self, translations: Sequence[str]) -> bytes:
        count = len(self.chapters) + len(self.texts)
        if len(translations) != count:
            raise ValueError(f"{len(translations)} translations for {count} units")
        replaced: dict[str, bytes] = {}
        for (name, source), translation in zip(self.chapters, translations, strict=False):
            if translation != source:
                replaced[name] = translation.encode("utf-8")
        changed: set[str] = set()
        for text, translation in zip(self.texts, translations[len(self.chapters) :], strict=True):
            if translation != text.element.text:
                text.element.text = translation
                changed.add(text.part)
        for name in changed:
            replaced[name] = serialize_xml(self.roots[name])
        return self.archive.rewrite(replaced)


def _entry(base: str, href: str) -> str:
    """The archive entry an href of the package document (at `base`) names."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), unquote(href.split("#")[0])))


def _chapter(archive: Archive, name: str) -> str:
    data = archive.read(name)
    parse_xml(data, f"the epub file's entry {name!r}")  # well-formed, no entities
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(
            f"the epub file's entry {name!r} is not UTF-8, as EPUB requires"
        ) from None


class EpubFormat:
    name = "epub"
    extensions = (".epub",)
    media_type = _MEDIA_TYPE

    def sniff(self, data: bytes) -> bool:
        try:
            return self._archive(data, Limits()) is not None
        except DocumentError:
            return False

    def _archive(self, data: bytes, limits: Limits) -> Archive:
        archive = Archive(data, limits, self.name)
        if "mimetype" not in archive or archive.read("mimetype").strip() != _MEDIA_TYPE.encode():
            raise DocumentError(f"not an EPUB book: its mimetype entry is not {_MEDIA_TYPE}")
        return archive

    def read(self, data: bytes, limits: Limits) -> Extracted:
        archive = self._archive(data, limits)
        container = archive.xml(_CONTAINER)
        rootfile = container.find(f".//{{{_CONTAINER_NS}}}rootfile")
        if rootfile is None or not rootfile.get("full-path"):
            raise DocumentError("the epub file's container names no package document")
        opf_name = rootfile.get("full-path")
        opf = archive.xml(opf_name)
        roots = {opf_name: opf}
        chapters: list[tuple[str, str]] = []
        texts: list[_Text] = []
        for item in opf.iterfind(f"{{{_OPF}}}manifest/{{{_OPF}}}item"):
            href, media_type = item.get("href", ""), item.get("media-type")
            name = _entry(opf_name, href)
            if media_type not in (_XHTML_TYPE, _NCX_TYPE) or name not in archive:
                continue
            if media_type == _XHTML_TYPE:
                chapters.append((name, _chapter(archive, name)))
                continue
            ncx = archive.xml(name)
            roots[name] = ncx
            labels = ncx.iterfind(f".//{{{_NCX}}}text")
            texts += [_Text(name, label) for label in labels if translatable(label.text or "")]
        for tag in ("title", "description"):
            for element in opf.iterfind(f"{{{_OPF}}}metadata/{{{_DC}}}{tag}"):
                if len(element) == 0 and translatable(element.text or ""):
                    texts.append(_Text(opf_name, element))
        characters = sum(len(text) for _, text in chapters)
        if characters > limits.max_characters:
            raise DocumentError(
                f"the epub file's documents hold {characters} characters; the limit is "
                f"{limits.max_characters}"
            )
        return _Book(archive, chapters, texts, roots)


FORMATS = (EpubFormat(),)
