"""Office Open XML: docx, pptx and xlsx, read with zipfile and lxml (service/documents/safe.py).

Which parts. The package's [Content_Types].xml names each part's type: docx's main document,
headers, footers, footnotes and endnotes (text boxes are paragraphs inside them); pptx's slides
and speaker notes; xlsx's shared strings, the inline strings of worksheets (a cell's number,
date, formula and formula result are not strings there, and are never read) and their print
headers and footers (`_Section`: each of a header's left, centre and right parts whose text has
words is a unit, its codes for the page number, date, file name, font and the like kept and
placed by alignment). Every other part
(styles, relationships, media, settings, charts) is copied as it was, and so is a part whose
paragraphs had nothing to translate.

A paragraph (`w:p`, `a:p`, a string item `si`/`is`) is one unit. Its runs of text become the
unit's text; the paragraph's base is its text without shown run properties where it has some,
else the run properties most of its characters carry (every run formatted directly), and each
stretch of runs with other properties (bold, italic, colour, font, a pptx link in `a:rPr`)
becomes a code `<cN>`, as does a docx hyperlink, tracked insertion (`w:ins`, `w:moveTo`: its
runs are translated and stay an insertion by the same author) or inline content control (`w:sdt`:
its runs, in its `w:sdtContent`, are translated and stay in the control, its properties kept)
around its runs; a tracked deletion keeps its deleted text as it was. What is not text (a field from
its begin to its end, a tab, a break, a drawing, a footnote reference, a bookmark) is an empty
code, kept as it was and put back where the alignment places it; at the paragraph's start or end
it stays outside the unit, where it is. Writing a paragraph back, each stretch of the translation
becomes a run with its code's properties (text outside codes: the base), in a copy of the
hyperlink or insertion it sat in.

Line breaks and tabs part words: a docx `w:br`, `w:cr`, `w:tab` or `w:ptab`, a pptx `a:br`, and a
line break or tab character in a text (how a spreadsheet cell holds its lines) are such empty
codes, with a space before them in the unit so that the model reads "runs<br/>through" as two
words, not "runsthrough"; the writer takes the spaces next to them out again.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from lxml import etree

from service.documents.base import (
    Code,
    Extracted,
    Limits,
    Unit,
    inline,
    read_inline,
    space_apart,
)
from service.documents.safe import (
    OLE_MAGIC,
    Archive,
    DocumentError,
    parse_xml,
    peek,
    serialize_xml,
)

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_TYPES = "{http://schemas.openxmlformats.org/package/2006/content-types}"
_OFFICE = "application/vnd.openxmlformats-officedocument."
_WORKSHEET = _OFFICE + "spreadsheetml.worksheet+xml"
CONTENT_TYPES = "[Content_Types].xml"
# Characters of a text that part its words as a line break or tab element does.
_BREAKS = re.compile(r"\r\n|[\n\r\t\v]")


@dataclass(frozen=True)
class _Dialect:
    """One vocabulary's names for a paragraph and its runs."""

    ns: str
    paragraphs: tuple[str, ...]  # local names of the elements that are one unit each
    kept_first: tuple[str, ...]  # paragraph children that stay at its start (properties)
    kept_last: tuple[str, ...]  # ... and at its end (pptx's end-of-paragraph properties)
    wrappers: tuple[str, ...]  # children wrapping runs that become a code of their own
    # Wrappers whose runs sit in a child of theirs, its other children the wrapper's properties
    # (a docx content control's `w:sdtContent`): (wrapper, holder) local names.
    holders: tuple[tuple[str, str], ...] = ()
    # Run properties that do not make two runs look different (spelling marks, languages).
    ignored_properties: frozenset[str] = frozenset()
    ignored_attributes: frozenset[str] = frozenset()
    text_in_paragraph: bool = False  # xlsx's `<si><t>` without a run
    # Elements (in a run, or in the paragraph: pptx's `a:br`) that part words: breaks, tabs.
    separators: frozenset[str] = frozenset()

    def q(self, name: str) -> str:
        return f"{{{self.ns}}}{name}"

    # The tags of kept_first, kept_last and wrappers, made once (each paragraph's children are
    # looked up in them).
    @functools.cached_property
    def first_tags(self) -> frozenset[str]:
        return frozenset(self.q(name) for name in self.kept_first)

    @functools.cached_property
    def last_tags(self) -> frozenset[str]:
        return frozenset(self.q(name) for name in self.kept_last)

    @functools.cached_property
    def wrapper_tags(self) -> frozenset[str]:
        return frozenset(self.q(name) for name in self.wrappers)

    @functools.cached_property
    def holder_tags(self) -> dict[str, str]:
        return {self.q(wrapper): self.q(holder) for wrapper, holder in self.holders}

    def runs_in(self, wrapper: etree._Element) -> etree._Element | None:
        """The element that holds a wrapper's runs: itself, or its holder (None if it has none)."""
        holder = self.holder_tags.get(wrapper.tag)
        return wrapper if holder is None else wrapper.find(holder)

    def made_holder(self, source: etree._Element, made: etree._Element) -> etree._Element:
        """Where a wrapper's runs go in `made`, a copy of `source` without its children: the copy
        itself, or a new holder after copies of the source's properties."""
        holder = self.holder_tags.get(source.tag)
        if holder is None:
            return made
        for child in source:
            if child.tag != holder:
                made.append(copy.deepcopy(child))
        return etree.SubElement(made, holder)


