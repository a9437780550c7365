"""Cut a text into the sentences the model translates, keeping everything between them verbatim
so that the translation keeps the input's lines, paragraphs and indentation.

The model was trained on single sentences (image captions), so a paragraph is translated sentence by
sentence. A sentence ends at `.`, `!`, `?`, `…`, optionally followed by closing quotes or
brackets, then whitespace, unless the next word starts in lower case ("e.g.
this"), or the mark is the period of an initial ("J. R. R. Tolkien"), of an acronym with inner
periods ("J.P. Morgan", "U.S. Army"), or of a title or abbreviation of the source language that is
usually followed by a capital ("Dr. Smith", "Hr. Müller", "M. Dupont"), or of a number abbreviation
before a digit ("No. 5"): the `_ABBREVIATIONS` of the source language, in the spirit of Moses'
non-breaking prefixes. The trade-offs, as in Moses: any single capital letter reads as an initial
("Plan B. Then" stays one segment), except the English pronoun "I"; a title right after a number is
a unit and does end a sentence ("3 m.").

Chinese and Japanese write no space between sentences: their full-width marks `。`, `！`, `？`
(and the half-width `｡`) end a sentence with or without space after them, closing quotes and
brackets included ("他说：“我很好。”然后离开了。" is two; a straight quote only before a space or
the line's end, as one that may open the next sentence), except a quote followed by Japanese's
quotative particle と or って ("「晴れです。」と言った。" is one).

Thai writes no sentence marks and no space between words, and uses spaces for more than ends of
sentences (around numbers, between the items of a list): a text holding Thai letters is cut by
PyThaiNLP's CRFCut (a conditional random field over its words and spaces, trained on Thai
text), which was right on 13 of 15 paragraphs where a space between Thai letters was on 10
(benchmarks/RESULTS.md). It is loaded on the first Thai text (about 80 MiB) and splits about
80,000 characters a second.

A sentence goes on across a single line break where a reader would read on: hard-wrapped text
(an e-mail, a commit message, a text file at 72 columns). The line must not end a sentence (an
end mark) or announce what follows (a colon), and the next line must not start a list item or a
quote (`- `, `* `, `• `, `> `, `1. `, `a) `), and either start in lower case, or the line was
full: at least `_WRAP_WIDTH` characters long (wrapping tools break at 60 to 80; a greeting,
a heading or an address line is shorter) and the next line's first word would not have fitted
after it within the paragraph's longest line. Between Chinese or Japanese characters any line
break is a wrap; next to Thai, none is (Thai has no case and no end marks: a line is read as
its own). A sentence does not go on past `_LONGEST_WRAPPED` characters, and a text whose
joined sentence is over the model's token limit is split line by line instead
(service/text/pipeline.py, `split(..., wraps=False)`). The segment then
holds the line break (`Layout.inputs` gives it to the model as a space) and `Layout.rewrap` puts
it back into the translation at the same fraction of the sentence's length, in the nearest space
between words: the translation keeps the input's lines, as the LibreTranslate API promises, and
is wrapped as evenly as the input was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

import regex

# A character to translate: neither whitespace, nor a control character, nor a format
# character (Unicode category Cf: byte order mark U+FEFF, zero-width space U+200B, joiners
# U+200C and U+200D, word joiner U+2060, soft hyphen U+00AD, bidi controls...), which shows
# nothing: a line of them and whitespace has nothing to translate (the model would invent a
# sentence for it), nor has a run of markup (service/text/markup.py). (`regex` for Unicode's
# categories, which `re` has no class for.)
VISIBLE = regex.compile(r"[^\s\p{Cc}\p{Cf}]")
# A letter of any script (category L: not "½", "²", "①" or "Ⅻ", which `[^\W\d_]` takes): a
# sentence, a markup run or a text without one (emoji, numbers, punctuation) has nothing to
# translate or to detect (the model would make up a sentence for it).
LETTER = regex.compile(r"\p{L}")
# Everything `str.splitlines` breaks on: a segment spans two lines only where a sentence is
# hard-wrapped (module docstring).
_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")
# Tried only where a run of end marks begins (the lookbehind): trying every position inside a
# long run without space after it made a search quadratic in the run's length. A run holding a
# full-width mark needs no space after it (group "wide"); any other, some (group "space").
_SENTENCE_END = re.compile(
    r"(?<![.!?…。！？｡])(?:"
    r"[.!?…]*[。！？｡][.!?…。！？｡]*(?P<closing>(?:[”’»)\]」』）】〉》]|[\"'](?=\s|$))*)(?P<wide>\s*)"
    r"|[.!?…。！？｡]+[\"'”’»)\]]*(?P<space>\s+))"
)
# Japanese's quotative particle after a closing quote: 「...。」と言った, 『...。』って.
_QUOTATIVE = re.compile(r"と|って")
_THAI = re.compile(r"[\u0e01-\u0e4e]")  # Thai letters and signs
# Hard wraps (module docstring). A line that ends a sentence or announces what follows:
_LINE_ENDED = re.compile(r"(?:[.!?…。！？｡][\"'”’»)\]」』）】〉》]*|[:：])$")
# A line that starts a list item or a quote:
_ITEM = re.compile(r"(?:[-*+•‣◦▪–—>|#]|\d{1,3}[.)]|[A-Za-z][.)])(?:\s|$)")
# Characters between which a line may break anywhere: Han, kana, full-width forms, Hangul.
_WRAPS_ANYWHERE = re.compile(
    r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff60\uac00-\ud7af]"
)
# A line shorter than this is not taken for hard-wrapped by its length (a greeting, a heading,
# an address, a poem, a list without marks): wrapping tools break at 60 to 80.
_WRAP_WIDTH = 60
# Nor does a sentence go on across lines past this many characters (more than the model's 256
# tokens): many unpunctuated lines (a log, a word list) are not read as one endless sentence.
_LONGEST_WRAPPED = 1000
# A line's text up to the end of its last sentence mark and the space after it.
_LAST_END = re.compile(
    r".*(?:[.!?…。！？｡][\"'”’»)\]」』）】〉》]*\s|[。！？｡][\"'”’»)\]」』）】〉》]*)", re.DOTALL
)
_BREAK = re.compile(r"\r\n|[\n\r]")
# A line break inside a sentence, or several in a row (a blank line inside a segment, which
# splitting "sentences" and "none" make): put back as one.
_WRAP = re.compile(r"[^\S\n\r]*(?:(?:\r\n|[\n\r])[^\S\n\r]*)+")
_AS_SPACES = str.maketrans("\n\r", "  ")
_GAP = re.compile(r"\s+")

# Where a text is cut into segments: at sentence ends and line breaks ("lines", the default: a
# hard-wrapped sentence's lines are joined), at sentence ends only ("sentences": a line break
# is a space between words, DeepL's split_sentences=nonewlines), or nowhere ("none": the whole
# text is one segment, DeepL's split_sentences=0, for a client that sends one sentence a text).
Splitting = Literal["lines", "sentences", "none"]


@dataclass(frozen=True)
class _Abbreviations:
    """Words (lower case, without their period) after which a period does not end a sentence:
    titles and the like before any word, words that only abbreviate before a number ("No. 5",
    but "I said no. Then"), and single letters that are words rather than initials. "etc." and
    the like often end sentences: left out."""

    titles: frozenset[str] = frozenset()
    before_numbers: frozenset[str] = frozenset()
    not_initials: frozenset[str] = frozenset()


def _words(words: str) -> frozenset[str]:
    return frozenset(words.split())


# By source language; any other language gets the language-independent rules only.
_ABBREVIATIONS: dict[str, _Abbreviations] = {
    "en": _Abbreviations(
        titles=_words(
            "mr mrs ms messrs dr prof rev hon sr jr st mt capt col gen gov lt maj sgt adm cmdr "
            "sen rep pres supt insp vs"
        ),
        before_numbers=_words("no nos fig figs vol vols pp p art ch sec"),
        not_initials=_words("i"),
    ),
    "de": _Abbreviations(
        titles=_words("hr hrn fr frl dr prof st bzw ca vgl ggf evtl inkl z.b d.h u.a"),
        before_numbers=_words("nr abs art bd s str"),
    ),
    "fr": _Abbreviations(
        titles=_words("m mm mme mmes mlle mlles dr pr me st ste"),
        before_numbers=_words("no art ch fig vol p pp"),
    ),
}
_NO_ABBREVIATIONS = _Abbreviations()
# Acronyms with inner periods are recognised up to this length ("U.S.A.F." is 7 before its end).
_LONGEST_ACRONYM = 16
# Longest word looked at, plus an opening quote or bracket and the space before it.
_WINDOW = 2 + max(
    _LONGEST_ACRONYM,
    *(
        len(word)
        for table in _ABBREVIATIONS.values()
        for word in table.titles | table.before_numbers
    ),
)


@dataclass(frozen=True)
class Rewrapped:
    """A sentence's translation with the sentence's line breaks put back (`Layout.rewrap`):
    `text`, and the `edits` that made it from the translation, (start, old length, new length)
    in order, through which `position` maps the translation's character offsets."""

    text: str
    edits: tuple[tuple[int, int, int], ...] = field(default=())

    def position(self, offset: int, *, starts: bool = False) -> int:
        """Where character `offset` of the translation is in `text`; with `starts`, the offset
        where something begins, after a line break put in at it (not before)."""
        shift = 0
        for start, old, new in self.edits:
            if offset < start or (offset == start and not (starts and old == 0)):
                break
            if offset < start + old:
                return start + shift + min(offset - start, new)
            shift += new - old
        return offset + shift


