"""Markdown (CommonMark, with GitHub's tables and strikethrough): the inline content of
paragraphs, headings, list items, block quotes and table cells is translated; everything else
comes back byte for byte: front matter, code blocks and fences, HTML blocks, link reference
definitions, thematic breaks, list markers and indentation, block quote markers, line endings.

markdown-it-py (the CommonMark reference parser's port, maintained with the executable
books' tooling) parses the file. Its block tokens carry the lines they came from, and its
inline rules are wrapped here to record where each inline token starts and ends in its block's
content; so a translated paragraph replaces exactly the characters of its source content, and
what a code stands for is the source's own bytes. markdown-it-py renders HTML only (the
issue's "a parser that can render back to Markdown" is mdformat, which reformats the whole
file: lists renumbered, emphasis markers and line wrapping normalised), hence the splice.

In a paragraph: emphasis, strong emphasis and strikethrough are codes written with the source's
delimiters (`*`, `__`, `~~`); an inline link `[text](target "title")` or full reference link
`[text][label]` is a code around its text, its target part kept as written; a shortcut or
collapsed reference link (`[label]`, `[label][]`), whose text is its label, an image, an
autolink, inline code, inline HTML and a hard line break are empty codes kept as written, and
so are the placeholders, URLs and e-mail addresses of its text (what the markup stage keeps
from the model anyway: service/text/placeholders.py), which are thus never escaped when written
(`<0>` stays `<0>`, `{user_name}` keeps its `_`). Escapes and entities are characters while
translated; in a changed paragraph the characters Markdown reads as syntax (\\ ` * _ [ ] < |, a
leading # > - + or 1., an & that would start an entity) are escaped again. A paragraph's soft
line breaks become spaces: its translation is one line (after its block quote and list markers,
which its first line keeps). Not translated: image alt text, a table cell holding an escaped
pipe (\\|), a paragraph whose lines the parser read with tabs expanded (found nowhere as
written).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkLabel
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token

from service.documents.base import Code, Extracted, Limits, Unit, inline, plain, read_inline
from service.documents.formats.plain import Decoded, decode, text_head
from service.text.markup import kept_spans, translatable
from service.text.placeholders import Protection

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")
# YAML (---) or TOML (+++) front matter: the file's first lines, to the same fence.
_FRONT_MATTER = re.compile(
    r"(---|\+\+\+)[ \t]*\r?\n(?:.*?\r?\n)??(?:\1|\.\.\.)[ \t]*(?:\r?\n|$)", re.S
)
_SYNTAX = re.compile(r"([\\`*_\[\]<|])")
_ENTITY_LIKE = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
_LEADING_SYNTAX = re.compile(r"^([#>+-]|\d+[.)])(?=\s|$)")
# Around a hard break while written: the spaces that parted it from the words go (NUL is in no
# text file: decode refuses it).
_SPACED_START, _SPACED_END = "\x00[", "\x00]"
_POSITION = "position"  # an inline token's meta key: its (start, end) in its block's content
_PROTECTION = Protection()  # the built-in placeholders, as a document's translation keeps them


@dataclass(frozen=True)
class _Wrap:
    """A code around text: what comes before and after it (delimiters, a link's target)."""

    start: str
    end: str


@dataclass(frozen=True)
class _Kept:
    """An empty code: source bytes written back as they were."""

    raw: str
    spaced: bool = False  # a hard break: a space on either side while translated


def _positioned(rule: Callable[[StateInline, bool], bool], name: str) -> Any:
    """`rule`, recording on each token it makes (but text, whose pending buffer any rule may
    flush) where in the content it starts and ends; a link's also where its label ends."""

    def wrapped(state: StateInline, silent: bool) -> bool:
        start, made = state.pos, len(state.tokens)
        matched = rule(state, silent)
        if matched and not silent:
            label_end = parseLinkLabel(state, start, True) if name == "link" else -1
            for token in state.tokens[made:]:
                if token.type != "text" and _POSITION not in token.meta:
                    token.meta[_POSITION] = (start, state.pos, label_end)
        return matched

    return wrapped


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    md.core.ruler.disable("text_join")  # escapes and entities stay tokens of their own
    rules = dict(zip(md.inline.ruler.get_active_rules(), md.inline.ruler.getRules(""), strict=True))
    for name, rule in rules.items():
        md.inline.ruler.at(name, _positioned(rule, name))
    return md


_MD = _parser()


@dataclass(frozen=True)
class _Block:
    """A block's inline content: where it lies in the file, its unit's children."""

    start: int
    end: int
    children: list[Code | str]


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = [(m.start(), m.group(0)) for m in _LINE.finditer(text)]
        self.table: list[_Wrap | _Kept] = []

    def blocks(self) -> list[_Block]:
        front = _FRONT_MATTER.match(self.text)
        source = self.text
        if front is not None:  # blank lines in its place, for the parser only
            source = re.sub(r"[^\r\n]", "", front.group(0)) + source[front.end() :]
        blocks: list[_Block] = []
        row_cursor: dict[int, int] = {}  # a table row's line -> where its next cell is looked for
        in_table = False
        for token in _MD.parse(source):
            if token.type in ("table_open", "table_close"):
                in_table = token.type == "table_open"
            if token.type != "inline" or token.map is None or not token.children:
                continue
            starts = self.content_starts(token, row_cursor if in_table else None)
            if starts is None:
                continue
            children = self.inline(token.children, token.content, starts)
            if translatable(plain(children)):
                blocks.append(_Block(_at(starts, 0), _at(starts, len(token.content)), children))
        return blocks

    def content_starts(
        self, token: Token, row_cursor: dict[int, int] | None
    ) -> list[tuple[int, int]] | None:
        """Each line of the token's content: (its offset in the content, its offset in the
        file); None if a line is not found as written (tabs the parser expanded). A line's
        content ends its line (markers and indentation before it); a table cell's is found
        after the row's cells before it (`row_cursor`)."""
        first = token.map[0] if token.map is not None else 0
        starts = []
        at = 0
        for i, line in enumerate(token.content.split("\n")):
            number = first + i
            if number >= len(self.lines):
                return None
            line_start, source_line = self.lines[number]
            source_line = source_line.rstrip("\r\n")
            if row_cursor is not None:
                found = source_line.find(line, row_cursor.get(number, 0))
                row_cursor[number] = found + len(line)
            else:
                found = source_line.rfind(line)
            if found < 0:
                return None
            starts.append((at, line_start + found))
            at += len(line) + 1
        return starts

    def inline(
        self, tokens: Sequence[Token], content: str, starts: list[tuple[int, int]]
    ) -> list[Code | str]:
        root = Code(-1)
        stack = [root]
        kept_link = False  # inside a link kept whole, up to its link_close

        def raw(start: int, end: int) -> str:
            return self.text[_at(starts, start) : _at(starts, end)]

        for token in tokens:
            position = token.meta.get(_POSITION)
            kind = token.type
            if kept_link:
                kept_link = kind != "link_close"
                continue
            children = stack[-1].children
            if kind in ("text", "text_special"):
                children.append(token.content)
            elif kind == "softbreak":
                children.append(" ")
            elif kind in ("em_open", "strong_open", "s_open"):
                stack.append(self.code(_Wrap(token.markup, token.markup), children))
            elif kind in ("em_close", "strong_close", "s_close", "link_close") and len(stack) > 1:
                stack.pop()
            elif kind == "link_open" and position is not None:
                start, end, label_end = position
                target = raw(label_end, end) if token.markup != "autolink" else ""
                if target.startswith("](") or (target.startswith("][") and target != "][]"):
                    # [text](target), [text][label]: the text is translated
                    stack.append(self.code(_Wrap("[", target), children))
                else:  # <autolink>, [label], [label][]: the text is the target or label
                    self.code(_Kept(raw(start, end)), children)
                    kept_link = True
            elif kind == "hardbreak" and position is not None:
                start = _at(starts, position[0])
                while start and self.text[start - 1] == " ":  # its two spaces
                    start -= 1
                children.append(" ")
                self.code(_Kept(self.text[start : _at(starts, position[1])], True), children)
                children.append(" ")
            elif position is not None:  # code, HTML, an image
                self.code(_Kept(raw(position[0], position[1])), children)
        return self.protected(root.children)

    def protected(self, children: list[Code | str]) -> list[Code | str]:
        """`children` with each placeholder, URL and e-mail address of their text (its tokens
        joined) an empty code kept as read."""
        joined: list[Code | str] = []
        for child in children:
            if isinstance(child, str) and joined and isinstance(joined[-1], str):
                joined[-1] += child
            else:
                joined.append(child)
        out: list[Code | str] = []
        for child in joined:
            if isinstance(child, Code):
                child.children = self.protected(child.children)
                out.append(child)
                continue
            at = 0
            for start, end in kept_spans(child, _PROTECTION):
                out.append(child[at:start])
                self.code(_Kept(child[start:end]), out)
                at = end
            out.append(child[at:])
        return [child for child in out if child != ""]

    def code(self, entry: _Wrap | _Kept, into: list[Code | str]) -> Code:
        self.table.append(entry)
        code = Code(len(self.table) - 1)
        into.append(code)
        return code


def _at(starts: list[tuple[int, int]], position: int) -> int:
    """The file offset of a content offset (a binary search: a paragraph may have many
    lines and many tokens)."""
    line = max(bisect_right(starts, (position, math.inf)) - 1, 0)
    content_at, file_at = starts[line]
    return file_at + max(position - content_at, 0)


@dataclass(frozen=True)
class _Markdown:
    decoded: Decoded
    table: list[_Wrap | _Kept]
    blocks: list[_Block]

    @cached_property  # built once: the writer reads them again
    def units(self) -> Sequence[Unit]:
        return [inline(block.children) for block in self.blocks]

    def write(self, translations: Sequence[str]) -> bytes:
        if len(translations) != len(self.blocks):
            raise ValueError(f"{len(translations)} translations for {len(self.blocks)} units")
        text = self.decoded.text
        out, at = [], 0
        for block, unit, translation in zip(self.blocks, self.units, translations, strict=True):
            if translation == unit.text:
                continue
            written = _unspaced(self.serialise(read_inline(translation))).strip()
            out += [text[at : block.start], _LEADING_SYNTAX.sub(r"\\\1", written)]
            at = block.end
        out.append(text[at:])
        return self.decoded.encode("".join(out))

    def serialise(self, children: Sequence[Code | str]) -> str:
        out: list[str] = []
        for child in children:
            if isinstance(child, str):
                out.append(_ENTITY_LIKE.sub("&amp;", _SYNTAX.sub(r"\\\1", child)))
                continue
            entry = self.table[child.index]
            if isinstance(entry, _Kept) and entry.spaced:
                out += [_SPACED_START, entry.raw, _SPACED_END]
            elif isinstance(entry, _Kept):
                out.append(entry.raw)
            else:
                out += [entry.start, self.serialise(child.children), entry.end]
        return "".join(out)


def _unspaced(written: str) -> str:
    """`written` without its hard breaks' markers and the spaces around them."""
    pieces = written.split(_SPACED_START)
    out = [pieces[0]]
    for piece in pieces[1:]:
        raw, _, after = piece.partition(_SPACED_END)
        out[-1] = out[-1].rstrip(" \t")
        out.append(raw + after.lstrip(" \t"))
    return "".join(out)


class MarkdownFormat:
    name = "md"
    extensions = (".md", ".markdown")
    media_type = "text/markdown"

    def sniff(self, data: bytes) -> bool:
        """Any text is Markdown."""
        return text_head(data) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        decoded = decode(data, limits)
        reader = _Reader(decoded.text)
        blocks = reader.blocks()
        return _Markdown(decoded, reader.table, blocks)


FORMATS = (MarkdownFormat(),)
