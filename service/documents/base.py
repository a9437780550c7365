"""The contract between a document format and the translator, as in Okapi's filters and
translate-toolkit's stores: a format reads a file into `Unit`s (paragraphs of text whose inline
formatting is markup) and a skeleton of everything else, and writes the file back from the
units' translations. A format knows its file and nothing of models; the units go through the one
markup, alignment and batching path that `POST /translate` uses (service/scheduling/runtime.py),
so a paragraph of a document is translated exactly as the same text sent on its own.

Inline formatting. A paragraph made of runs (a docx `w:r` with its `w:rPr`, an ODF `text:span`,
a Markdown emphasis, a subtitle's `<i>`) becomes one XML unit: `<p>` holding the text, each
formatted stretch an element `<c0>`, `<c1>`, ... (nested where the source nests: a hyperlink
holding bold text). The element's number indexes the format's own table of what the code stands
for, so the translator sees only tag names and words, and places each element on the target
words its source words align to. `inline` builds such a unit from a tree of `Code`s and strings;
`read_inline` reads a translated unit back into the same kind of tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from lxml import etree

UnitFormat = Literal["text", "html", "xml"]

ROOT = "p"
_CODE = "c"


@dataclass(frozen=True)
class Unit:
    """A stretch the translator reads whole: `text` in the pipeline's `format` ("text": plain;
    "xml": an inline unit made by `inline`; "html": an HTML document or fragment)."""

    text: str
    format: UnitFormat = "text"


class Extracted(Protocol):
    """A file read: its units in document order, and how to write it back."""

    @property
    def units(self) -> Sequence[Unit]: ...

    def write(self, translations: Sequence[str]) -> bytes:
        """The file again, `translations[i]` (in `units[i].format`) in place of unit i."""
        ...


@dataclass(frozen=True)
class Limits:
    """What a file may unpack to (zip bombs) and how much text it may hold."""

    max_entries: int = 10_000
    max_entry_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    max_ratio: float = 200.0
    max_characters: int = 10_000_000


class DocumentFormat(Protocol):
    """A family member: its name (also the `format` API field), file name extensions, media
    type, and its reader."""

    @property
    def name(self) -> str: ...

    @property
    def extensions(self) -> tuple[str, ...]:
        """Lower case, with the dot: (".docx",)."""
        ...

    @property
    def media_type(self) -> str: ...

    def sniff(self, data: bytes) -> bool:
        """Whether the content is this format's, whatever the file's name says (a docx is a zip
        whose main part is a Word document; an srt has cue timings). Cheap: it reads only what
        it must (a zip's central directory, the first lines), and never raises."""
        ...

    def read(self, data: bytes, limits: Limits) -> Extracted:
        """The file's units; a file it cannot read raises service.documents.safe.DocumentError
        (a 4xx), never another error."""
        ...


@dataclass
class Code:
    """An inline code: `index` into the format's table, its content in order."""

    index: int
    children: list[Code | str] = field(default_factory=list)


def inline(children: Sequence[Code | str]) -> Unit:
    """The XML unit for a paragraph of strings and codes."""
    root = etree.Element(ROOT)
    _append(root, children)
    return Unit(etree.tostring(root, encoding="unicode"), "xml")


def _append(parent: etree._Element, children: Sequence[Code | str]) -> None:
    for child in children:
        if isinstance(child, str):
            append_text(parent, child)
        else:
            element = etree.SubElement(parent, f"{_CODE}{child.index}")
            _append(element, child.children)


def append_text(parent: etree._Element, text: str) -> None:
    """`text` at the end of `parent`'s content: its text, or its last child's tail. (lxml's
    len() counts the children one by one: asking it at each append was quadratic.)"""
    try:
        last = parent[-1]
    except IndexError:
        parent.text = (parent.text or "") + text
        return
    last.tail = (last.tail or "") + text


def space_apart(into: list[Code | str]) -> None:
    """A space at the end of `into` unless it ends with whitespace, before the code of a line
    break or tab: an empty code glues the words on either side ("runs<c0/>through" reads
    "runsthrough"), and these part them. The writer takes the spaces next to them out again."""
    if not into:
        return
    last = into[-1]
    if isinstance(last, Code):
        into.append(" ")
    elif last and not last[-1].isspace():
        into[-1] = last + " "


def plain(children: Sequence[Code | str]) -> str:
    """The text of strings and codes, without the codes."""
    return "".join(c if isinstance(c, str) else plain(c.children) for c in children)


def read_inline(translation: str) -> list[Code | str]:
    """A translated XML unit back as strings and codes (the inverse of `inline`)."""
    root = etree.fromstring(translation, parser=etree.XMLParser(resolve_entities=False))
    return _children(root)


def _children(element: etree._Element) -> list[Code | str]:
    out: list[Code | str] = []
    if element.text:
        out.append(element.text)
    for child in element:
        tag = child.tag
        if not isinstance(tag, str) or not tag.startswith(_CODE) or not tag[1:].isdigit():
            raise ValueError(f"not an inline unit: element {tag!r}")
        out.append(Code(int(tag[1:]), _children(child)))
        if child.tail:
            out.append(child.tail)
    return out
