"""SubRip (.srt) and WebVTT (.vtt): cue text is translated, everything else of the file comes
back byte for byte (cue numbers and identifiers, timings, positions and cue settings, the
WEBVTT header, NOTE, STYLE and REGION blocks, blank lines, line endings, the encoding).

A sentence that runs across cues is translated as one sentence: consecutive cues are grouped
until one ends a sentence (. ! ? … and their CJK forms, before closing quotes and brackets), a
cue starts a dialogue line ("- ..."), or four cues are together; a group is one unit in which
each boundary between two cues is an empty code. The markup path places each such code at the
point after the target words that the source words before it were translated into, so the
translation is cut where its alignment says the source was: cue k shows the target words
between boundary k-1 and boundary k, in reading order. A cue left without words (two
boundaries at one point) takes the last word of the cue before it, or the first of the next,
when that one has two or more. A line break inside a cue is an empty code too, placed the same
way; inline tags (`<i>`, `<b>`, `<u>`, `<font color>`, WebVTT's `<c.class>`, `<v Speaker>`,
`<lang>`, `<ruby>`, timestamps, and SSA overrides such as `{\\an8}`) are codes: each wraps the
target words of its source words, and comes back with the bytes it had (an unclosed `<v>` stays
unclosed). WebVTT's character references (&amp; &lt; &gt; &nbsp;...) are characters while
translated, and `& < >` are escaped again when written. A cue whose translation is its own text
comes back as it was.

Why no subtitle library writes the file (measured on six files with CRLF line ends, SRT
positions, non-sequential numbers, short timestamps, NOTE/STYLE blocks, cue identifiers and
settings: parsed and composed again, unchanged): srt 3.5.3 gave back 1 of 4 SRT files as they
were (CRLF became LF, 0:00:01,5 was read as 1.005 s), pysubs2 1.8.1 1 of 4 SRT (it renumbers
cues, drops positions and <font>) and 0 of 2 WebVTT (it drops identifiers, settings, NOTE and
STYLE), webvtt-py 0.6.0 0 of 2 WebVTT (it rewrites 00:01.000 as 00:00:01.000). Cue framing is a
few lines of reading blocks between blank lines; so this module keeps every byte it does not
translate, and the tests parse what it writes with srt and webvtt-py.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from service.documents.base import Code, Extracted, Limits, Unit, inline, plain, read_inline
from service.documents.formats.plain import Decoded, decode, text_head, tight_breaks
from service.documents.safe import DocumentError
from service.text.markup import translatable

# A line with its end, or the last line without one.
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_TIMING = "-->"
_WEBVTT = re.compile(r"WEBVTT(?:[ \t\r\n]|$)")
# A SubRip cue's timing line, as the format's sniff looks for it.
_SRT_TIMING = re.compile(r"^[ \t]*\d+:\d+:\d+[,.]\d+[ \t]*-->", re.MULTILINE)
# An inline tag (<i>, </i>, <font color="red">, <c.loud>, <v Bob>, <00:01.500>) or an SSA
# override ({\an8}): group 1 the slash of an end tag, group 2 the tag's name. None reaches past
# the next < or { (possessive: "<a" repeated without a > took cubic time).
_TAG = re.compile(r"<(/?)([A-Za-z][^\s<>./]*+)[^<>]*+>|<[0-9][0-9:.]*+>|\{\\[^{}]*+\}")
_SENTENCE_END = re.compile(r"[.!?…。！？‼⁇⁈⁉][\"'”’»)\]]*\s*$")
_DIALOGUE = re.compile(r"\s*[-–—]")
_LONGEST_GROUP = 4
# Tags open at once in a cue: deeper ones are kept as written (each end tag looks through the
# open ones: a cue of 100,000 start tags would take quadratic time).
_DEEPEST = 32
_VTT_BLOCKS = ("NOTE", "STYLE", "REGION")
_BREAKS = re.compile(r"\n{2,}")


# --- What a code stands for --------------------------------------------------------------------


@dataclass(frozen=True)
class _Tag:
    """An inline tag: its start tag's bytes, and its end tag's (None: the source never closed
    it, as WebVTT allows for <v>)."""

    start: str
    end: str | None


@dataclass(frozen=True)
class _Void:
    """A tag without content (a WebVTT timestamp, {\\an8}, an end tag that closes nothing)."""

    raw: str


class _Break:
    """A line break inside a cue."""


class _Boundary:
    """Where one cue of a group ends and the next begins."""


_Entry = _Tag | _Void | _Break | _Boundary
_BOUNDARY, _BREAK = _Boundary(), _Break()
_BOUNDARY_CODE, _BREAK_CODE = 0, 1  # their places in every file's table


# --- The file's cues ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cue:
    """A cue's text lines: characters [start, end) of the file, their line end, and their
    content as strings and codes."""

    start: int
    end: int
    newline: str
    children: list[Code | str]

    @property
    def plain(self) -> str:
        return plain(self.children)


class _Reader:
    """Cue text to strings and codes, the codes' meanings in `table` (shared by the file's
    cues: the file's writer reads it back)."""

    def __init__(self, vtt: bool) -> None:
        self.vtt = vtt
        self.table: list[_Entry] = [_BOUNDARY, _BREAK]  # _BOUNDARY_CODE, _BREAK_CODE

    def code(self, entry: _Entry) -> Code:
        self.table.append(entry)
        return Code(len(self.table) - 1)

    def cue(self, text: str) -> list[Code | str]:
        root = Code(-1)
        # The open tags: name, code, start tag; the root's first.
        stack: list[tuple[str, Code, str]] = [("", root, "")]
        at = 0
        for match in _TAG.finditer(text):
            self.text(text[at : match.start()], stack[-1][1].children)
            at = match.end()
            raw, closing, name = match.group(0), match.group(1), match.group(2)
            if name is not None and not closing and len(stack) <= _DEEPEST:
                code = self.code(_Tag(raw, None))
                stack[-1][1].children.append(code)
                stack.append((name, code, raw))
            elif name is not None and any(open_name == name for open_name, _, _ in stack[1:]):
                # An end tag closes its element and any left open inside it.
                while stack[-1][0] != name:
                    stack.pop()
                _, code, start = stack.pop()
                self.table[code.index] = _Tag(start, raw)
            else:
                stack[-1][1].children.append(self.code(_Void(raw)))
        self.text(text[at:], stack[-1][1].children)
        return root.children

    def text(self, text: str, into: list[Code | str]) -> None:
        if self.vtt:
            text = html.unescape(text)
        for i, line in enumerate(text.split("\n")):
            if i:
                into.extend([" ", Code(_BREAK_CODE), " "])
            if line:
                into.append(line)


