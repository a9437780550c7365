"""HTML and XML around the translator: `parse` strips a document to the runs of text a model
translates (`Document.blocks`), `render` puts the translations back and re-places each inline
element (`<b>`, `<a href>`, ...) around the target words its source words were translated into,
through a `Projection` built from the model's word alignments. The translator knows nothing of
markup and this module nothing of models, as in Bergamot's html.cpp; unlike Bergamot it reads
markup with real parsers and writes it with the same library, so the output is well-formed.

Parsers (`python -m benchmarks.markup_parsers --rounds 9`: parse + serialise, µs per document,
median of 9 rounds, on this project's 2-core AMD EPYC shared with other work, load about 3;
"spec": of 10 broken inputs, how many are repaired into the tree the HTML5 tree-construction
algorithm builds, as browsers do, written out by hand in the benchmark):

| parser | 695-byte Mastodon status | 48 KB web page | spec |
|---|---|---|---|
| selectolax 1.0.2 (Lexbor) | 30 | 897 | 10/10 |
| lxml.html 6.1.3 (libxml2) | 25 | 980 | 3/10 |
| html5lib 1.1 | 539 | 51,558 | 10/10 |

- HTML: selectolax's Lexbor backend, maintained, HTML5 tree building: adoption agency for
  `<p>a <b>b <i>c</b> d</i>`, `<table><p>x</table>` fostered out of the table, implied `</p>`,
  stray end tags, so what we translate is what a reader sees. lxml.html is as fast but repairs
  the HTML4 way (`<i>a<div>b</i>c</div>` stays inside `<i>`); html5lib builds the spec's trees
  18-57x slower (36-52 ms on the page from run to run), is barely maintained, and its fragment
  parser drops fostered content. A fragment (what Mastodon sends) is parsed with the fragment
  algorithm and comes back as a fragment; input starting with `<!DOCTYPE` or `<html` (after
  whitespace, comments and processing instructions such as `<?xml ...?>`) is a whole document.
  A byte order mark at the start is not text: the parser never sees it (before `<!DOCTYPE` it
  would drop the doctype), and the output starts with it again. Lexbor's `clone()` loses
  `<template>` content and SVG's camel case, so `render` parses the source again rather than
  copying the tree.
- XML: lxml.etree (libxml2): errors with line and column (`MarkupError`), entities kept as
  references and never expanded (no XXE, no billion laughs), nesting beyond 256 levels refused.

Plain text with placeholders (`protect`, service/text/placeholders.py) goes the same way: each
line is a run, each placeholder an item, a pair of numbered tags (`<0>...</0>`) an inline
element; `render` writes the tokens out as text. Markup's own text keeps its placeholders as
items too (`parse`'s `protection`).

With them, this module's `parse` takes 97 µs on that status (3 blocks), 12 ms on that page (455
blocks); `render` 45 µs and 5.8 ms when every block changed, 14 µs and 0.9 ms when none did.

What a block is. HTML: block elements (p, div, li, h1-h6, td, th, title, option, button...; the
`_BLOCK` set: flow content that starts a box of its own, <button> and <select> too, whose text
stands alone) end a run, and so does `<br>`; phrasing elements (a, b, span, em, label...) stay
inside it; a phrasing element that contains a block is a block container. `<noscript>` is
translated like a <div> (parsed with scripting disabled, its content is what those readers see).
XML, whose vocabulary is unknown: an element whose own content mixes words and child elements is
a paragraph whose whole subtree is inline; one with only child elements is structural, and each
child is looked at the same way; one with only text is a run. A run's text is its text content
with whitespace runs collapsed to one space and stripped (the edges stay around the translation
in the output); a run without words (nothing but whitespace and format characters: U+200B
zero-width space, U+FEFF...) is not a block and stays as it is.

What is never translated and comes back byte for byte (as the serialiser writes it): script,
style, pre, code, kbd, samp, var, textarea, svg, math, template, iframe, object, embed, video,
audio, canvas, rt, rp (in XML, those of the XHTML namespace); anything with `translate="no"`
(`its:translate` in XML) or class `notranslate`, or named in `parse`'s `tags.ignored` (DeepL's
ignore_tags), with its subtree; comments, processing
instructions, entity references, CDATA (lxml cannot tell CDATA from the text around it, so an
XML run holding CDATA is kept whole); attribute values (but see `translate_attributes`); void
elements (img, input, wbr...); URLs, e-mail addresses, @mentions and #hashtags in the text, and
an inline element whose text is nothing else (Mastodon's mention, hashtag and link `<a>`s, whose
alt and title stay too) or has no words at all. These units leave the block's text (with one
space kept where they sat between two words, or where one held whitespace: `a<b> </b>b` reads
"a b") and return at `projection.point()` of where they sat, inside the element that held them,
in their source order; a space goes between a unit and a word it was not glued to in the source,
and between two units that had whitespace between them. Elements nested deeper than 200 levels
are kept untranslated. Parsing HTML is quadratic in the nesting depth of block elements (the
algorithm's scope checks: 10,000 nested `<div>`s take 0.14 s), so callers bound the input's
length.

Rendering a run: the target text replaces the source text; each inline element wraps
`projection.span()` of the source characters it wrapped (its outer spaces excluded), clipped to
its parent's target range; siblings overlapping in the target are made disjoint in target order
(the later one starts where the earlier ends, and one left empty stays, empty); an element
whose words have no alignment goes to `projection.point()` of its start. Elements and kept
nodes are the tree's own, moved: same tag, attributes and nesting. A run whose target is its
source text with an identity projection keeps its source markup exactly, whitespace included,
and `translate_attributes` values that come back unchanged stay as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

from lxml import etree
from selectolax.lexbor import LexborHTMLParser, LexborNode

from service.text.placeholders import Protection, Span
from service.text.segment import LETTER, VISIBLE

Format = Literal["html", "xml"]
# A document's kind: markup, or plain text with placeholders kept out (`protect`).
Kind = Literal["html", "xml", "text"]

# HTML's ASCII whitespace: what collapses. U+00A0 (&nbsp;) is a character like any other.
_WHITESPACE = " \t\n\f\r"
_WHITESPACE_RUN = re.compile(r"[ \t\n\f\r]+")
# Items taken out of the text the model sees (this reads text, not markup). Each starts only
# where a run of its characters starts (the lookbehinds): trying every position inside a long
# word made a search quadratic in the word's length.
_SPECIAL = re.compile(
    r"(?<![^\s(\[{<>\"'«“‘])(?:https?://|www\.)[^\s<>\"]*[^\s<>\".,;:!?'’”»)\]}]"  # URL
    r"|(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail address
    r"|(?<![\w@/])@\w+(?:@[\w-]+(?:\.[\w-]+)+)?"  # @user or @user@host
    r"|(?<![\w#&/])#\w*[^\W\d]\w*"  # #hashtag, at least one letter ("#1" is a number)
)
# Punctuation that ends or continues what comes before it.
_CLOSING = re.compile(r"[.,;:!?)\]}…»”’]")
_CLOSING_RUN = re.compile(r"[.,;:!?)\]}…»”’]+")
# Something to translate: a character that is neither whitespace of any kind nor a format
# character (segment.py's VISIBLE: U+200B, U+FEFF...). A run or attribute of spaces, &nbsp;s
# and zero-width spaces (a spacer <p>&nbsp;</p> or <p>&#8203;</p>) is not a block, though
# &nbsp; does not collapse.
_WORD = VISIBLE
# Whitespace of any kind: an inline element without words that holds some (<span> </span>,
# <b>&nbsp;</b>) parts the words on either side of it.
_SPACE = re.compile(r"\s")
# A whole document rather than a fragment: <!DOCTYPE or <html> after a byte order mark,
# whitespace, comments and processing instructions (an XML declaration, which HTML reads as a
# comment). Possessive: going back into the comments when no doctype follows them took time
# exponential in their number.
_DOCUMENT = re.compile(
    rf"\ufeff?(?:[{_WHITESPACE}]|<!--.*?-->|<\?[^>]*>)*+<(?:!doctype|html)",
    re.IGNORECASE | re.DOTALL,
)
_BOM = "\ufeff"


def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())


# Flow content that starts a box of its own; a run ends at each. <br> ends a run too, <button>
# and <select> are inline-block boxes whose text stands alone.
_BLOCK = _names(
    "address article aside blockquote body br button caption center colgroup datalist dd "
    "details dialog dir div dl dt fieldset figcaption figure footer form frameset h1 h2 h3 h4 "
    "h5 h6 head header hgroup hr html legend li listing main menu nav noscript ol optgroup "
    "option p plaintext pre search section select summary table tbody td tfoot th thead title "
    "tr ul xmp"
)
_KEPT = _names(
    "script style pre code kbd samp var textarea svg math template iframe object embed video "
    "audio canvas rt rp listing xmp plaintext noembed noframes"
)
_VOID = _names(
    "area base basefont bgsound col embed frame img image input keygen link meta param source "
    "track wbr"
)
_TRANSLATED_ATTRIBUTES = ("alt", "title")
_ITS_TRANSLATE = "{http://www.w3.org/2005/11/its}translate"
_XHTML = "{http://www.w3.org/1999/xhtml}"
# Deeper elements are kept untranslated: bounds every recursion below (two frames a level at
# most) well inside Python's 1,000. Real pages nest a few dozen deep.
_MAX_DEPTH = 200


@dataclass(frozen=True)
class Tags:
    """Element names a request gives (DeepL's tag lists; XML's by local name, HTML's in any
    case). `ignored`: kept untranslated with their subtree, as `translate="no"` is.
    `splitting`: HTML, each ends a run as a block element does. `non_splitting`: HTML, a block
    element so named (but <br>, a line break) is read as inline; XML, an element with such a
    child (its own text or not) is a paragraph, its subtree inline."""

    ignored: frozenset[str] = frozenset()
    splitting: frozenset[str] = frozenset()
    non_splitting: frozenset[str] = frozenset()

    def lower(self) -> Tags:
        return Tags(*(frozenset(n.lower() for n in names) for names in astuple(self)))


NO_TAGS = Tags()


class MarkupError(ValueError):
    """Malformed XML (HTML is always repaired): the parser's message and where it stopped."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"malformed XML at line {line}, column {column}: {message}")
        self.line = line
        self.column = column


