"""Word alignments from the model: which target words translate which source words.

The decoder step's `alignment` output (service/bundle/manifest.py) gives every target token the
search chose a row of weights over the source (the engine picks the row: the step that chose
the token, or for an aligner the step that read it): a dedicated alignment query trained alone
on a word aligner's links (the shipped model's), a head trained by guided alignment, or a
layer's heads averaged. `links`
turns such a matrix into token links, `SentenceAlignment` keeps them with the tokens'
characters, and `TextAlignment` joins a text's sentences into one character map that markup
(service/text/markup.py) re-places inline tags through: `span` for a tag's words, `point` for
what sits between words (an opaque link, a mention, an empty element).

Links are read from the source side: each source token is linked to the target token that
attends to it most. Every source word then has a partner, so a tag always lands somewhere, and a
target word the source does not account for (an article German adds) is linked only if it is
some source token's best: on test2016 this placed tags on eflomal's span more often than the
target side's argmax, their union, their intersection or grow-diag-final-and of the two. A word
(a token with a letter or digit) is linked to a word, never to punctuation alone, when the
translation has one: the row that reads a sentence's last word often looks back at it, and
"bike" would otherwise go to the full stop after "Fahrrad", leaving a tag around "bike" on no
word (`lexical_only`; on val, 89.0 -> 90.3 % of spans exact: benchmarks/RESULTS.md). A link
is strong when its attention is at least STRONG, and lexical when its source token has a letter
or digit: a tag's span is read from its words' strong lexical links when they have any, then
from their lexical ones, then strong, then all. A weakly attended function word does not
stretch a tag, nor does the full stop inside "<b>people.</b>", whose partner ends the
translation (benchmarks/RESULTS.md, issue 29).

A link joins words: each token widened to its whitespace word, less the punctuation at the
word's edges. Where a tag's edge or a point falls inside a source word (a footnote in
"park.<sup>[1]</sup>", links in "<a>Home</a>|<a>About</a>", a URL taken out of "(https://...)"),
that word's links join pieces instead: each token widened to its run of letters and digits, a
token of punctuation alone staying itself, on both sides (the tag takes "1", not "park.[1"; a
subword token still brings its whole run, "Start" its "Startseite"). An edge inside a run of
letters ("<b>man</b><i>woman</i>") still reads the whole run.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from service.bundle.tokenizer import Span

_WORD = re.compile(r"\S+")
_RUN = re.compile(r"\w+")  # a word's piece between its punctuation ("park.[1]": park, 1)
_LEXICAL = re.compile(r"\w")
_CORE = re.compile(r"\w(?:.*\w)?", re.DOTALL)  # a word from its first letter or digit to its last
_TOKEN = re.compile(r"\w+|[^\w\s]")  # placed_whole's tokens: a word, or a punctuation character


# A link whose attention is below this is weak: a tag's span is read from its words' strong links
# first (chosen on val for the shipped model's aligner: benchmarks/RESULTS.md, issue 29).
STRONG = 0.25


def lexical_only(
    weights: npt.NDArray[np.float32], source: str, target: str, source_tokens: list[Span],
    target_tokens: list[Span],
) -> npt.NDArray[np.float32]:  # fmt: skip
    """`weights` (target tokens, source tokens) with no attention between a lexical source
    token and a target token of punctuation alone (module docstring), when the target has a
    lexical token: what `links` and `strong` read."""
    target_lexical = np.array([_lexical(target, span) for span in target_tokens], bool)
    if not target_lexical.any():
        return weights
    source_lexical = np.array([_lexical(source, span) for span in source_tokens], bool)
    masked = weights.copy()
    masked[np.ix_(~target_lexical, source_lexical)] = 0.0
    return masked


def links(weights: npt.NDArray[np.float32]) -> list[tuple[int, int]]:
    """(source token, target token) links of an alignment matrix (target tokens, source
    tokens): each source token's most attending target token (module docstring), in order."""
    if weights.size == 0:
        return []
    return [(s, int(t)) for s, t in enumerate(weights.argmax(axis=0))]


def strong(weights: npt.NDArray[np.float32]) -> list[bool]:
    """Whether each source token's link (`links`) is strong: its target attends to it with at
    least STRONG."""
    if weights.size == 0:
        return []
    return [bool(w >= STRONG) for w in weights.max(axis=0)]


