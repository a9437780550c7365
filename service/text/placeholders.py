"""Placeholders and protected spans in plain text: what must come back byte for byte.

Software strings carry printf conversions (`%s`, `%1$s`, `%(name)s`), Python and ICU braces
(`{0}`, `{name}`, `{count, plural, one {# dog} other {# dogs}}` whole, however nested),
template variables (`{{name}}`, `${var}`), numbered tags (`<0>`, `</0>`, `<1/>`) and code in
backticks; a request may add its own patterns. `Protection.find` finds them in a text; markup.py
(`markup.protect`) takes each out of the model's sentence as it takes a URL out of an HTML run
(the same `_Item`), and a pair of numbered tags becomes an inline element that wraps the target
words its source words were aligned to, as `<b>` does. So the model reads "dogs play in the
snow." for "{count} dogs play in the snow.", and "{count}" returns where the alignment puts the
point it sat at, exactly once.

URLs, e-mail addresses, @mentions and #hashtags are among the protected spans (markup's
`_SPECIAL`, what HTML runs already keep out). A request's own patterns are regular expressions
of the `regex` package, run with a time limit (`PATTERN_TIMEOUT_S` for all of a text), so a
pattern that backtracks without end is a 400, not a stuck worker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import regex

from service.errors import ErrorType, ServiceError

# The built-in spans, tried at every position, the first alternative that matches wins.
_BUILT_IN = regex.compile(
    r"""
    (?P<tag></?\d{1,3}\s*/?>)                                   # <0>, </0>, <1/>
    | \$?(?P<brace>\{(?:[^{}]++|(?&brace))*\})                  # {0} {name} {{x}} ${x} ICU
    | %\([^()\s]{1,64}\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]  # %(name)s
    | %(?:\d{1,2}\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?
      (?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcsp@%]           # %s %1$s %05.2f %%
    | ``[^\n]+?``|`[^`\n]+`                                     # code
    """,
    regex.VERBOSE,
)
_TAG = regex.compile(r"<(/?)(\d{1,3})\s*(/?)>")

PATTERN_TIMEOUT_S = 0.1  # a request's own patterns, over one text
MAX_PATTERNS = 16
MAX_PATTERN_LENGTH = 512

Kind = Literal["item", "open", "close"]


@dataclass(frozen=True, slots=True)
class Span:
    """A protected span of a text: [start, end), and what it is: a unit kept whole ("item"),
    or a numbered tag's start ("open", `name` its number) or end ("close")."""

    start: int
    end: int
    kind: Kind = "item"
    name: str = ""


class Protection:
    """What a request protects: the built-in spans, and its own patterns (compiled once)."""

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        if len(patterns) > MAX_PATTERNS:
            raise _invalid(f"{len(patterns)} placeholder patterns; the limit is {MAX_PATTERNS}")
        compiled = []
        for i, pattern in enumerate(patterns):
            if not pattern or len(pattern) > MAX_PATTERN_LENGTH:
                raise _invalid(
                    f"placeholder pattern {i}: between 1 and {MAX_PATTERN_LENGTH} characters"
                )
            try:
                compiled.append(regex.compile(pattern))
            except regex.error as e:
                raise _invalid(f"placeholder pattern {i} ({pattern!r}): {e}") from None
        self.patterns: tuple[regex.Pattern[str], ...] = tuple(compiled)

    def find(self, text: str, special: re.Pattern[str]) -> list[Span]:
        """The protected spans of `text`, in order, none overlapping: leftmost first, then the
        longest, then the request's own patterns before the built-in ones and `special`
        (markup's URLs, e-mail addresses, @mentions, #hashtags)."""
        found: list[tuple[int, int, int]] = []  # (start, -end, rank)
        for rank, pattern in enumerate(self.patterns):
            try:
                for match in pattern.finditer(text, timeout=PATTERN_TIMEOUT_S):
                    if match.end() > match.start():
                        found.append((match.start(), -match.end(), rank))
            except TimeoutError:
                raise _invalid(
                    f"placeholder pattern {rank} ({pattern.pattern!r}) took more than "
                    f"{PATTERN_TIMEOUT_S} s on a text; make it simpler"
                ) from None
        rank = len(self.patterns)
        found += [(m.start(), -m.end(), rank) for m in _BUILT_IN.finditer(text)]
        found += [(m.start(), -m.end(), rank) for m in special.finditer(text)]
        spans: list[Span] = []
        done = 0
        for start, end, _ in sorted(found):
            if start >= done:
                spans.append(_span(text, start, -end))
                done = -end
        return spans


def _span(text: str, start: int, end: int) -> Span:
    tag = _TAG.fullmatch(text, start, end)
    if tag is None or tag.group(3):  # not a tag, or self-closing: a unit
        return Span(start, end)
    return Span(start, end, "close" if tag.group(1) else "open", tag.group(2))


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, message)