class Projection(Protocol):
    """Where a block's source characters went in its translation (from word alignments)."""

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        """source characters [start, end) of a block's text -> the target characters [a, b) of
        the translated block's text that they were translated into (whole words, contiguous:
        the smallest span covering all aligned target words); None when nothing is aligned to
        them."""
        ...

    def point(self, position: int) -> int:
        """where something sitting at source character offset `position` (between
        characters) goes in the target text (a character offset into it)."""
        ...


# --- A run, as parse leaves it for render -------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Item:
    """Something kept out of the block's text, re-inserted at `point(position)`: a node of the
    tree (its index in traversal order) or, when `node` is None, `text` (a URL, a mention).
    The source had whitespace right before it (`space_before`) or a character (`glue_before`),
    or neither (the run's start, or another kept thing); the same after it."""

    node: int | None
    text: str = ""
    position: int = 0
    space_before: bool = False
    glue_before: bool = False
    space_after: bool = False
    glue_after: bool = False


@dataclass(eq=False, slots=True)
class _Wrap:
    """An inline element: the block characters [start, end) it wrapped. Without any (start < 0)
    it is placed at `point(position)` like an item, with an item's spacing."""

    node: int
    children: list[_Wrap | _Item] = field(default_factory=list)
    start: int = -1
    end: int = -1
    position: int = 0
    space_before: bool = False
    glue_before: bool = False
    space_after: bool = False
    glue_after: bool = False