_WORD = _Dialect(
    W,
    ("p",),
    ("pPr",),
    (),
    ("hyperlink", "ins", "moveTo", "sdt"),
    holders=(("sdt", "sdtContent"),),
    ignored_properties=frozenset({f"{{{W}}}lang", f"{{{W}}}noProof", f"{{{W}}}rPrChange"}),
    separators=frozenset(f"{{{W}}}{name}" for name in ("br", "cr", "tab", "ptab")),
)
_DRAWING = _Dialect(
    A,
    ("p",),
    ("pPr",),
    ("endParaRPr",),
    (),
    ignored_attributes=frozenset({"lang", "altLang", "dirty", "err", "noProof", "smtClean"}),
    separators=frozenset({f"{{{A}}}br"}),
)
_CELLS = _Dialect(S, ("si", "is"), (), ("rPh", "phoneticPr"), (), text_in_paragraph=True)


@dataclass
class _Run:
    properties: etree._Element | None


@dataclass
class _Link:
    element: etree._Element  # the source's hyperlink or insertion; copied without its children


@dataclass(frozen=True)
class _Loose:
    """What a run held besides its text (a tab, a break, a drawing): put back in a run of its
    own with the run's properties. Wrapped only when written, so that a paragraph read and
    not translated is not changed."""

    item: etree._Element
    properties: etree._Element | None

    def element(self, dialect: _Dialect) -> etree._Element:
        run = etree.Element(dialect.q("r"))
        if self.properties is not None:
            run.append(copy.deepcopy(self.properties))
        run.append(self.item)
        return run


_Thing: TypeAlias = etree._Element | _Loose


@dataclass
class _Kept:
    things: list[_Thing]
    separates: bool = False  # a line break or tab: no space next to it when written
    placed: bool = False

    def nodes(self) -> Iterator[etree._Element]:
        """Its elements and all they hold, as written (a loose item without its run)."""
        for thing in self.things:
            yield from (thing.item if isinstance(thing, _Loose) else thing).iter()


_Entry: TypeAlias = _Run | _Link | _Kept


@dataclass
class _Text:
    text: str
    properties: etree._Element | None
    link: etree._Element | None


@dataclass
class _Object:
    things: list[_Thing]
    link: etree._Element | None
    separates: bool = False  # a line break or tab: the words on either side are apart


_Piece: TypeAlias = _Text | _Object