@dataclass(frozen=True)
class SentenceAlignment:
    """One sentence and its translation: each token's characters in its own text, and the
    (source token, target token) links."""

    source: str
    target: str
    source_tokens: list[Span]
    target_tokens: list[Span]
    pairs: list[tuple[int, int]]
    strong: list[bool]  # per pair: whether the attention behind it is at least STRONG
    # The (target tokens, source tokens) attention the links were read from (`lexical_only`
    # keeps words off punctuation first); None when the links were made another way (tests).
    # return_alignments answers it for a heatmap.
    weights: npt.NDArray[np.float32] | None = field(default=None, compare=False)

    def words(self) -> list[tuple[Span, Span, bool, bool]]:
        """The links as (source word, target word) character spans, their strength, and
        whether the source token is lexical (has a letter or digit): each token widened to the
        whitespace word around it, less the punctuation at the word's edges (a token of
        punctuation alone stays itself)."""
        source_words = _words(self.source, self.source_tokens, {s for s, _ in self.pairs})
        target_words = _words(self.target, self.target_tokens, {t for _, t in self.pairs})
        return [
            (source_words[s], target_words[t], strong, _lexical(self.source, self.source_tokens[s]))
            for (s, t), strong in zip(self.pairs, self.strong, strict=True)
        ]

    def pieces(self) -> list[tuple[Span, Span]]:
        """The links as (source piece, target piece) character spans: each token widened to
        the run of letters and digits it starts in (a token of punctuation stays itself), what
        `TextAlignment` reads of a word that an element's edge cuts."""
        source_pieces = _words(self.source, self.source_tokens, {s for s, _ in self.pairs}, _RUN)
        target_pieces = _words(self.target, self.target_tokens, {t for _, t in self.pairs}, _RUN)
        return [(source_pieces[s], target_pieces[t]) for s, t in self.pairs]


@dataclass(frozen=True, slots=True)
class _Link:
    """A link placed in the whole texts: its source and target words (`words`), and pieces
    (`pieces`)."""

    source_word: Span
    target_word: Span
    source_piece: Span
    target_piece: Span

    def at(self, *edges: int) -> tuple[Span, Span]:
        """(source, target) as a query with these edges reads it: the words, or the pieces
        where an edge falls inside the source word (module docstring)."""
        a, b = self.source_word
        if any(a < edge < b for edge in edges):
            return self.source_piece, self.target_piece
        return self.source_word, self.target_word


class TextAlignment:
    """A text's sentences placed in it and in its translation: (source start, target start,
    sentence) for each, in order; every sentence's links, shifted into the whole texts, are
    what `span` and `point` read (markup's Projection)."""

    def __init__(self, sentences: list[tuple[int, int, SentenceAlignment]]) -> None:
        self.sentences = sentences
        links = [
            (
                _Link((s0 + a, s0 + b), (t0 + c, t0 + d), (s0 + e, s0 + f), (t0 + g, t0 + h)),
                strong,
                lexical,
            )
            for s0, t0, sentence in sentences
            for ((a, b), (c, d), strong, lexical), ((e, f), (g, h)) in zip(
                sentence.words(), sentence.pieces(), strict=True
            )
        ]
        self._links = [link for link, _, _ in links]
        # What `span` reads, in order: strong lexical links, lexical, strong, all.
        self._span_pools: list[list[_Link]] = [
            [link for link, strong, lexical in links if strong and lexical],
            [link for link, _, lexical in links if lexical],
            [link for link, strong, _ in links if strong],
            self._links,
        ]

    def span(self, start: int, end: int) -> Span | None:
        """The smallest target span covering every target word linked to a source word that
        overlaps characters [start, end) (piece by piece, where start or end falls inside the
        word: `_Link.at`), from the first of these that has any there: strong lexical
        links, lexical, strong, all (module docstring); None when none is linked."""
        for pool in self._span_pools:
            read = (link.at(start, end) for link in pool)
            targets = [t for s, t in read if s[0] < end and start < s[1]]
            if targets:
                return min(a for a, _ in targets), max(b for _, b in targets)
        return None

    def point(self, position: int) -> int:
        """Where something at source character `position` goes: at the start of a sentence
        after the first, at the start of its translation; after a sentence that ends with
        punctuation (and before the next), at the end of its translation, the punctuation
        before it (the target of the word before would put it before the punctuation: "Gras
        {x}. Eine" for "grass. {x}A"); else after the target of the last linked source word
        that ends at or before it, or, with none before it, before the target of the first one
        after it (piece by piece inside a word: `_Link.at`); at the start of the text when
        nothing is linked."""
        for k, (source_at, target_at, sentence) in enumerate(self.sentences):
            if k and position == source_at:
                return target_at
            following = self.sentences[k + 1][0] if k + 1 < len(self.sentences) else math.inf
            end = source_at + len(sentence.source)
            if end <= position < following and not sentence.source[-1:].isalnum():
                return target_at + len(sentence.target)
        links = [link.at(position) for link in self._links]
        before = [s[1] for s, _ in links if s[1] <= position]
        if before:
            last = max(before)
            return max(t[1] for s, t in links if s[1] == last)
        after = [(s[0], t[0]) for s, t in links if s[0] >= position]
        if after:
            first = min(s for s, _ in after)
            return min(t for s, t in after if s == first)
        return 0