_Child: TypeAlias = _Wrap | _Item


@dataclass(frozen=True, slots=True)
class _Run:
    """One block's place in the tree. HTML: the run's top-level nodes, contiguous siblings; XML:
    the one element whose whole content it is."""

    block: int
    place: tuple[int, ...]
    leading: str
    trailing: str
    children: tuple[_Child, ...]
    wraps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Attribute:
    block: int
    node: int
    name: str


@dataclass(frozen=True)
class Document:
    """A parsed document: `blocks` are the texts to translate, in document order (alt and title
    of a block-level element before its content, of one inside a run after that run). The rest
    is for `render`, which parses `_source` again: a Document is never changed and can be
    rendered any number of times, and holds no parser memory while the model works."""

    blocks: list[str]
    format: Kind
    _source: str = field(repr=False)
    _fragment: bool = field(repr=False)
    _runs: tuple[_Run, ...] = field(repr=False)
    _attributes: tuple[_Attribute, ...] = field(repr=False)
    # Plain text (`protect`): each node's source text, an element's start and end tags.
    _pieces: tuple[tuple[str, str], ...] = field(default=(), repr=False)


# --- From the tree to runs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Kept:
    """A node kept whole inside a run; `spaced`: an element whose text is whitespace and nothing
    else (`<span> </span>`), which parts the words on either side of it."""

    node: int
    spaced: bool = False


@dataclass(frozen=True, slots=True)
class _Inline:
    node: int
    children: list[_Raw]
    plain: str | None  # its text content, kept nodes left out; None: too long to look at


_Raw: TypeAlias = str | _Kept | _Inline


# An inline element with more text than this has words: not looked at for URLs and mentions
# only, which bounds the work on deeply nested ones.
_LONGEST_PLAIN = 4096


def _plain(parts: list[str | None]) -> str | None:
    """The text content of an inline element from its parts, None if long (then it has words)."""
    if None in parts:
        return None
    text = "".join(part for part in parts if part is not None)
    return text if len(text) <= _LONGEST_PLAIN else None


def _settle(
    index: int, children: list[_Raw], parts: list[str | None], found: list[_Found], mark: int
) -> _Raw:
    """An inline element walked: kept whole if it has no words. One whose text is URLs,
    mentions... and nothing else (Mastodon's links) is kept as it is, alt and title included:
    the alt and title found in it since `mark` are dropped."""
    text = _plain(parts)
    if text is None or _has_words(text):
        return _Inline(index, children, text)
    visible = _WORD.search(text) is not None
    if visible:
        del found[mark:]
    return _Kept(index, spaced=not visible and _SPACE.search(text) is not None)


def _has_words(text: str) -> bool:
    """Whether `text` has something to translate once the URLs, mentions... are out."""
    return _WORD.search(_SPECIAL.sub(" ", text)) is not None


class _Flattener:
    """A run's raw pieces (text with its original whitespace, inline elements, kept nodes) ->
    the block text, with the character range of each inline element and the position of each
    kept thing ("unit": an item, or an element without words). Whitespace collapses to one
    space; a unit leaves no double space, and remembers what was on either side of it so that
    render can give it the same."""

    def __init__(self, collapse: bool = True, protection: Protection | None = None) -> None:
        self.collapse = collapse  # whitespace collapses to one space (markup), else kept
        self.protection = protection  # markup's placeholders kept out too (placeholders.py)
        self.between = ""  # plain text's first whitespace since the last character
        self.parts: list[str] = []
        self.length = 0
        self.gap = False  # whitespace since the last character
        self.spaced = False  # whitespace since the last character or unit
        self.glued = False  # the last thing was a character
        self.started = False  # a character or unit seen
        self.leading: list[str] = []
        self.trailing: list[str] = []
        self.group: list[_Item | _Wrap] = []  # units since the last whitespace or character
        self.pending: list[_Item | _Wrap] = []  # units not followed by anything yet
        self.open: list[_Wrap] = []
        self.last_end = 0

    def feed(self, raws: Iterable[_Raw], into: list[_Child]) -> None:
        for raw in raws:
            if isinstance(raw, str):
                self._text(raw, into)
            elif isinstance(raw, _Kept):
                into.append(self._place(_Item(raw.node, position=self.length)))
                if raw.spaced:  # whitespace after the unit: the words around it stay apart
                    self.gap = True
                    self.group.clear()
            else:
                self._inline(raw, into)

    def _inline(self, raw: _Inline, into: list[_Child]) -> None:
        wrap = _Wrap(raw.node, position=self.length)
        wrap.space_before, wrap.glue_before = self.spaced, self.glued
        into.append(wrap)
        self.open.append(wrap)
        self.feed(raw.children, wrap.children)
        self.open.pop()
        if wrap.start >= 0:
            wrap.end = self.last_end
        else:
            self._place(wrap)

    def _text(self, raw: str, into: list[_Child]) -> None:
        done = 0
        if self.protection is None:
            spans = [special.span() for special in _SPECIAL.finditer(raw)]
        else:
            spans = kept_spans(raw, self.protection)
        for start, end in spans:
            self._plain(raw[done:start])
            into.append(self._place(_Item(None, raw[start:end], self.length)))
            done = end
        self._plain(raw[done:])

    def _plain(self, text: str) -> None:
        """Text without URLs, mentions...: its whitespace edges, and its words in between."""
        if not text:
            return
        left = text.lstrip(_WHITESPACE)
        if len(left) < len(text):
            self._whitespace(text[: len(text) - len(left)])
        words = left.rstrip(_WHITESPACE)
        if words:
            self._characters(_WHITESPACE_RUN.sub(" ", words) if self.collapse else words)
        if len(words) < len(left):
            self._whitespace(left[len(words) :])

    def _whitespace(self, raw: str) -> None:
        for unit in self.pending:
            unit.space_after = True
        self.pending.clear()
        self.group.clear()
        self.gap = self.spaced = True
        self.glued = False
        self.between = self.between or raw
        (self.trailing if self.started else self.leading).append(raw)

    def _characters(self, words: str) -> None:
        """Words: no whitespace at either end, single spaces inside."""
        for unit in self.pending:
            unit.glue_after = True
        self.pending.clear()
        # Plain text: a unit between a word and punctuation leaves no space before it ("in
        # {place}." reads "in."; the unit keeps its space on the way back).
        closing = not self.collapse and self.group and _CLOSING.match(words) is not None
        if self.gap and self.length and not closing:
            gap = " " if self.collapse else self.between or " "
            self.parts.append(gap)
            self.length += len(gap)
            # The whitespace was before these units, none after: they go after the space.
            for unit in self.group:
                unit.position = self.length
        self.group.clear()
        self.gap = self.spaced = False
        self.glued = True
        self.between = ""
        for wrap in reversed(self.open):
            if wrap.start >= 0:
                break
            wrap.start = self.length
        self.parts.append(words)
        self.length += len(words)
        self.last_end = self.length
        self.started = True
        self.trailing.clear()

    def _place(self, unit: _Item | _Wrap) -> _Item | _Wrap:
        """A unit at `self.length`; a word-less element's sides are read where it opens."""
        if isinstance(unit, _Item):
            unit.space_before, unit.glue_before = self.spaced, self.glued
        self.pending.clear()  # followed by this unit: neither whitespace nor a character
        self.pending.append(unit)
        self.group.append(unit)
        self.spaced = self.glued = False
        self.started = True
        self.trailing.clear()
        return unit