@dataclass
class _Paragraph:
    """A paragraph read into pieces, and how to write it back."""

    element: etree._Element
    dialect: _Dialect
    first: list[_Thing]
    middle: list[_Piece]
    last: list[_Thing]
    table: list[_Entry] = field(default_factory=list)
    base: etree._Element | None = None

    def unit(self) -> Unit:
        texts = [p for p in self.middle if isinstance(p, _Text)]
        weights: dict[bytes, int] = {}  # characters by how they look
        plain_words = False  # whether text without shown properties holds more than spaces
        for text in texts:
            key = _key(text.properties, self.dialect)
            weights[key] = weights.get(key, 0) + len(text.text)
            plain_words = plain_words or (key == b"" and not text.text.isspace())
        # Plain text is the base wherever there is some, as outside HTML's tags: a formatted
        # majority as the base would put its formatting on whatever target words align to no
        # other run (a link over the full stop, a bold run split around an unaligned word).
        base_key = b"" if plain_words else max(weights, key=lambda k: weights[k])
        self.base = next(
            t.properties for t in texts if _key(t.properties, self.dialect) == base_key
        )
        children: list[Code | str] = []
        links: dict[int, Code] = {}  # id of a wrapper element -> its code
        last: tuple[Code | None, object] = (None, None)  # the open run code and its key
        for piece in self.middle:
            into = children
            if piece.link is not None:
                link = links.get(id(piece.link))
                if link is None or not children or children[-1] is not link:
                    link = Code(len(self.table))
                    self.table.append(_Link(piece.link))
                    links[id(piece.link)] = link
                    children.append(link)
                    last = (None, None)
                into = link.children
            if isinstance(piece, _Object):
                if piece.separates:
                    space_apart(into)
                if (
                    not piece.separates
                    and into
                    and isinstance(into[-1], Code)
                    and self._kept(into[-1])
                ):
                    entry = self.table[into[-1].index]
                    assert isinstance(entry, _Kept)
                    entry.things.extend(piece.things)
                else:
                    into.append(Code(len(self.table)))
                    self.table.append(_Kept(list(piece.things), piece.separates))
                last = (None, None)
                continue
            key = _key(piece.properties, self.dialect)
            if key == base_key:
                into.append(piece.text)
                last = (None, None)
                continue
            code, open_key = last
            if code is None or open_key != key or not into or into[-1] is not code:
                code = Code(len(self.table))
                self.table.append(_Run(piece.properties))
                into.append(code)
            code.children.append(piece.text)
            last = (code, key)
        return inline(children)

    def _kept(self, code: Code) -> bool:
        return isinstance(self.table[code.index], _Kept)

    def write(self, translation: str) -> None:
        tree = read_inline(translation)
        element = self.element
        for child in list(element):
            element.remove(child)
        for kept in self.first:
            element.append(self._thing(kept))
        self._emit(tree, self.base, element, inside_link=False)
        for entry in self.table:  # an object the translation lost is not lost
            if isinstance(entry, _Kept) and not entry.placed:
                self._place(entry, element)
        for kept in self.last:
            element.append(self._thing(kept))
        self._tighten(element)
        if self.dialect.text_in_paragraph:
            _plain_cell_text(element, self.dialect)

    def _emit(
        self,
        nodes: Sequence[Code | str],
        properties: etree._Element | None,
        into: etree._Element,
        *,
        inside_link: bool,
    ) -> None:
        for node in nodes:
            if isinstance(node, str):
                if node:
                    into.append(_run(node, properties, self.dialect))
                continue
            entry = self.table[node.index] if node.index < len(self.table) else None
            if isinstance(entry, _Run):
                self._emit(node.children, entry.properties, into, inside_link=inside_link)
            elif isinstance(entry, _Link) and not inside_link:
                link = etree.SubElement(into, entry.element.tag, attrib=dict(entry.element.attrib))
                holder = self.dialect.made_holder(entry.element, link)
                self._emit(node.children, properties, holder, inside_link=True)
            else:
                if isinstance(entry, _Kept) and not entry.placed:
                    self._place(entry, into)
                self._emit(node.children, properties, into, inside_link=inside_link)

    def _place(self, entry: _Kept, into: etree._Element) -> None:
        entry.placed = True
        for kept in entry.things:
            into.append(self._thing(kept))

    def _thing(self, thing: _Thing) -> etree._Element:
        return thing.element(self.dialect) if isinstance(thing, _Loose) else thing

    def _tighten(self, element: etree._Element) -> None:
        """No space next to a line break or tab (the unit had one there for the model)."""
        # Elements, not ids: the set keeps lxml's proxies alive, so each node keeps its own.
        stops = {
            node
            for entry in self.table
            if isinstance(entry, _Kept) and entry.separates
            for node in entry.nodes()
        }
        if not stops:
            return
        t = self.dialect.q("t")
        before: etree._Element | None = None  # the text just before, nothing between
        after = False  # a stop just before, nothing between
        for node in _written(element, self.dialect):
            if node in stops:
                if before is not None:
                    before.text = (before.text or "").rstrip(" ")
                before, after = None, True
            elif node.tag == t:
                if after:
                    node.text = (node.text or "").lstrip(" ")
                before, after = node, False
            else:
                before, after = None, False