def _lines(text: str) -> list[tuple[int, str]]:
    """Each line's start offset and the line with its end."""
    return [(m.start(), m.group(0)) for m in _LINES.finditer(text)]


def _cues(text: str, reader: _Reader) -> list[_Cue]:
    cues = []
    block: list[tuple[int, str]] = []
    for line in [*_lines(text), (len(text), "")]:
        if line[1].strip():
            block.append(line)
            continue
        if block:
            cue = _cue(block, reader)
            if cue is not None:
                cues.append(cue)
        block = []
    return cues


def _cue(block: list[tuple[int, str]], reader: _Reader) -> _Cue | None:
    """The cue a block of lines is, or None (a header, NOTE, STYLE, REGION, a stray line)."""
    first = block[0][1]
    if reader.vtt and (first.startswith("WEBVTT") or first.split(" ")[0].strip() in _VTT_BLOCKS):
        return None
    timing = next((i for i, (_, line) in enumerate(block[:2]) if _TIMING in line), None)
    if timing is None or timing == len(block) - 1:
        return None
    timing_line = block[timing][1]
    newline = timing_line[len(timing_line.rstrip("\r\n")) :] or "\n"
    start = block[timing + 1][0]
    last_start, last = block[-1]
    end = last_start + len(last.rstrip("\r\n"))
    lines = [line.rstrip("\r\n") for _, line in block[timing + 1 :]]
    return _Cue(start, end, newline, reader.cue("\n".join(lines)))


def _groups(cues: Sequence[_Cue]) -> list[list[int]]:
    """Runs of consecutive translatable cues that make sentences (the module's docstring)."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i, cue in enumerate(cues):
        plain = cue.plain
        if not translatable(plain):
            if current:
                groups.append(current)
            current = []
            continue
        if current and _DIALOGUE.match(plain):
            groups.append(current)
            current = []
        current.append(i)
        if _SENTENCE_END.search(plain) or len(current) == _LONGEST_GROUP:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


# --- Writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Subtitles:
    decoded: Decoded
    table: list[_Entry]
    cues: list[_Cue]
    groups: list[list[int]]
    vtt: bool

    @cached_property  # built once: the writer reads them again
    def units(self) -> Sequence[Unit]:
        units = []
        for group in self.groups:
            base = self.base(group)
            children: list[Code | str] = []
            for k, i in enumerate(group):
                if k:
                    children.extend([" ", Code(_BOUNDARY_CODE), " "])
                cue = self.cues[i].children
                children.extend(_unwrapped(cue) if base is not None else cue)
            units.append(inline(children))
        return units

    def base(self, group: list[int]) -> _Tag | None:
        """The tag that wraps the whole text of each of a group's cues (all in italics, say),
        if one does: the unit holds the cues' words without it, and each cue's translation is
        wrapped in it again. (A unit whose words all lie in codes would be read as one run per
        code: the sentence translated in pieces.)"""
        tags = set()
        for i in group:
            children = self.cues[i].children
            if len(group) < 2 or len(children) != 1 or isinstance(children[0], str):
                return None
            tags.add(self.table[children[0].index])
        (tag,) = tags if len(tags) == 1 else (None,)
        return tag if isinstance(tag, _Tag) else None

    def write(self, translations: Sequence[str]) -> bytes:
        if len(translations) != len(self.groups):
            raise ValueError(f"{len(translations)} translations for {len(self.groups)} units")
        text = self.decoded.text
        replaced: dict[int, str] = {}
        for group, translation in zip(self.groups, translations, strict=True):
            pieces = _split(read_inline(translation), len(group))
            wrapped = self.base(group) is not None
            for i, piece in zip(group, pieces, strict=True):
                cue = self.cues[i]
                if wrapped:  # the base tag around the cue again: its own code's copy
                    piece = [Code(_wrapper(cue.children).index, piece)]
                written = self.serialise(piece)
                if written != self.serialise(cue.children):
                    replaced[i] = written.replace("\n", cue.newline)
        out = []
        at = 0
        for i, cue in enumerate(self.cues):
            if i in replaced:
                out += [text[at : cue.start], replaced[i]]
                at = cue.end
        out.append(text[at:])
        return self.decoded.encode("".join(out))

    def serialise(self, children: Sequence[Code | str]) -> str:
        """A cue's text from its strings and codes, line breaks tidied: no space around one,
        none at the cue's start or end, never two (an empty line would end the cue)."""
        written = _BREAKS.sub("\n", tight_breaks(self._serialise(children)))
        return written.strip(" \n")

    def _serialise(self, children: Sequence[Code | str]) -> str:
        out = []
        for child in children:
            if isinstance(child, str):
                out.append(_escape(child) if self.vtt else child)
                continue
            entry = self.table[child.index]
            if isinstance(entry, _Break):
                out.append("\n")
            elif isinstance(entry, _Void):
                out.append(entry.raw)
            elif isinstance(entry, _Tag):
                out += [entry.start, self._serialise(child.children), entry.end or ""]
        return "".join(out)