def _wraps(children: Iterable[_Child]) -> Iterator[int]:
    for child in children:
        if isinstance(child, _Wrap):
            yield child.node
            yield from _wraps(child.children)


def _collapse(text: str) -> str:
    return _WHITESPACE_RUN.sub(" ", text).strip(" ")


@dataclass(frozen=True, slots=True)
class _Found:
    """An alt or title attribute to translate, before it has its block index."""

    node: int
    name: str
    text: str


class _Collector:
    """What both walkers produce: blocks, runs and attribute blocks, in document order."""

    def __init__(
        self,
        translate_attributes: bool,
        collapse: bool = True,
        protection: Protection | None = None,
    ) -> None:
        self.translate_attributes = translate_attributes
        self.collapse = collapse
        self.protection = protection
        self.blocks: list[str] = []
        self.runs: list[_Run] = []
        self.attributes: list[_Attribute] = []

    def find_attributes(
        self, node: int, values: Iterable[tuple[str, str | None]], into: list[_Found]
    ) -> None:
        if self.translate_attributes:
            for name, value in values:
                if name in _TRANSLATED_ATTRIBUTES and value:
                    text = _collapse(value)
                    if translatable(text):
                        into.append(_Found(node, name, text))

    def add_attributes(self, found: list[_Found]) -> None:
        for attribute in found:
            self.attributes.append(_Attribute(len(self.blocks), attribute.node, attribute.name))
            self.blocks.append(attribute.text)
        found.clear()

    def add_run(self, place: Sequence[int], raws: Sequence[_Raw], found: list[_Found]) -> None:
        if all(isinstance(raw, str) and not _WORD.search(raw) for raw in raws):
            self.add_attributes(found)  # whitespace between blocks, most often
            return
        flattener = _Flattener(self.collapse, self.protection)
        children: list[_Child] = []
        flattener.feed(raws, children)
        text = "".join(flattener.parts)
        if translatable(text):  # else it stays as it is
            self.runs.append(
                _Run(
                    len(self.blocks),
                    tuple(place),
                    "".join(flattener.leading),
                    "".join(flattener.trailing),
                    tuple(children),
                    tuple(_wraps(children)),
                )
            )
            self.blocks.append(text)
        self.add_attributes(found)


# --- HTML --------------------------------------------------------------------------------------


def _parse_html(source: str, fragment: bool) -> LexborHTMLParser:
    """The tree of `source` without its byte order mark, which is not text (before a doctype,
    the parser would drop the doctype): `render` puts it back before the output."""
    return LexborHTMLParser(source.removeprefix(_BOM), is_fragment=fragment)


def _html_first(tree: LexborHTMLParser) -> LexborNode | None:
    """Where the walk starts: a fragment's root (for selectolax, its first top-level node, whose
    traversal goes on over the others), or a document's <html>. Only the object this returns
    stands for the whole fragment: the same node reached otherwise is the node alone."""
    return tree.root


def _html_kept(tag: str, attributes: dict[str, str | None], ignored: frozenset[str]) -> bool:
    if tag in _KEPT or tag in ignored:
        return True
    translate = attributes.get("translate")
    if translate is not None and translate.strip().lower() == "no":
        return True
    classes = attributes.get("class")
    return classes is not None and "notranslate" in classes.split()