@dataclass(frozen=True)
class Layout:
    """A text as separators and segments, alternating: `separators[0] + segments[0] +
    separators[1] + ... + segments[-1] + separators[-1]` is the original text. Segments are
    non-empty, start and end with a `VISIBLE` character (a line's whitespace and format
    characters at its edges, a byte order mark, are in the separators), and hold a line break
    only where a sentence is hard-wrapped (module docstring), or where the splitting asked for
    does not end segments at line breaks (`Splitting`)."""

    segments: tuple[str, ...]
    separators: tuple[str, ...]

    @property
    def inputs(self) -> list[str]:
        """The segments as the model reads them: a hard-wrapped sentence's line breaks as
        spaces, so that every character keeps its offset."""
        return [segment.translate(_AS_SPACES) for segment in self.segments]

    def rewrap(self, translations: Sequence[str]) -> list[Rewrapped]:
        """Each segment's translation with the segment's line breaks put back: each break,
        with the horizontal space around it, replaces the space between words nearest to the
        same fraction of the translation's length (after the previous break's), or where the
        translation has no space between words left, goes in at that point between Chinese or
        Japanese characters, else at the end."""
        return [
            _rewrap(source, translation)
            for source, translation in zip(self.segments, translations, strict=True)
        ]

    def keeping(self, translatable: Callable[[str], bool]) -> Layout:
        """The layout with each segment that is not `translatable` moved into the separator
        before it: it comes back as it is, never read by the model."""
        segments, separators = [], [self.separators[0]]
        for segment, separator in zip(self.segments, self.separators[1:], strict=True):
            if translatable(segment):
                segments.append(segment)
                separators.append(separator)
            else:
                separators[-1] += segment + separator
        return Layout(tuple(segments), tuple(separators))

    def spans(self) -> list[tuple[int, int]]:
        """Each segment's characters [start, end) in the original text."""
        out, at = [], len(self.separators[0])
        for segment, separator in zip(self.segments, self.separators[1:], strict=True):
            out.append((at, at + len(segment)))
            at += len(segment) + len(separator)
        return out

    def join(self, translations: Sequence[str]) -> str:
        """The layout with each segment replaced by its translation."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        parts = [self.separators[0]]
        for translation, separator in zip(translations, self.separators[1:], strict=True):
            parts += (translation, separator)
        return "".join(parts)


def _rewrap(source: str, translation: str) -> Rewrapped:
    breaks = list(_WRAP.finditer(source))
    if not breaks:
        return Rewrapped(translation)
    gaps = [
        m.span() for m in _GAP.finditer(translation) if m.start() > 0 and m.end() < len(translation)
    ]
    edits: list[tuple[int, int, str]] = []
    done = 0  # the translation is placed up to here
    for wrap in breaks:
        point = round(wrap.start() * len(translation) / len(source))
        left = [gap for gap in gaps if gap[0] >= done]
        if left:
            start, end = min(left, key=lambda gap: abs(gap[0] - point))
        else:  # no space left: at the point between Chinese or Japanese characters, else at the end
            start = end = min(max(point, done), len(translation))
            if not (
                0 < start < len(translation)
                and _WRAPS_ANYWHERE.match(translation, start - 1)
                and _WRAPS_ANYWHERE.match(translation, start)
            ):
                start = end = len(translation)
        text = wrap.group()
        if edits and edits[-1][1] == start and edits[-1][2].endswith("\r") and text[0] == "\n":
            # Two breaks at one place: a lone CR then a LF would read as one CRLF.
            text = " " + text
        edits.append((start, end, text))
        done = end
    parts: list[str] = []
    at = 0
    for start, end, wrap_text in edits:
        parts += (translation[at:start], wrap_text)
        at = end
    parts.append(translation[at:])
    return Rewrapped(
        "".join(parts),
        tuple((start, end - start, len(wrap_text)) for start, end, wrap_text in edits),
    )


def wrapped(segment: str) -> bool:
    """Whether a segment is a sentence that goes on across a line break."""
    return _BREAK.search(segment) is not None


def split(
    text: str, language: str = "", *, wraps: bool = True, splitting: Splitting = "lines"
) -> Layout:
    """`language` (the source's code) picks the abbreviations that do not end a sentence; any
    other code gets the language-independent rules only. `splitting`: where segments end
    (`Splitting`). `wraps` False: every line on its own (no segment goes on across a line
    break; with splitting "none", each line is one segment)."""
    abbreviations = _ABBREVIATIONS.get(language, _NO_ABBREVIATIONS)
    segments: list[str] = []
    separators: list[str] = []
    end_of_last = 0
    units: Iterable[tuple[int, int]] = [(0, len(text))]
    if not wraps:
        units = (line.span() for line in _LINE.finditer(text))
    elif splitting == "lines":
        units = _units(text)
    for unit_start, unit_end in units:
        found = (
            [_trimmed(text, unit_start, unit_end)]
            if splitting == "none"
            else _sentences(text, unit_start, unit_end, abbreviations)
        )
        for start, end in found:
            if start == end:
                continue  # a unit of nothing visible
            separators.append(text[end_of_last:start])
            segments.append(text[start:end])
            end_of_last = end
    separators.append(text[end_of_last:])
    return Layout(tuple(segments), tuple(separators))


def _units(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of `text`, the lines of a hard-wrapped sentence as one."""
    lines = [line.span() for line in _LINE.finditer(text)]
    first = 0
    while first < len(lines):
        last = first + 1  # the paragraph: lines apart by one line break
        while last < len(lines) and _BREAK.fullmatch(text, lines[last - 1][1], lines[last][0]):
            last += 1
        paragraph = lines[first:last]
        width = max(len(text[a:b].rstrip()) for a, b in paragraph)
        start = since = paragraph[0][0]  # since: where the sentence that goes on began
        for (a, b), (c, d) in pairwise(paragraph):
            ended = _LAST_END.match(text, a, b)
            since = ended.end() if ended else since
            if d - since > _LONGEST_WRAPPED or not _continues(text[a:b], text[c:d], width):
                yield start, b
                start = since = c
        yield start, paragraph[-1][1]
        first = last


def _continues(line: str, following: str, width: int) -> bool:
    """Whether a sentence goes on from `line` to the `following` one (module docstring), in a
    paragraph whose longest line is `width` characters long."""
    line, following = line.rstrip(), following.lstrip()
    if not line or not following or _LINE_ENDED.search(line) or _ITEM.match(following):
        return False
    if _THAI.match(line[-1]) or _THAI.match(following):
        return False
    if following[0].islower() or (
        _WRAPS_ANYWHERE.match(line[-1]) and _WRAPS_ANYWHERE.match(following)
    ):
        return True
    first_word = following.split(maxsplit=1)[0]
    return len(line) >= _WRAP_WIDTH and len(line) + 1 + len(first_word) > width


def _sentences(
    text: str, start: int, end: int, abbreviations: _Abbreviations
) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence of the line text[start:end], without surrounding space:
    those that end marks end, each cut by CRFCut where it holds Thai."""
    for marked in _marked(text, start, end, abbreviations):
        # Without what shows nothing at its edges (after a full-width mark, say: no space).
        first, last = _trimmed(text, *marked)
        if first == last:
            continue
        if _THAI.search(text, first, last) is None:
            yield first, last
            continue
        from pythainlp.tokenize import sent_tokenize  # loaded on the first Thai text

        pieces = [str(piece) for piece in sent_tokenize(text[first:last], engine="crfcut")]
        if "".join(pieces) != text[first:last]:
            raise AssertionError("CRFCut's sentences do not make up its text")
        for piece in pieces:
            at, to = _trimmed(text, first, first + len(piece))
            if at < to:
                yield at, to
            first += len(piece)


def _marked(
    text: str, start: int, end: int, abbreviations: _Abbreviations
) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence that end marks end in text[start:end]."""
    start, end = _trimmed(text, start, end)
    if start == end:
        return
    for match in _SENTENCE_END.finditer(text, start, end):
        if match.end() == end:
            break  # the line's last sentence ends where the line does
        # The line's trailing space is stripped, so the next character is not a space.
        following = text[match.end()]
        if match.group("wide") is not None:
            if match.group("closing") and _QUOTATIVE.match(text, match.end()):
                continue  # 「...。」と: a quote the sentence goes on after
            yield start, match.start("wide")
        elif following.islower() or _abbreviated(text, start, match, abbreviations):
            continue
        else:
            yield start, match.start("space")
        start = match.end()
    yield start, end


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """text[start:end] without the whitespace and format characters at its edges."""
    while start < end and not VISIBLE.match(text, start):
        start += 1
    while end > start and not VISIBLE.match(text, end - 1):
        end -= 1
    return start, end


def _abbreviated(
    text: str, start: int, match: re.Match[str], abbreviations: _Abbreviations
) -> bool:
    """Whether the end mark of `match` is a lone period after an initial ("J."), an acronym
    with inner periods ("J.P."), a title, or a number abbreviation before a digit; `start` is
    where the sentence began."""
    if match.group().rstrip() != ".":
        return False
    # Read back a bounded window, so the whole split stays linear in the text's length.
    window_start = max(start, match.start() - _WINDOW)
    window = text[window_start : match.start()]
    words = window.split()
    if not words or (len(words) == 1 and window_start > start and not window[0].isspace()):
        return False  # no word, or one that goes back further than any abbreviation
    word = words[-1].lstrip("\"'“‘«([")
    _, period, last = word.rpartition(".")
    if period and last and all(c.isupper() or c == "-" for c in last):
        return True  # an acronym with inner periods ("J.P.", "U.S."), as in Moses
    word = word.lower()
    if len(word) == 1 and text[match.start() - 1].isupper():
        return word not in abbreviations.not_initials  # an initial, unless "I" in English
    if word in abbreviations.titles:
        return not (len(words) > 1 and words[-2].isdigit())  # "3 m." is a unit
    return word in abbreviations.before_numbers and text[match.end()].isdigit()
