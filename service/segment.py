"""Cut a text into the sentences the model translates, keeping everything between them verbatim
so that the translation keeps the input's lines, paragraphs and indentation.

The model was trained on single sentences (image captions), so a paragraph is translated
sentence by sentence. A sentence ends at `.`, `!`, `?`, `…` (and their CJK forms), optionally
followed by closing quotes or brackets, then whitespace, unless the next word starts in lower case
("e.g. this"). Abbreviations before a capital ("Dr. Smith") are cut: a known limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# Everything `str.splitlines` breaks on: no segment spans two lines.
_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")
# Tried only where a run of end marks begins (the lookbehind): trying every position inside a
# long run without space after it made a search quadratic in the run's length.
_SENTENCE_END = re.compile(r"(?<![.!?…。！？])[.!?…。！？]+[\"'”’»)\]]*(?P<space>\s+)")


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


def split(text: str) -> Layout:
    segments: list[str] = []
    separators: list[str] = []
    end_of_last = 0
    for line in _LINE.finditer(text):
        for start, end in _sentences(text, line.start(), line.end()):
            separators.append(text[end_of_last:start])
            segments.append(text[start:end])
            end_of_last = end
    separators.append(text[end_of_last:])
    return Layout(tuple(segments), tuple(separators))


def _sentences(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence of the line text[start:end], without surrounding space."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start == end:
        return
    for match in _SENTENCE_END.finditer(text, start, end):
        # The line's trailing space is stripped, so the next character exists and is not a space.
        if not text[match.end()].islower():
            yield start, match.start("space")
            start = match.end()
    yield start, end