class _HtmlWalker:
    def __init__(
        self,
        tree: LexborHTMLParser,
        fragment: bool,
        collector: _Collector,
        tags: Tags,
    ) -> None:
        self.collector = collector
        tags = tags.lower()  # HTML's names are lower case
        self.ignored = tags.ignored
        self.blocks = (_BLOCK | tags.splitting) - (tags.non_splitting - {"br"})
        self.index: dict[int, int] = {}
        self.has_block: set[int] = set()
        first = _html_first(tree)
        if first is None:
            return
        for i, node in enumerate(first.traverse(include_text=True)):
            self.index[node.mem_id] = i
            if node.tag in self.blocks:
                parent = node.parent
                while parent is not None and parent.mem_id not in self.has_block:
                    self.has_block.add(parent.mem_id)
                    parent = parent.parent
        # Iterating a fragment's root (the object tree.root gives) walks the top-level nodes.
        self.container(first.iter(include_text=True) if fragment else [first], 0)

    def container(self, children: Iterable[LexborNode], depth: int) -> None:
        place: list[int] = []
        raws: list[_Raw] = []
        found: list[_Found] = []
        for child in children:
            index = self.index[child.mem_id]
            tag = child.tag
            if tag == "-text":
                place.append(index)
                raws.append(child.text_content or "")
                continue
            if tag is None or not child.is_element_node:  # comment, processing instruction
                place.append(index)
                raws.append(_Kept(index))
                continue
            attributes = child.attributes
            block = tag in self.blocks or child.mem_id in self.has_block
            if _html_kept(tag, attributes, self.ignored) or depth >= _MAX_DEPTH:
                if block:
                    self.collector.add_run(place, raws, found)
                    place, raws = [], []
                else:
                    place.append(index)
                    raws.append(_Kept(index))
            elif block:
                self.collector.add_run(place, raws, found)
                place, raws = [], []
                self.collector.find_attributes(index, attributes.items(), found)
                self.collector.add_attributes(found)
                self.container(child.iter(include_text=True), depth + 1)
            else:
                place.append(index)
                raws.append(self.inline(child, index, tag, attributes, depth + 1, found))
        self.collector.add_run(place, raws, found)

    def inline(
        self,
        node: LexborNode,
        index: int,
        tag: str,
        attributes: dict[str, str | None],
        depth: int,
        found: list[_Found],
    ) -> _Raw:
        mark = len(found)
        self.collector.find_attributes(index, attributes.items(), found)
        if tag in _VOID:
            return _Kept(index)
        children: list[_Raw] = []
        plain: list[str | None] = []
        for child in node.iter(include_text=True):
            child_index = self.index[child.mem_id]
            child_tag = child.tag
            if child_tag == "-text":
                data = child.text_content or ""
                children.append(data)
                plain.append(data)
            elif child_tag is None or not child.is_element_node:
                children.append(_Kept(child_index))
            else:
                child_attributes = child.attributes
                kept = _html_kept(child_tag, child_attributes, self.ignored)
                if kept or depth >= _MAX_DEPTH:
                    children.append(_Kept(child_index))
                    continue
                raw = self.inline(child, child_index, child_tag, child_attributes, depth + 1, found)
                children.append(raw)
                if isinstance(raw, _Inline):
                    plain.append(raw.plain)
        return _settle(index, children, plain, found, mark)


def _build_html(run: _Run, tokens: list[_Token], nodes: list[LexborNode]) -> None:
    """Replaces the run's nodes by the tokens: wraps and kept nodes are the tree's own, moved."""
    first = nodes[run.place[0]]
    first.insert_before("")
    cursor = first.prev
    if cursor is None:  # selectolax inserted nothing: cannot happen, and then nothing changes
        return
    for index in run.place:
        nodes[index].decompose(recursive=False)
    for index in run.wraps:
        for child in list(nodes[index].iter(include_text=True)):
            child.decompose(recursive=False)
    stack: list[LexborNode] = []
    for token in tokens:
        value: str | LexborNode
        if isinstance(token, str):
            if not token:
                continue
            value = token
        elif isinstance(token, _Item):
            value = token.text if token.node is None else nodes[token.node]
        elif isinstance(token, _Open):
            value = nodes[token.wrap.node]
        else:
            stack.pop()
            continue
        move = not isinstance(value, str)
        if stack:
            stack[-1].insert_child(value, move=move)
        else:
            cursor.insert_after(value, move=move)
            following = cursor.next
            if following is not None:
                cursor = following
        if isinstance(token, _Open) and isinstance(value, LexborNode):
            stack.append(value)


def _render_html(document: Document, translations: Sequence[tuple[str, Projection]]) -> str:
    tree = _parse_html(document._source, document._fragment)
    first = _html_first(tree)
    changes = _changes(document, translations)
    values = list(_attribute_values(document, translations))
    if first is not None and (changes or values):
        nodes = list(first.traverse(include_text=True))
        for attribute, value in values:
            nodes[attribute.node].attrs[attribute.name] = value
        for run, tokens in changes:
            _build_html(run, tokens, nodes)
    return tree.html or ""


# --- XML ---------------------------------------------------------------------------------------


def _parse_xml(source: str) -> Any:
    """The lxml ElementTree of `source`, or MarkupError. lxml has no type hints: Any."""
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, strip_cdata=False, encoding="utf-8"
    )
    try:
        return etree.fromstring(source.encode("utf-8", "surrogatepass"), parser).getroottree()
    except etree.XMLSyntaxError as error:
        line, column = error.position
        message = str(error.msg)
        suffix = f", line {line}, column {column}"
        if message.endswith(suffix):
            message = message[: -len(suffix)]
        raise MarkupError(message, line, column) from None


def _xml_kept(element: Any, ignored: frozenset[str]) -> bool:
    if not isinstance(element.tag, str):  # comment, processing instruction, entity
        return True
    if element.get("translate") == "no" or element.get(_ITS_TRANSLATE) == "no":
        return True
    tag: str = element.tag
    return _local(element) in ignored or (tag.startswith(_XHTML) and tag[len(_XHTML) :] in _KEPT)


