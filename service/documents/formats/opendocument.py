"""OpenDocument text, presentations and spreadsheets (odt, odp, ods), read and written with
lxml over service/documents/safe.py's archive (limits, no entities) and its `rewrite`: only the
parts with translated text are written again, every other entry comes back byte for byte, in
its order and with its compression (the mimetype first and stored, as ODF requires).

What is translated: every paragraph and heading (`text:p`, `text:h`) of content.xml (body,
tables, lists, frames and text boxes, footnotes and endnotes, slides and their speaker notes,
shapes), the headers and footers of styles.xml's master pages (odt, ods), and meta.xml's title,
subject and description. A spreadsheet's cells are translated only when they hold a string
(office:value-type "string", or none): never a number, date, time, percentage, currency,
boolean, nor a formula's result. Never: comments (office:annotation), presentation master pages.

A paragraph is one unit. `text:span` and `text:a` are codes around the target words their
source words align to, written as copies of the source's element (style, link target and
all). Every other element in it (spaces `text:s`, tabs, line breaks, fields, bookmarks, a
footnote or frame anchored in the text) is an empty code placed by alignment: the element
itself, moved, so what it holds (a footnote's paragraphs, a text box's) is translated as
paragraphs of its own. A paragraph whose words all lie in spans (LibreOffice writes direct
formatting so) is read with its longest span as the paragraph's base: the span's text is the
paragraph's, and in the translation every stretch outside the other codes goes back into a
copy of that span; else each span would be translated alone. A line break or tab parts the
words on either side: its code has a space before it in the unit (the model reads
"runs<line-break/>through" as two words), and the spaces next to it are taken out when written.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from service.documents.base import (
    Code,
    Extracted,
    Limits,
    Unit,
    append_text,
    inline,
    plain,
    read_inline,
    space_apart,
)
from service.documents.safe import Archive, DocumentError, serialize_xml
from service.text.markup import translatable

_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
_DC = "http://purl.org/dc/elements/1.1/"
_PARAGRAPHS = (f"{{{_TEXT}}}p", f"{{{_TEXT}}}h")
_WRAPS = frozenset({f"{{{_TEXT}}}span", f"{{{_TEXT}}}a"})
_BREAKS = frozenset({f"{{{_TEXT}}}line-break", f"{{{_TEXT}}}tab"})  # they part words
_ANNOTATION = f"{{{_OFFICE}}}annotation"
_CELL = f"{{{_TABLE}}}table-cell"
_COVERED_CELL = f"{{{_TABLE}}}covered-table-cell"
_VALUE_TYPE = f"{{{_OFFICE}}}value-type"
_FORMULA = f"{{{_TABLE}}}formula"
_MASTER_PAGE = f"{{{_STYLE}}}master-page"
_META_TEXTS = (f"{{{_DC}}}title", f"{{{_DC}}}subject", f"{{{_DC}}}description")


@dataclass(frozen=True)
class _Wrap:
    """A span or link: a copy of its element without content."""

    shell: Any


@dataclass
class _Paragraph:
    """A paragraph's element, its unit's children, its codes' meanings (a `_Wrap`, or the
    element an empty code stands for), and its base span (or None)."""

    element: Any
    children: list[Code | str]
    table: list[_Wrap | Any]
    base: Any | None


def _shell(element: Any) -> Any:
    shell = copy.copy(element)
    for child in list(shell):
        shell.remove(child)
    shell.text = shell.tail = None
    return shell


def _read_paragraph(element: Any) -> _Paragraph:
    paragraph = _Paragraph(element, [], [], None)
    words = [c for c in element if c.tag in _WRAPS]
    if not translatable(element.text or "") and not any(
        translatable(c.tail or "") for c in element
    ):
        longest = max(words, key=_length, default=None)
        if longest is not None and len(words) > 1:
            paragraph.base = longest
    _content(paragraph, element, paragraph.children, top=True)
    return paragraph


def _length(element: Any) -> int:
    return len("".join(element.itertext()))


def _content(paragraph: _Paragraph, element: Any, into: list[Code | str], top: bool) -> None:
    _text(element.text, into)
    for child in element:
        if top and child is paragraph.base:
            _content(paragraph, child, into, top=False)
        elif child.tag in _WRAPS:
            paragraph.table.append(_Wrap(_shell(child)))
            code = Code(len(paragraph.table) - 1)
            into.append(code)
            _content(paragraph, child, code.children, top=False)
        else:
            if child.tag in _BREAKS:
                space_apart(into)
            paragraph.table.append(child)
            into.append(Code(len(paragraph.table) - 1))
        _text(child.tail, into)


def _text(text: str | None, into: list[Code | str]) -> None:
    if text:
        into.append(text)


def _write_paragraph(paragraph: _Paragraph, translation: str) -> None:
    element = paragraph.element
    element.text = None
    for child in list(element):
        element.remove(child)
    _fill(paragraph, element, read_inline(translation), top=True)
    for entry in paragraph.table:  # no space next to a line break or tab
        if isinstance(entry, _Wrap) or entry.tag not in _BREAKS:
            continue
        before, parent = entry.getprevious(), entry.getparent()
        if before is not None:
            before.tail = (before.tail or "").rstrip(" ") or None
        elif parent is not None:
            parent.text = (parent.text or "").rstrip(" ") or None
        entry.tail = (entry.tail or "").lstrip(" ") or None


def _fill(paragraph: _Paragraph, parent: Any, children: Sequence[Code | str], top: bool) -> None:
    for child in children:
        if isinstance(child, str):
            words = child.strip()
            if top and paragraph.base is not None and words:
                # The words in a copy of the base span, the spaces around them outside it.
                append_text(parent, child[: len(child) - len(child.lstrip())])
                base = _shell(paragraph.base)
                base.text = words
                parent.append(base)
                append_text(parent, child[len(child.rstrip()) :])
            else:
                append_text(parent, child)
            continue
        entry = paragraph.table[child.index]
        if isinstance(entry, _Wrap):
            element = copy.copy(entry.shell)
            parent.append(element)
            _fill(paragraph, element, child.children, top=False)
        else:
            entry.tail = None
            parent.append(entry)


def _translated_here(element: Any, spreadsheet: bool) -> bool:
    """Whether a paragraph is one to translate: not in a comment, and in a spreadsheet not in
    a cell holding anything but a string, nor in a formula's (its text is the formula's)."""
    for ancestor in element.iterancestors():
        if ancestor.tag == _ANNOTATION:
            return False
        if spreadsheet and ancestor.tag in (_CELL, _COVERED_CELL):
            return (
                ancestor.get(_VALUE_TYPE, "string") == "string" and ancestor.get(_FORMULA) is None
            )
    return True


@dataclass(frozen=True)
class _Part:
    name: str
    root: Any


@dataclass(frozen=True)
class _OpenDocument:
    archive: Archive
    parts: list[_Part]
    paragraphs: list[tuple[int, _Paragraph]]  # (its part, the paragraph)
    meta: list[tuple[int, Any]]  # (the part, a dc:title...)

    @cached_property  # built once: the writer reads them again
    def units(self) -> Sequence[Unit]:
        return [inline(p.children) for _, p in self.paragraphs] + [
            Unit(element.text) for _, element in self.meta
        ]

    def write(self, translations: Sequence[str]) -> bytes:
        count = len(self.paragraphs) + len(self.meta)
        if len(translations) != count:
            raise ValueError(f"{len(translations)} translations for {count} units")
        changed: set[int] = set()
        units = self.units
        for (part, paragraph), unit, translation in zip(
            self.paragraphs, units, translations, strict=False
        ):
            if translation != unit.text:
                _write_paragraph(paragraph, translation)
                changed.add(part)
        for (part, element), translation in zip(
            self.meta, translations[len(self.paragraphs) :], strict=True
        ):
            if translation != element.text:
                element.text = translation
                changed.add(part)
        return self.archive.rewrite(
            {self.parts[p].name: serialize_xml(self.parts[p].root) for p in sorted(changed)}
        )


class OpenDocumentFormat:
    """One OpenDocument format: its name, mimetype, and where its paragraphs are."""

    def __init__(self, name: str, kind: str, media_type: str) -> None:
        self.name = name
        self.kind = kind
        self.extensions = (f".{name}",)
        self.media_type = media_type

    def sniff(self, data: bytes) -> bool:
        try:
            return self._archive(data, Limits()) is not None
        except DocumentError:
            return False

    def _archive(self, data: bytes, limits: Limits) -> Archive:
        archive = Archive(data, limits, self.name)
        if "mimetype" not in archive or archive.read("mimetype") != self.media_type.encode():
            raise DocumentError(
                f"not an OpenDocument {self.kind}: its mimetype entry is not {self.media_type}"
            )
        return archive

    def read(self, data: bytes, limits: Limits) -> Extracted:
        archive = self._archive(data, limits)
        parts: list[_Part] = []
        paragraphs: list[tuple[int, _Paragraph]] = []
        meta: list[tuple[int, Any]] = []
        spreadsheet = self.name == "ods"
        for name in ("content.xml", "styles.xml", "meta.xml"):
            if name not in archive or (name == "styles.xml" and self.name == "odp"):
                continue
            root = archive.xml(name)
            parts.append(_Part(name, root))
            part = len(parts) - 1
            if name == "meta.xml":
                for element in root.iter(*_META_TEXTS):
                    if len(element) == 0 and translatable(element.text or ""):
                        meta.append((part, element))
                continue
            scopes = [root] if name == "content.xml" else list(root.iter(_MASTER_PAGE))
            for scope in scopes:
                for element in scope.iter(*_PARAGRAPHS):
                    if not _translated_here(element, spreadsheet):
                        continue
                    paragraph = _read_paragraph(element)
                    if translatable(plain(paragraph.children)):
                        paragraphs.append((part, paragraph))
        characters = sum(len(plain(p.children)) for _, p in paragraphs)
        if characters > limits.max_characters:
            raise DocumentError(
                f"the {self.name} file holds {characters} characters of text; the limit is "
                f"{limits.max_characters}"
            )
        return _OpenDocument(archive, parts, paragraphs, meta)


ODT = OpenDocumentFormat("odt", "text", "application/vnd.oasis.opendocument.text")
ODP = OpenDocumentFormat("odp", "presentation", "application/vnd.oasis.opendocument.presentation")
ODS = OpenDocumentFormat("ods", "spreadsheet", "application/vnd.oasis.opendocument.spreadsheet")
FORMATS = (ODT, ODP, ODS)