def _written(element: etree._Element, dialect: _Dialect) -> Iterator[etree._Element]:
    """A written paragraph's runs' items and its other children, in order (a wrapper's
    too)."""
    for child in element:
        if child.tag == dialect.q("r"):
            yield from (item for item in child if item.tag != dialect.q("rPr"))
        elif child.tag in dialect.wrapper_tags:
            holder = dialect.runs_in(child)
            if holder is not None:
                yield from _written(holder, dialect)
        else:
            yield child


def _plain_cell_text(element: etree._Element, dialect: _Dialect) -> None:
    """A string item whose runs all lost their properties is one `<t>`, as Excel writes it."""
    runs = element.findall(dialect.q("r"))
    if not runs or any(r.find(dialect.q("rPr")) is not None for r in runs):
        return
    text = "".join(r.findtext(dialect.q("t")) or "" for r in runs)
    index = list(element).index(runs[0])
    for r in runs:
        element.remove(r)
    t = etree.Element(dialect.q("t"))
    t.text = text
    if text != text.strip():
        t.set(_XML_SPACE, "preserve")
    element.insert(index, t)


def _key(properties: etree._Element | None, dialect: _Dialect) -> bytes:
    """What makes a run look as it does: its properties, less those that do not show."""
    if properties is None:
        return b""
    shown = copy.deepcopy(properties)
    for child in list(shown):
        if child.tag in dialect.ignored_properties:
            shown.remove(child)
    for name in dialect.ignored_attributes:
        shown.attrib.pop(name, None)
    if not len(shown) and not shown.attrib:
        return b""
    return bytes(etree.tostring(shown, method="c14n"))


def _run(text: str, properties: etree._Element | None, dialect: _Dialect) -> etree._Element:
    run = etree.Element(dialect.q("r"))
    if properties is not None:
        run.append(copy.deepcopy(properties))
    t = etree.SubElement(run, dialect.q("t"))
    t.text = text
    if dialect is not _DRAWING and text != text.strip():
        t.set(_XML_SPACE, "preserve")
    return run