def _local(element: Any) -> str | None:
    """An element's name without its namespace (None: a comment, a processing instruction)."""
    return etree.QName(element.tag).localname if isinstance(element.tag, str) else None


class _XmlWalker:
    def __init__(self, tree: Any, source: str, collector: _Collector, tags: Tags) -> None:
        self.collector = collector
        self.ignored, self.non_splitting = tags.ignored, tags.non_splitting
        root = tree.getroot()
        # Every node by its traversal order, as render finds them again. lxml's Python objects
        # are the same for a node only while one is alive: the list keeps them.
        self.nodes: list[Any] = list(root.iter())
        self.index: dict[Any, int] = {node: i for i, node in enumerate(self.nodes)}
        self.cdata = "<![CDATA[" in source
        self.element(root, 0)

    def element(self, element: Any, depth: int) -> None:
        if _xml_kept(element, self.ignored) or depth >= _MAX_DEPTH:
            return
        index = self.index[element]
        found: list[_Found] = []
        self.collector.find_attributes(index, element.items(), found)
        self.collector.add_attributes(found)
        children = list(element)
        if not (
            _WORD.search(element.text or "")
            or any(_WORD.search(child.tail or "") for child in children)
            or any(_local(child) in self.non_splitting for child in children)
        ):
            for child in children:
                self.element(child, depth + 1)
            return
        if self.cdata and b"<![CDATA[" in etree.tostring(element, with_tail=False):
            return
        raws: list[_Raw] = [element.text or ""]
        for child in children:
            raws.append(self.inline(child, depth + 1, found))
            raws.append(child.tail or "")
        self.collector.add_run([index], raws, found)

    def inline(self, element: Any, depth: int, found: list[_Found]) -> _Raw:
        index = self.index[element]
        if _xml_kept(element, self.ignored) or depth >= _MAX_DEPTH:
            return _Kept(index)
        mark = len(found)
        self.collector.find_attributes(index, element.items(), found)
        children: list[_Raw] = [element.text or ""]
        plain: list[str | None] = [element.text or ""]
        for child in element:
            raw = self.inline(child, depth + 1, found)
            children.append(raw)
            if isinstance(raw, _Inline):
                plain.append(raw.plain)
            children.append(child.tail or "")
            plain.append(child.tail or "")
        return _settle(index, children, plain, found, mark)


def _append_text(parent: Any, text: str) -> None:
    if len(parent):
        last = parent[-1]
        last.tail = (last.tail or "") + text
    else:
        parent.text = (parent.text or "") + text


def _build_xml(run: _Run, tokens: list[_Token], nodes: list[Any]) -> None:
    """Replaces the run's element's content by the tokens, moving its own elements."""
    container = nodes[run.place[0]]
    for element in [container, *(nodes[index] for index in run.wraps)]:
        element.text = None
        for child in list(element):
            element.remove(child)
    stack = [container]
    for token in tokens:
        if isinstance(token, _Close):
            stack.pop()
        elif isinstance(token, str):
            if token:
                _append_text(stack[-1], token)
        elif isinstance(token, _Open):
            element = nodes[token.wrap.node]
            element.tail = None
            stack[-1].append(element)
            stack.append(element)
        elif token.node is None:  # a URL, a mention... taken out of the text
            _append_text(stack[-1], token.text)
        else:
            element = nodes[token.node]
            element.tail = None
            stack[-1].append(element)


def _render_xml(document: Document, translations: Sequence[tuple[str, Projection]]) -> str:
    tree = _parse_xml(document._source)
    changes = _changes(document, translations)
    values = list(_attribute_values(document, translations))
    if changes or values:
        nodes = list(tree.getroot().iter())
        for attribute, value in values:
            nodes[attribute.node].set(attribute.name, value)
        for run, tokens in changes:
            _build_xml(run, tokens, nodes)
    standalone = tree.docinfo.standalone
    if standalone is None:  # no XML declaration in the source
        return str(etree.tostring(tree, encoding="unicode"))
    written: bytes = etree.tostring(
        tree, encoding="UTF-8", xml_declaration=True, standalone=standalone or None
    )
    return written.decode("utf-8")


# --- Plain text with placeholders --------------------------------------------------------------

# A line break of plain text: a protected span's lines stay together, other lines are runs.
_LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def protect(text: str, protection: Protection) -> Document | None:
    """Plain `text` as a document whose blocks are its lines without their protected spans
    (placeholders.py), which return at `projection.point()` of where they sat, as a URL in an
    HTML run does; a pair of numbered tags (`<0>...</0>`) wraps the target words of the words
    it wrapped, as an inline element does. Whitespace is kept as it is, not collapsed. None
    when `text` has nothing to protect."""
    spans = protection.find(text, _SPECIAL)
    if not spans:
        return None
    pieces: list[tuple[str, str]] = []
    collector = _Collector(False, collapse=False)
    breaks = [
        match.span()
        for match in _LINE_BREAK.finditer(text)
        if not any(s.start < match.start() < s.end for s in spans)
    ]
    start, i = 0, 0
    for line_end, next_start in [*breaks, (len(text), len(text))]:
        inside = []
        while i < len(spans) and spans[i].start < line_end:
            inside.append(spans[i])
            i += 1
        raws = _line_raws(text, start, line_end, inside, pieces)
        collector.add_run([start, line_end], raws, [])
        start = next_start
    return Document(collector.blocks, "text", text, False, tuple(collector.runs), (), tuple(pieces))


@dataclass(slots=True)
class _Pending:
    """A numbered start tag waiting for its end tag."""

    node: int
    name: str
    start: int  # where its start tag starts in the text
    children: list[_Raw]


