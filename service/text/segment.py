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
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# Everything `str.splitlines` breaks on: no segment spans two lines.
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
class Layout:
    """A text as separators and segments, alternating: `separators[0] + segments[0] +
    separators[1] + ... + segments[-1] + separators[-1]` is the original text. Segments are
    non-empty, start and end with a non-space character and hold no line break."""

    segments: tuple[str, ...]
    separators: tuple[str, ...]

    def join(self, translations: Sequence[str]) -> str:
        """The layout with each segment replaced by its translation."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        parts = [self.separators[0]]
        for translation, separator in zip(translations, self.separators[1:], strict=True):
            parts += (translation, separator)
        return "".join(parts)


def split(text: str, language: str = "") -> Layout:
    """`language` (the source's code) picks the abbreviations that do not end a sentence; any
    other code gets the language-independent rules only."""
    abbreviations = _ABBREVIATIONS.get(language, _NO_ABBREVIATIONS)
    segments: list[str] = []
    separators: list[str] = []
    end_of_last = 0
    for line in _LINE.finditer(text):
        for start, end in _sentences(text, line.start(), line.end(), abbreviations):
            separators.append(text[end_of_last:start])
            segments.append(text[start:end])
            end_of_last = end
    separators.append(text[end_of_last:])
    return Layout(tuple(segments), tuple(separators))


def _sentences(
    text: str, start: int, end: int, abbreviations: _Abbreviations
) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence of the line text[start:end], without surrounding space."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
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