def _wrapper(children: list[Code | str]) -> Code:
    """The one code a cue's text is (a group with a base tag)."""
    (code,) = children
    if isinstance(code, str):
        raise ValueError("a cue of a group with a base tag is one code")
    return code


def _unwrapped(children: list[Code | str]) -> list[Code | str]:
    return _wrapper(children).children


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _split(children: list[Code | str], count: int) -> list[list[Code | str]]:
    """A group's translation cut at its boundary codes into `count` cues' contents, a cue
    without words given one of a neighbour's where it has two or more."""
    pieces: list[list[Code | str]] = [[]]
    for child in children:
        if isinstance(child, Code) and child.index == _BOUNDARY_CODE:
            pieces.append([])
        else:
            pieces[-1].append(child)
    if len(pieces) != count:
        raise ValueError(f"a translation of {count} cues came back with {len(pieces)}")
    for k, piece in enumerate(pieces):
        if translatable(plain(piece)):
            continue
        if k and _give_last_word(pieces[k - 1], piece):
            continue
        if k + 1 < count:
            _give_first_word(pieces[k + 1], piece)
    return [_trimmed(piece) for piece in pieces]


def _trimmed(piece: list[Code | str]) -> list[Code | str]:
    """A cue's content without the spaces that parted it from its neighbours."""
    if piece and isinstance(piece[0], str):
        piece[0] = piece[0].lstrip(" ")
    if piece and isinstance(piece[-1], str):
        piece[-1] = piece[-1].rstrip(" ")
    return [child for child in piece if child != ""]


def _give_last_word(giver: list[Code | str], taker: list[Code | str]) -> bool:
    if not giver or not isinstance(giver[-1], str):
        return False
    words = giver[-1].rstrip().rsplit(" ", 1)
    if len(words) < 2 or not translatable(plain(giver[:-1]) + words[0]):
        return False
    giver[-1] = words[0]
    taker.insert(0, words[1] + " ")
    return True


def _give_first_word(giver: list[Code | str], taker: list[Code | str]) -> bool:
    if not giver or not isinstance(giver[0], str):
        return False
    words = giver[0].lstrip().split(" ", 1)
    if len(words) < 2 or not translatable(words[1] + plain(giver[1:])):
        return False
    giver[0] = words[1]
    taker.append(" " + words[0])
    return True


def _read(data: bytes, limits: Limits, vtt: bool) -> Extracted:
    decoded = decode(data, limits)
    if vtt and not _WEBVTT.match(decoded.text):
        raise DocumentError("not a WebVTT file: it does not start with WEBVTT")
    reader = _Reader(vtt)
    cues = _cues(decoded.text, reader)
    if not cues and decoded.text.strip() and not vtt:
        raise DocumentError("not a SubRip file: no cue (a line with -->, then text)")
    return _Subtitles(decoded, reader.table, cues, _groups(cues), vtt)


class SrtFormat:
    name = "srt"
    extensions = (".srt",)
    media_type = "application/x-subrip"

    def sniff(self, data: bytes) -> bool:
        head = text_head(data)
        return head is not None and _SRT_TIMING.search(head) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        return _read(data, limits, vtt=False)


class VttFormat:
    name = "vtt"
    extensions = (".vtt",)
    media_type = "text/vtt"

    def sniff(self, data: bytes) -> bool:
        head = text_head(data)
        return head is not None and _WEBVTT.match(head) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        return _read(data, limits, vtt=True)


FORMATS = (SrtFormat(), VttFormat())