def _line_raws(
    text: str, start: int, end: int, spans: list[Span], pieces: list[tuple[str, str]]
) -> list[_Raw]:
    """A line's raw pieces for the flattener: text, kept units, and the elements numbered tags
    make (an end tag closes the nearest open one of its number; tags without a partner are
    units)."""

    def node(piece: tuple[str, str]) -> int:
        pieces.append(piece)
        return len(pieces) - 1

    root: list[_Raw] = []
    stack: list[_Pending] = []

    def into() -> list[_Raw]:
        return stack[-1].children if stack else root

    def unwind(frame: _Pending) -> None:
        """An element without its end tag: its start tag is a unit, its content stays."""
        into().extend([_Kept(frame.node), *frame.children])

    done = start
    for span in spans:
        into().append(text[done : span.start])
        done = span.end
        tag = text[span.start : span.end]
        if span.kind == "open":
            stack.append(_Pending(node((tag, "")), span.name, span.start, []))
            continue
        if span.kind == "close" and any(f.name == span.name for f in stack):
            while stack[-1].name != span.name:
                unwind(stack.pop())
            frame = stack.pop()
            content = frame.children
            if any(isinstance(c, str) and _WORD.search(c) for c in content) or any(
                isinstance(c, _Inline) for c in content
            ):
                pieces[frame.node] = (pieces[frame.node][0], tag)
                into().append(_Inline(frame.node, content, None))
            else:  # an element without words: one unit, as written
                pieces[frame.node] = (text[frame.start : span.end], "")
                into().append(_Kept(frame.node))
            continue
        into().append(_Kept(node((tag, ""))))
    into().append(text[done:end])
    while stack:
        unwind(stack.pop())
    return root


def _render_text(document: Document, translations: Sequence[tuple[str, Projection]]) -> str:
    """Plain text: each changed line's tokens written out, the rest as it was."""
    source, pieces = document._source, document._pieces
    out: list[str] = []
    done = 0
    for run, tokens in _changes(document, translations):
        start, end = run.place
        out.append(source[done:start])
        for token in tokens:
            if isinstance(token, str):
                out.append(token)
            elif isinstance(token, _Item):
                out.append(token.text if token.node is None else pieces[token.node][0])
            elif isinstance(token, _Open):
                out.append(pieces[token.wrap.node][0])
            else:
                out.append(pieces[token.wrap.node][1])
        done = end
    out.append(source[done:])
    return "".join(out)


# --- Parse and render --------------------------------------------------------------------------


def parse(
    markup: str,
    format: Format,
    *,
    translate_attributes: bool = False,
    tags: Tags = NO_TAGS,
    protection: Protection | None = None,
) -> Document:
    """The blocks of `markup` to translate. HTML never fails (the HTML5 algorithm repairs
    anything); malformed XML raises MarkupError. `translate_attributes`: alt and title values
    become blocks of their own (plain text) and come back translated. `tags`: the elements a
    request ignores, and where its runs end (`Tags`). `protection`: the placeholders of the
    text (placeholders.py) are kept out with its URLs and mentions, as units (a numbered tag
    too: in markup, elements are the tags)."""
    collector = _Collector(translate_attributes, protection=protection)
    if format == "html":
        fragment = not _DOCUMENT.match(markup)
        _HtmlWalker(_parse_html(markup, fragment), fragment, collector, tags)
    elif format == "xml":
        fragment = False
        _XmlWalker(_parse_xml(markup), markup, collector, tags)
    else:
        raise ValueError(f"unknown markup format {format!r}: 'html' or 'xml'")
    return Document(
        collector.blocks,
        format,
        markup,
        fragment,
        tuple(collector.runs),
        tuple(collector.attributes),
    )


def translatable(text: str) -> bool:
    """Whether `text` has something for the model to read: a letter once its URLs, e-mail
    addresses, @mentions and #hashtags are out (emoji, numbers, punctuation or a URL alone have
    nothing: the model would make up a sentence for them)."""
    return LETTER.search(without_items(text)) is not None


def kept_spans(text: str, protection: Protection) -> list[tuple[int, int]]:
    """Where in plain `text` are the units that never reach the model: its placeholders
    (`protection`), URLs, e-mail addresses, @mentions and #hashtags; in order, none
    overlapping."""
    return [(span.start, span.end) for span in protection.find(text, _SPECIAL)]


def without_items(text: str) -> str:
    """Plain `text` without what a document's blocks leave out of the model's text (URLs,
    e-mail addresses, @mentions, #hashtags): what language detection reads of it."""
    return _SPECIAL.sub(" ", text)


def edges(document: Document) -> list[list[int]]:
    """Each block's character positions where `render` reads its translation's alignment:
    where an inline element starts and ends, and where a kept thing (or an element without
    text) sits. A sentence with none of them inside it is placed whole: the alignment of its
    first and last words is all `render` reads of it."""
    out: list[list[int]] = [[] for _ in document.blocks]

    def walk(children: Iterable[_Child], into: list[int]) -> None:
        for child in children:
            if isinstance(child, _Wrap):
                into.extend((child.start, child.end) if child.start >= 0 else (child.position,))
                walk(child.children, into)
            else:
                into.append(child.position)

    for run in document._runs:
        walk(run.children, out[run.block])
    return out


def render(document: Document, translations: Sequence[tuple[str, Projection]]) -> str:
    """The document with each block replaced by its translation, `translations[i]` being
    (target text of `blocks[i]`, its projection)."""
    if len(translations) != len(document.blocks):
        raise ValueError(
            f"{len(translations)} translations for {len(document.blocks)} blocks: one per block"
        )
    # A byte order mark the source starts with: the HTML parser never sees it, lxml reads it as
    # the encoding's; the output starts with it as the source did.
    if document.format == "text":
        return _render_text(document, translations)
    bom = _BOM if document._source.startswith(_BOM) else ""
    if document.format == "html":
        return bom + _render_html(document, translations)
    return bom + _render_xml(document, translations)