class _Reader:
    """A part's paragraphs, in document order; a docx field's state runs across them."""

    def __init__(self, dialect: _Dialect) -> None:
        self.dialect = dialect
        self.field_depth = 0  # inside a docx field (begin .. end): nothing is text

    def paragraphs(self, root: etree._Element) -> Iterator[_Paragraph]:
        d = self.dialect
        tags = {d.q(name) for name in d.paragraphs}
        for element in root.iter(*tags):
            paragraph = self._read(element)
            if paragraph is not None:
                yield paragraph

    def _read(self, element: etree._Element) -> _Paragraph | None:
        d = self.dialect
        first: list[_Thing] = []
        last: list[_Thing] = []
        pieces: list[_Piece] = []
        for child in element:
            if not isinstance(child.tag, str):  # a comment or processing instruction
                pieces.append(_Object([child], None))
            elif child.tag in d.first_tags and not pieces:
                first.append(child)
            elif child.tag in d.last_tags:
                last.append(child)
            elif child.tag in d.wrapper_tags:
                pieces.extend(self._linked(child))
            else:
                pieces.extend(self._pieces(child, None))
        if not any(isinstance(p, _Text) and p.text.strip() for p in pieces):
            return None
        while pieces and isinstance(head := pieces[0], _Object):
            first.extend(head.things)
            pieces.pop(0)
        tail: list[_Thing] = []
        while pieces and isinstance(end := pieces[-1], _Object):
            tail[:0] = end.things
            pieces.pop()
        return _Paragraph(element, d, first, pieces, tail + last)

    def _linked(self, link: etree._Element) -> list[_Piece]:
        pieces: list[_Piece] = []
        holder = self.dialect.runs_in(link)
        for child in () if holder is None else holder:
            pieces.extend(self._pieces(child, link))
        if not any(isinstance(p, _Text) for p in pieces):
            return [_Object([link], None)]  # a link around no text (an image): kept whole
        return pieces

    def _pieces(self, child: etree._Element, link: etree._Element | None) -> list[_Piece]:
        d = self.dialect
        if d.text_in_paragraph and child.tag == d.q("t"):
            return self._text(child.text or "", None, link)
        if child.tag != d.q("r"):
            return [_Object([child], link, child.tag in d.separators)]
        properties = child.find(d.q("rPr"))
        items: list[tuple[etree._Element, bool]] = []  # each item, and whether it is text
        for item in child:
            if item is properties:
                continue
            if d is _WORD and item.tag == d.q("fldChar"):
                kind = item.get(d.q("fldCharType"))
                # The end belongs to the field: what follows it in the run is text again.
                self.field_depth = max(0, self.field_depth + {"begin": 1, "end": -1}.get(kind, 0))
            elif d is _WORD and item.tag == d.q("lastRenderedPageBreak"):
                continue  # Word's note of where a page broke last: wrong once translated
            items.append((item, item.tag == d.q("t") and not self.field_depth))
        if not any(is_text for _, is_text in items):
            # The run as it is, with its own attributes.
            return [_Object([child], link, any(i.tag in d.separators for i, _ in items))]
        pieces: list[_Piece] = []
        for item, is_text in items:
            if is_text:
                pieces.extend(self._text(item.text or "", properties, link))
            else:
                separates = item.tag in d.separators
                pieces.append(_Object([_Loose(item, properties)], link, separates))
        return pieces

    def _text(
        self, text: str, properties: etree._Element | None, link: etree._Element | None
    ) -> list[_Piece]:
        """A text's pieces: its words, and each line break or tab character in it an object
        of its own (markup would read it as a space)."""
        pieces: list[_Piece] = []
        done = 0
        for match in _BREAKS.finditer(text):
            if match.start() > done:
                pieces.append(_Text(text[done : match.start()], properties, link))
            item = etree.Element(self.dialect.q("t"))
            item.text = match.group()
            if self.dialect is not _DRAWING:
                item.set(_XML_SPACE, "preserve")
            pieces.append(_Object([_Loose(item, properties)], link, separates=True))
            done = match.end()
        if done < len(text) or not pieces:
            pieces.append(_Text(text[done:], properties, link))
        return pieces