def sentence_alignment(
    source: str,
    target: str,
    source_tokens: list[Span],
    target_tokens: list[Span],
    weights: npt.NDArray[np.float32],
) -> SentenceAlignment:
    """A sentence's alignment from its hypothesis's alignment rows (one per target token,
    one column per source id: the target's token first for a multi-target model, then the
    source tokens, then </s>); the columns of the target's token and </s> are dropped."""
    prefix = weights.shape[1] - len(source_tokens) - 1
    matrix = weights[: len(target_tokens), prefix : prefix + len(source_tokens)]
    read = lexical_only(matrix, source, target, source_tokens, target_tokens)
    return SentenceAlignment(
        source, target, source_tokens, target_tokens, links(read), strong(read), matrix
    )


def placed_whole(source: str, target: str) -> SentenceAlignment:
    """A sentence placed whole, without its word alignment: its first and last tokens (a word,
    or a punctuation character), and its first and last words, linked to its translation's.
    What markup reads of a sentence that no element's edge or kept thing is inside
    (pipeline.Prepared.aligned): where it starts and ends in the translation (after its final
    punctuation), and the translation's span for an element around all of it (its words: the
    lexical links come first)."""
    source_tokens, target_tokens = _tokens(source), _tokens(target)

    def ends(text: str, tokens: list[Span]) -> list[int]:
        lexical = [i for i, span in enumerate(tokens) if _lexical(text, span)]
        chosen = lexical or list(range(len(tokens)))
        return [0, chosen[0], chosen[-1], len(tokens) - 1]

    pairs: list[tuple[int, int]] = []
    if source_tokens and target_tokens:
        linked = zip(ends(source, source_tokens), ends(target, target_tokens), strict=True)
        pairs = sorted(set(linked))
    return SentenceAlignment(
        source, target, source_tokens, target_tokens, pairs, [True] * len(pairs)
    )


def _tokens(text: str) -> list[Span]:
    """A text's words and punctuation characters, as spans."""
    return [match.span() for match in _TOKEN.finditer(text)]


def _lexical(text: str, span: Span) -> bool:
    """Whether a token's characters hold a letter or digit."""
    return _LEXICAL.search(text, *span) is not None


def _words(
    text: str, tokens: list[Span], linked: set[int], words: re.Pattern[str] = _WORD
) -> dict[int, Span]:
    """The word of each token of `linked` (a match of `words`: a whitespace word, or for
    `pieces` a run of letters and digits), from its first letter or digit to its last (less the
    punctuation at its edges); a token of that edge punctuation stays itself, and a word with no
    letter or digit stays whole. Only the linked tokens: a sentence placed whole links four."""
    matches = list(words.finditer(text))
    starts = [match.start() for match in matches]
    spans = {}
    for k in linked:
        start, end = tokens[k]
        i = bisect_right(starts, start) - 1
        if start < end and i >= 0 and start < matches[i].end():
            a, b = (_CORE.search(text, *matches[i].span()) or matches[i]).span()
            if a <= start < b:
                spans[k] = (a, b)
                continue
        spans[k] = (start, end)
    return spans