def _attribute_values(
    document: Document, translations: Sequence[tuple[str, Projection]]
) -> Iterator[tuple[_Attribute, str]]:
    for attribute in document._attributes:
        target = translations[attribute.block][0]
        if target != document.blocks[attribute.block]:
            yield attribute, target


def _changes(
    document: Document, translations: Sequence[tuple[str, Projection]]
) -> list[tuple[_Run, list[_Token]]]:
    """Each run that changes, with what replaces its nodes; empty when nothing changes."""
    changes: list[tuple[_Run, list[_Token]]] = []
    for run in document._runs:
        target, projection = translations[run.block]
        if target == document.blocks[run.block] and _identity(run.children, projection):
            continue
        tokens: list[_Token] = [run.leading]
        _layout(run.children, 0, len(target), target, projection, tokens)
        tokens.append(run.trailing)
        changes.append((run, _spaced(tokens)))
    return changes


# --- Laying a translation out ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Open:
    wrap: _Wrap


@dataclass(frozen=True, slots=True)
class _Close:
    wrap: _Wrap


# What replaces a run's nodes: target text, an element's start and end, a kept thing.
_Token: TypeAlias = str | _Open | _Close | _Item


def _identity(children: Iterable[_Child], projection: Projection) -> bool:
    """Whether the projection leaves every element and kept thing where it was."""
    for child in children:
        if isinstance(child, _Wrap) and child.start >= 0:
            if projection.span(child.start, child.end) != (child.start, child.end):
                return False
            if not _identity(child.children, projection):
                return False
        elif projection.point(child.position) != child.position:
            return False
    return True


def _layout(
    children: Sequence[_Child],
    low: int,
    high: int,
    target: str,
    projection: Projection,
    tokens: list[_Token],
) -> None:
    """Appends target[low:high] to `tokens` with `children` placed in it: each element around
    the target span of its words, clipped to [low, high], later ones (in the target) starting
    where earlier ones end; an element without aligned words and a kept thing at the point
    their source position projects to. Ties keep the source order."""
    placed: list[tuple[int, int, int, _Child]] = []
    for order, child in enumerate(children):
        span = None
        if isinstance(child, _Wrap) and child.start >= 0:
            span = projection.span(child.start, child.end)
            if span is None:
                point = projection.point(child.start)
                span = (point, point)
        if span is None:
            point = projection.point(child.position)
            span = (point, point)
        start = min(max(span[0], low), high)
        placed.append((start, order, min(max(span[1], start), high), child))
    placed.sort(key=lambda place: (place[0], place[1]))
    done = low
    for start, _, end, child in placed:
        start = max(start, done)
        end = max(end, start)
        if isinstance(child, _Wrap):
            # Whole words: the spaces at the edges stay outside.
            while start < end and target[start] in _WHITESPACE:
                start += 1
            while end > start and target[end - 1] in _WHITESPACE:
                end -= 1
        if start > done:
            tokens.append(target[done:start])
        if isinstance(child, _Item):
            tokens.append(child)
        else:
            tokens.append(_Open(child))
            _layout(child.children, start, end, target, projection, tokens)
            tokens.append(_Close(child))
        done = end
    if high > done:
        tokens.append(target[done:high])


def _unit(token: _Token) -> _Item | _Wrap | None:
    """The kept thing or word-less element that `token` starts, else None."""
    if isinstance(token, _Item):
        return token
    if isinstance(token, _Open) and token.wrap.start < 0:
        return token.wrap
    return None


def _unit_end(token: _Token) -> _Item | _Wrap | None:
    if isinstance(token, _Item):
        return token
    if isinstance(token, _Close) and token.wrap.start < 0:
        return token.wrap
    return None


def _space_before(spaced: list[_Token], unit: _Item | _Wrap) -> bool:
    """Whether `unit`, about to follow `spaced`, needs a space before it to be where its source
    was: after a word it was not glued to, or after a unit with whitespace between them."""
    for token in reversed(spaced):
        if isinstance(token, str):
            if token:
                return token[-1] not in _WHITESPACE and not unit.glue_before
        elif isinstance(token, _Item):
            return token.space_after or unit.space_before
        elif token.wrap.start < 0:  # a word-less element: its own spacing does
            return isinstance(token, _Close) and (token.wrap.space_after or unit.space_before)
    return False


def _space_after(tokens: list[_Token], start: int, unit: _Item | _Wrap) -> bool:
    for i in range(start, len(tokens)):
        token = tokens[i]
        if isinstance(token, str):
            if token:
                # Never before punctuation that closes ("%s ." where the model moved the unit)
                # and ends the text or a word: glued to more, it would read as part of a URL.
                punctuation = _CLOSING_RUN.match(token)
                rest = token[punctuation.end() :] if punctuation else ""
                closing = punctuation is not None and (
                    rest[:1].isspace()
                    or (
                        not rest
                        and all(isinstance(t, str) and not t.strip() for t in tokens[i + 1 :])
                    )
                )
                return token[0] not in _WHITESPACE and not unit.glue_after and not closing
        elif isinstance(token, _Item):
            return unit.space_after or token.space_before
        elif token.wrap.start < 0:
            return isinstance(token, _Open) and (unit.space_after or token.wrap.space_before)
    return False


def _spaced(tokens: list[_Token]) -> list[_Token]:
    """`tokens` with a space put before and after each unit where its source had one and its
    new neighbours have none."""
    spaced: list[_Token] = []
    for i, token in enumerate(tokens):
        unit = _unit(token)
        if unit is not None and _space_before(spaced, unit):
            spaced.append(" ")
        spaced.append(token)
        unit = _unit_end(token)
        if unit is not None and _space_after(tokens, i + 1, unit):
            spaced.append(" ")
    return spaced