# A print header's or footer's text ('&L&"Arial,Bold"Draft&CPage &P of &N&R&D'): its tokens are
# Excel's codes (MS-OI29500: a font, a size, a colour, &P and &N with an offset, &D, &B, ...),
# `&&` (an ampersand), line breaks and runs of text; &L, &C and &R start its left, centre and
# right parts.
_PRINT_TOKEN = re.compile(
    r'&&|&"[^"]*"?|&[PN](?:[+-]\d+)?|&\d{1,3}|&K(?:[0-9A-Fa-f]{6}|\d\d[+-]\d{2,3})|&.?'
    r"|\r\n|[\r\n]|[^&\r\n]+",
    re.S,
)
_PRINT_PARTS = frozenset({"&L", "&C", "&R"})
_PRINT_BREAKS = frozenset({"\r\n", "\r", "\n"})
_FONT_SIZE = re.compile(r"&\d{1,2}")  # a size that digits after it would lengthen
# Excel's longest print header or footer, codes included: it does not show a longer one, and
# ClosedXML will not open the file (libxlsxwriter and ClosedXML check the limit when writing).
PRINT_TEXT_LIMIT = 255
# A print header or footer element in a worksheet's bytes (its content is text).
_PRINT_ELEMENT = re.compile(
    rb"<((?:[A-Za-z_][\w.-]*:)?(?:odd|even|first)(?:Header|Footer))(?:\s[^>]*)?>(.*?)</\1\s*>",
    re.S,
)
_NOT_UTF8 = re.compile(rb"<\?xml[^>]*encoding\s*=\s*['\"](?!utf-?8['\"])", re.I)


def _code(token: str) -> bool:
    """Whether a token of a print header is a code (or a line break), not its text."""
    return token in _PRINT_BREAKS or (token.startswith("&") and token != "&&")


class _Printed:
    """A sheet's print header or footer (an element of `headerFooter`, or a holder of its text
    read from the sheet's bytes: `_PrintedBytes`): its tokens, in parts split at &L, &C and &R
    (each marker a part of its own)."""

    def __init__(self, element: etree._Element) -> None:
        self.element = element
        self.parts: list[list[str]] = []
        for token in _PRINT_TOKEN.findall(element.text or ""):
            if token in _PRINT_PARTS or not self.parts or self.parts[-1][0] in _PRINT_PARTS:
                self.parts.append([token])
            else:
                self.parts[-1].append(token)

    def replace(self, index: int, tokens: list[str]) -> None:
        """Part `index` written as `tokens`, unless the header would then be longer than Excel
        shows (or longer still, past it already): that part stays as it was, the file opens."""
        parts = [*self.parts[:index], tokens, *self.parts[index + 1 :]]
        text = "".join(token for part in parts for token in part)
        if len(text) <= max(PRINT_TEXT_LIMIT, len(self.element.text or "")):
            self.parts, self.element.text = parts, text

    def sections(self) -> list[_Section]:
        return [
            _Section(self, i)
            for i, part in enumerate(self.parts)
            if part[0] not in _PRINT_PARTS
            and any(not _code(t) and any(c.isalnum() for c in t) for t in part)
        ]


@dataclass
class _Section:
    """One part of a print header or footer whose text has words: one unit. The codes before
    its first word and after its last (a font, a size, a colour: what Excel writes first) stay
    where they are, as a paragraph's leading properties do; each code among its words (`&P`,
    `&B`, a line break) is an empty element placed by alignment."""

    printed: _Printed
    index: int

    def _split(self) -> tuple[list[str], list[str], list[str]]:
        """The part's leading codes (and the spaces after them), its words and the codes among
        them, its trailing codes (and the spaces before them)."""
        tokens = self.printed.parts[self.index]
        start = next(i for i, t in enumerate(tokens) if not _code(t))
        end = len(tokens) - next(i for i, t in enumerate(reversed(tokens)) if not _code(t))
        head, inner, tail = tokens[:start], tokens[start:end], tokens[end:]
        first = inner[0]
        if first != first.lstrip():
            head, inner = [*head, first[: len(first) - len(first.lstrip())]], inner[:]
            inner[0] = first.lstrip()
        if inner[-1] != inner[-1].rstrip():
            last = inner[-1]
            tail = [last[len(last.rstrip()) :], *tail]
            inner[-1] = last.rstrip()
        return head, [t for t in inner if t], tail

    def unit(self) -> Unit:
        _, inner, _ = self._split()
        children: list[Code | str] = []
        codes = 0
        for token in inner:
            if not _code(token):
                children.append("&" if token == "&&" else token)
                continue
            if token in _PRINT_BREAKS:
                space_apart(children)  # the words on either side are apart
            children.append(Code(codes))
            codes += 1
        return inline(children)

    def write(self, translation: str) -> None:
        head, inner, tail = self._split()
        codes = [t for t in inner if _code(t)]
        tokens: list[str] = []
        placed: set[int] = set()

        def add(children: Sequence[Code | str]) -> None:
            for child in children:
                if isinstance(child, str):
                    tokens.append(child.replace("&", "&&"))
                    continue
                if child.index < len(codes) and child.index not in placed:
                    tokens.append(codes[child.index])
                    placed.add(child.index)
                add(child.children)

        add(read_inline(translation))
        tokens += [code for i, code in enumerate(codes) if i not in placed]
        written = [*head, *_tightened(tokens), *tail]
        for i in range(len(written) - 1):  # "&12" then "2024" would read as size 122
            if _FONT_SIZE.fullmatch(written[i]) and written[i + 1][:1].isdigit():
                written[i + 1] = " " + written[i + 1]
        self.printed.replace(self.index, written)


