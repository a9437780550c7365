"""A glossary's terms in a sentence: which entries match, and the target ids each one must
produce (the search's constraints, service/bundle/decoding.py `Constraints`).

Matching is on the sentence the model reads: by word boundaries (no letter, digit or
underscore on either side), case-insensitively unless the entry is case-sensitive, the longest
term first where two start at the same character, leftmost first otherwise, never overlapping;
and over the tokenizer's pieces: a match must start where a token starts and end where one
ends, so a term inside a longer word never matches. Each match is one constraint: its target
term's ids (as the model spells the term inside a sentence), which the translation then holds
exactly once (a term matched twice: twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import regex

from service.bundle.decoding import NO_CONSTRAINTS, Constraints
from service.bundle.tokenizer import Span
from service.errors import ErrorType, ServiceError
from service.glossaries import Entry

_WORDS = regex.compile(r"\w+(?:[-'’]\w+)*")


class TermModel(Protocol):
    """What matching needs of a model: its source tokens' characters and the target ids of a
    term."""

    def source_spans(self, texts: Sequence[str]) -> list[list[Span]]: ...

    def target_ids(self, terms: Sequence[str]) -> list[list[int] | None]:
        """Each term's ids as the model produces it inside a sentence; None for a term the
        vocabulary cannot spell (an unknown character)."""
        ...

    @property
    def word_pieces(self) -> frozenset[int]:
        """The target ids that continue a word (Constraints.word_pieces)."""
        ...

    def spellings(self, ids: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """A term's ids' other spellings that the model may write (Constraints.spellings)."""
        ...


class Terms:
    """A glossary's entries, compiled for matching; `pair`: the (source, target) languages it
    is for (None: a request's inline entries, for whatever its texts are in)."""

    def __init__(self, entries: Sequence[Entry], pair: tuple[str, str] | None = None) -> None:
        self.entries = tuple(entries)
        self.pair = pair
        self._exact = {e.source: e for e in entries if e.case_sensitive}
        self._folded = {e.source.casefold(): e for e in entries if not e.case_sensitive}
        # Longest first: at one starting character, the longest term matches.
        alternatives = sorted(
            ((regex.escape(e.source), e.case_sensitive) for e in entries),
            key=lambda pair: -len(pair[0]),
        )
        pattern = "|".join(term if exact else f"(?i:{term})" for term, exact in alternatives)
        self._pattern = regex.compile(rf"(?<!\w)(?:{pattern})(?!\w)")

    def matches(self, model: TermModel, sentences: Sequence[str]) -> list[tuple[Entry, ...]]:
        """Each sentence's matched entries, in order."""
        found: list[list[tuple[int, int, Entry]]] = []
        for sentence in sentences:
            own = []
            for match in self._pattern.finditer(sentence):
                text = match.group()
                entry = self._exact.get(text) or self._folded.get(text.casefold())
                if entry is not None:
                    own.append((match.start(), match.end(), entry))
            found.append(own)
        wanted = [i for i, own in enumerate(found) if own]
        spans = model.source_spans([sentences[i] for i in wanted]) if wanted else []
        result: list[tuple[Entry, ...]] = [() for _ in sentences]
        for i, tokens in zip(wanted, spans, strict=True):
            starts = {a for a, _ in tokens}
            ends = {b for _, b in tokens}
            result[i] = tuple(entry for a, b, entry in found[i] if a in starts and b in ends)
        return result


def check_spelling(model: TermModel, name: str, entries: Sequence[Entry]) -> None:
    """A ServiceError naming the first entry whose target term `model` (named `name`) cannot
    spell; a glossary is refused at creation, not at a translation."""
    for i, (entry, ids) in enumerate(
        zip(entries, model.target_ids([e.target for e in entries]), strict=True)
    ):
        if ids is None:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"entry {i} ({entry.source!r} -> {entry.target!r}): {name} cannot spell the "
                "target term (a character its vocabulary does not have)",
            )


def constraints(
    model: TermModel, matched: Sequence[Sequence[Entry]], rendering: Callable[[str], str]
) -> list[Constraints]:
    """Each sentence's constraints from its matched entries: every target term's ids, and to
    avoid, the model's own words for a source term (`rendering(source)`: its translation of the
    term alone) that are none of the target term's, so that it does not write "Fahrrad" for
    "bike" and the glossary's "Rad" beside it (`_own_words`). Where that translation already
    says the target term ("Dach eines Dachs." for roof -> Dach), the model's word is the
    glossary's and nothing is avoided: its other words are articles and inflections ("eines",
    "einem"), which avoided changed a sentence that had the term already."""
    words = sorted({e.target for own in matched for e in own})
    ids = dict(zip(words, model.target_ids(words), strict=True))
    # Each target term's spellings once, not once per sentence that has it.
    spellings = {word: model.spellings(found) for word, found in ids.items() if found}
    avoided: dict[Entry, frozenset[int]] = {}
    for entry in {e for own in matched for e in own}:
        wanted = {w.casefold() for w in _WORDS.findall(entry.target)}
        said = rendering(entry.source)
        if wanted <= {w.casefold() for w in _WORDS.findall(said)}:
            avoided[entry] = frozenset()
            continue
        others = [w for w in _own_words(said) if w.casefold() not in wanted]
        spelled = [own for own in model.target_ids(others) if own]
        avoided[entry] = frozenset(own[0] for own in spelled)
    result = []
    for entries in matched:
        terms = tuple(tuple(found) for e in entries if (found := ids[e.target]))
        kept = {t for term in terms for t in term}
        avoid = frozenset().union(*(avoided[e] for e in entries)) - kept
        written = tuple(spellings[e.target] for e in entries if ids[e.target])
        result.append(
            Constraints(terms, avoid, model.word_pieces, written) if terms else NO_CONSTRAINTS
        )
    return result


def _own_words(rendering: str) -> list[str]:
    """The words of a term's translation alone that translate the term: a lone term comes back
    as a phrase ("Ein Fahrrad."), so its first word (an article) and words of fewer than four
    letters (function words) are left out, unless it is one word. A word stands for its first
    token (the search avoids that token)."""
    found = _WORDS.findall(rendering)
    if len(found) == 1:
        return found
    return [w for w in found[1:] if len(w) >= 4]