def _tightened(tokens: list[str]) -> list[str]:
    """No space next to a line break (the unit had one there for the model)."""
    out = list(tokens)
    for i, token in enumerate(out):
        if token in _PRINT_BREAKS:
            if i and not _code(out[i - 1]):
                out[i - 1] = out[i - 1].rstrip(" ")
            if i + 1 < len(out) and not _code(out[i + 1]):
                out[i + 1] = out[i + 1].lstrip(" ")
    return [token for token in out if token]


def _printed(root: etree._Element) -> list[_Section]:
    """The units of a worksheet's print headers and footers (the children of its
    `headerFooter`, a child of the sheet: not a walk through its rows)."""
    printed = root.find(f"{{{S}}}headerFooter")
    if printed is None:
        return []
    return [s for e in printed if isinstance(e.tag, str) for s in _Printed(e).sections()]


class _PrintedBytes:
    """The print headers and footers of a worksheet without inline strings, read from its
    bytes and written into them: the sheet's rows (most of the file, numbers and indices into
    the shared strings) are never parsed into a tree."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.found: list[tuple[tuple[int, int], etree._Element]] = []
        for match in _PRINT_ELEMENT.finditer(data):
            holder = parse_xml(b"<t>" + match.group(2) + b"</t>", what)
            self.found.append((match.span(2), holder))

    def sections(self) -> list[_Section]:
        return [section for _, holder in self.found for section in _Printed(holder).sections()]

    def serialize(self) -> bytes:
        data = self.data
        for (start, end), holder in reversed(self.found):
            text = etree.tostring(holder, encoding="unicode")[len("<t>") : -len("</t>")]
            data = data[:start] + text.encode() + data[end:]
        return data


@dataclass(frozen=True)
class _Part:
    name: str
    dialect: _Dialect


class _Extracted:
    def __init__(
        self,
        archive: Archive,
        writers: dict[str, Callable[[], bytes]],
        paragraphs: list[tuple[str, _Paragraph | _Section]],
    ) -> None:
        """`writers`: each part's bytes once its units are written (from its tree, or its
        bytes patched)."""
        self._archive = archive
        self._writers = writers
        self._paragraphs = paragraphs
        self._units = [paragraph.unit() for _, paragraph in paragraphs]

    @property
    def units(self) -> Sequence[Unit]:
        return self._units

    def write(self, translations: Sequence[str]) -> bytes:
        if len(translations) != len(self._paragraphs):
            raise ValueError(f"{len(translations)} translations for {len(self._paragraphs)} units")
        for (_, paragraph), translation in zip(self._paragraphs, translations, strict=True):
            paragraph.write(translation)
        changed = {name for name, _ in self._paragraphs}
        return self._archive.rewrite({name: self._writers[name]() for name in changed})


@dataclass(frozen=True)
class OfficeFormat:
    """One Office Open XML format: its main part's content type, and the content types of
    the parts whose text it translates."""

    name: str
    extensions: tuple[str, ...]
    media_type: str
    main: str  # the main part's content type
    parts: dict[str, _Dialect]  # content type -> the vocabulary of its text

    def sniff(self, data: bytes) -> bool:
        if data.startswith(OLE_MAGIC):  # what Office writes for a password: `read` says so
            return True
        types = peek(data, CONTENT_TYPES)
        if types is None:
            return False
        try:
            return self.main in _content_types(parse_xml(types, CONTENT_TYPES), []).values()
        except DocumentError:
            return False

    def read(self, data: bytes, limits: Limits) -> Extracted:
        archive = Archive(data, limits, self.name)
        types = _content_types(archive.xml(CONTENT_TYPES), archive.names)
        if self.main not in types.values():
            raise DocumentError(f"the file is not a {self.name} document (no {self.main} part)")
        writers: dict[str, Callable[[], bytes]] = {}
        found: list[tuple[str, _Paragraph | _Section]] = []
        for name in archive.names:
            kind = types.get(name, "")
            dialect = self.parts.get(kind)
            if dialect is None:
                continue
            data = archive.read(name)
            what = f"the {self.name} file's part {name!r}"
            paragraphs: list[_Paragraph | _Section]
            if kind == _WORKSHEET and b"inlineStr" not in data and not _NOT_UTF8.match(data):
                # A sheet's numbers, dates, formulas and shared strings' indices: only its
                # print headers and footers, if it has any.
                if b"Header" not in data and b"Footer" not in data:
                    continue
                sheet = _PrintedBytes(data, what)
                paragraphs, writer = list(sheet.sections()), sheet.serialize
            else:
                root = parse_xml(data, what)
                paragraphs = list(_Reader(dialect).paragraphs(root))
                if kind == _WORKSHEET:
                    paragraphs += _printed(root)
                writer = functools.partial(serialize_xml, root)
            if paragraphs:
                writers[name] = writer
                found.extend((name, p) for p in paragraphs)
        return _Extracted(archive, writers, found)


def _content_types(root: etree._Element, names: Sequence[str]) -> dict[str, str]:
    """Each part's content type by its name in the archive: the overrides, and `names` not
    overridden by the defaults for their extension."""
    defaults = {
        d.get("Extension", "").lower(): d.get("ContentType", "")
        for d in root.iter(f"{_TYPES}Default")
    }
    types = {
        o.get("PartName", "").lstrip("/"): o.get("ContentType", "")
        for o in root.iter(f"{_TYPES}Override")
    }
    for name in names:
        if name not in types and "." in name:
            types[name] = defaults.get(name.rsplit(".", 1)[1].lower(), "")
    return types


DOCX = OfficeFormat(
    "docx",
    (".docx",),
    _OFFICE + "wordprocessingml.document",
    _OFFICE + "wordprocessingml.document.main+xml",
    {
        _OFFICE + f"wordprocessingml.{kind}+xml": _WORD
        for kind in ("document.main", "header", "footer", "footnotes", "endnotes")
    },
)
PPTX = OfficeFormat(
    "pptx",
    (".pptx",),
    _OFFICE + "presentationml.presentation",
    _OFFICE + "presentationml.presentation.main+xml",
    {_OFFICE + f"presentationml.{kind}+xml": _DRAWING for kind in ("slide", "notesSlide")},
)
XLSX = OfficeFormat(
    "xlsx",
    (".xlsx",),
    _OFFICE + "spreadsheetml.sheet",
    _OFFICE + "spreadsheetml.sheet.main+xml",
    {_OFFICE + f"spreadsheetml.{kind}+xml": _CELLS for kind in ("sharedStrings", "worksheet")},
)

FORMATS = (DOCX, PPTX, XLSX)
