"""What a text becomes before the model sees it, and after: one pipeline for both doors, the HTTP
routes (through service/scheduling/runtime.py) and the CLI (service/translate.py).

`prepare` splits every text into sentences (segment.py), refuses a sentence longer than
`max_segment_characters` before the tokenizer's work, encodes the sentences (with the target's
token for a multi-target model) and refuses one over the model's token limit: too long is an
error naming the text and sentence, never a silent truncation. `assemble` joins each text's
translated sentences around its original separators. `decoding_options` turns what a request
asked for into `DecodingOptions` over the settings' defaults.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from service.bundle.decoding import DecodingOptions, Hypothesis
from service.bundle.tokenizer import Span
from service.errors import ErrorType, ServiceError
from service.glossaries import Entry
from service.settings import Settings
from service.text import markup, segment
from service.text.alignment import TextAlignment, placed_whole, sentence_alignment
from service.text.markup import Format as MarkupFormat
from service.text.placeholders import Protection
from service.text.terms import TermModel, Terms

Format = Literal["text", MarkupFormat]


class TextModel(TermModel, Protocol):
    """What the pipeline needs of a model: its tokenizer, its limits, whether it aligns, and
    what matching a glossary's terms needs (TermModel)."""

    name: str
    source_language: str
    max_input_tokens: int  # per segment, </s> included
    aligns: bool  # hypotheses carry word alignments (markup and return_alignments need them)

    def encode(
        self, texts: Sequence[str], target: str | None = None, source: str | None = None
    ) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def target_spans(self, ids: Sequence[int]) -> list[Span]: ...


# The beam a request with terms gets at least (constrained beam search shares it out).
TERMS_BEAM = 4


@dataclass(frozen=True)
class Prepared:
    """Texts ready for the model. A plain text is one block; a markup document (`documents`)
    is the blocks of text its markup holds (service/text/markup.py), and so is a plain text
    with placeholders (`markup.protect`: its lines, placeholders out; None in `documents` for
    a plain text without any, one block as it is). Each block's layout, the
    input text it belongs to (`owners`, ascending), and the token ids of every sentence, block
    after block (`origins[i]` is sentence i's (block index, sentence index))."""

    layouts: list[segment.Layout]
    sources: list[list[int]]
    origins: list[tuple[int, int]]
    owners: list[int]
    documents: list[markup.Document | None] | None = None
    # Each sentence's glossary entries found in it (service/text/terms.py); [] without terms.
    matched: list[tuple[Entry, ...]] = field(default_factory=list)
    # Whether each sentence's word alignment is read (an element's edge or a kept thing inside
    # it: markup.edges); [] for none.
    aligned: list[bool] = field(default_factory=list)

    def decoding(self, options: DecodingOptions, terms_beam: int = TERMS_BEAM) -> DecodingOptions:
        """`options` as these texts need them: a document is rendered through the alignments of
        its sentences that have an element's edge or a placeholder inside them (`aligned`;
        `sentence_options` asks only those for it); sentences with terms are searched with a
        beam (`terms_beam` at least: constrained beam search shares its beams out among the
        terms' progress)."""
        if any(self.aligned):
            options = replace(options, alignments=True)
        if any(self.matched) and options.beam_size < terms_beam:
            options = replace(options, beam_size=terms_beam)
        return options

    def sentence_options(self, options: DecodingOptions, asked: bool) -> list[DecodingOptions]:
        """Each sentence's options, `options` from `decoding`: the alignment only for the
        sentences whose alignment is read (a step without it skips the aligner's nodes, a
        quarter of a beam step's time), or every one where the request `asked` for them."""
        unaligned = replace(options, alignments=asked)
        aligned = self.aligned or [False] * len(self.sources)
        return [options if a else unaligned for a in aligned]

    @property
    def count(self) -> int:
        """How many input texts."""
        return len(self.documents) if self.documents is not None else len(self.layouts)

    def texts(self, start: int, stop: int) -> Prepared:
        """Texts `start` to `stop` (excluded) alone, as if prepared by themselves."""
        first_block, last_block = bisect_left(self.owners, start), bisect_left(self.owners, stop)
        # origins are sorted: (b,) sorts before every (b, n).
        first = bisect_left(self.origins, (first_block,))
        last = bisect_left(self.origins, (last_block,))
        return Prepared(
            self.layouts[first_block:last_block],
            self.sources[first:last],
            [(b - first_block, n) for b, n in self.origins[first:last]],
            [t - start for t in self.owners[first_block:last_block]],
            None if self.documents is None else self.documents[start:stop],
            self.matched[first:last],
            self.aligned[first:last],
        )


@dataclass(frozen=True)
class TextTranslation:
    """One input text translated: its n-best texts (best first), their scores (mean of the
    segments' scores; None without segments), each segment's best hypothesis, and when asked
    for, the best text's word alignment (service/text/alignment.py)."""

    texts: list[str]
    scores: Sequence[float | None]
    segments: list[Hypothesis]
    alignment: TextAlignment | None = None
    # With the alignment, every alternative's (the first is `alignment`): what a plain text's
    # placeholders are placed back in each alternative by.
    projections: list[TextAlignment] = field(default_factory=list)


@dataclass(frozen=True)
class Form:
    """What a request's texts are and what comes back besides translations: plain text or
    markup (format), markup's alt/title translated or kept, word alignments or not; where
    segments end; the markup elements a request ignores, and where its runs end; and what is
    kept byte for byte (`protection`: placeholders.py; None: nothing, a URL and `%s` go to the
    model as words do)."""

    format: Format = "text"
    translate_attributes: bool = False
    alignments: bool = False
    splitting: segment.Splitting = "lines"  # where segments end (service/text/segment.py)
    tags: markup.Tags = markup.NO_TAGS  # a request's markup element lists (markup.Tags)
    protection: Protection | None = field(default_factory=Protection)

    @property
    def aligned(self) -> bool:
        """Whether its translations need their word alignments (markup places its tags by
        them)."""
        return self.format != "text" or self.alignments


PLAIN = Form()


def check_form(model: TextModel, form: Form, options: DecodingOptions) -> DecodingOptions:
    """Refuse, before any work, what this model cannot do in this form; else `options` as the
    form decodes them: the search keeps alignment rows only where a request asks for them
    (markup's sentences that need theirs are `Prepared.aligned`: a step without skips the
    aligner's nodes, a quarter of a beam step's time on the shipped model)."""
    if form.aligned and not model.aligns:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            f"{model.name} cannot align words (its bundle was exported before the decoder step "
            "had an alignment output), which format html/xml and return_alignments need; "
            "re-export it with `python -m export`",
        )
    if form.format != "text" and options.num_hypotheses > 1:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            f"format {form.format} has one translation per text: alternatives and "
            "num_hypotheses > 1 are for format text",
        )
    return replace(options, alignments=form.alignments)


def text_label(index: int) -> str:
    """How errors name a text of a request: by its index in the list."""
    return f"text {index}"


def prepare(
    model: TextModel,
    texts: Sequence[str],
    target: str | None,
    *,
    source: str | None = None,
    max_segment_characters: int,
    max_segments: int | None = None,
    label: Callable[[int], str] = text_label,
    format: Format = "text",
    translate_attributes: bool = False,
    splitting: segment.Splitting = "lines",
    tags: markup.Tags = markup.NO_TAGS,
    protection: Protection | None = None,
    terms: Terms | None = None,
) -> Prepared:
    """Parse (`format` "html" or "xml"), split, check and encode `texts` for `model`; a
    ServiceError names the first text (by `label(index)`) that cannot be parsed, or the text
    and sentence over a limit. `source`: the texts' language, for a model of several (None:
    the model's source_language). `max_segments` bounds the sentences of all texts together (a
    request's), checked before anything is tokenized. `translate_attributes`: markup's alt and
    title attributes are translated too. `splitting`: where segments end (segment.py);
    `tags`: the markup elements the request ignores, and where runs end (markup.Tags).
    `protection`: placeholders are kept out of the model's sentences (plain text, a model that
    aligns words: `markup.protect`; markup: with its URLs). `terms`: a glossary, matched in
    every sentence (Prepared.matched)."""
    documents: list[markup.Document | None] | None = None
    blocks: Sequence[str] = texts
    owners = list(range(len(texts)))
    if format != "text":
        documents = list(_parse(texts, format, translate_attributes, label, tags, protection))
    elif protection is not None and model.aligns:
        protected = [markup.protect(text, protection) for text in texts]
        if any(document is not None for document in protected):
            documents = protected
    if documents is not None:
        each = [[t] if d is None else d.blocks for t, d in zip(texts, documents, strict=True)]
        blocks = [block for own in each for block in own]
        owners = [t for t, own in enumerate(each) for _ in own]
    language = source or model.source_language
    layouts = [_layout(block, language, format, splitting) for block in blocks]
    encode = functools.partial(
        _encoded, model, owners=owners, target=target, source=source,
        max_segment_characters=max_segment_characters, max_segments=max_segments, label=label,
    )  # fmt: skip
    origins, numbers, sources = encode(layouts)
    limit = model.max_input_tokens
    # A sentence joined across hard-wrapped lines and over the model's limit (lower-case lines
    # of a list, Chinese lines): its block's lines each on their own, as unjoined.
    joined = {
        b
        for (b, n), ids in zip(origins, sources, strict=True)
        if len(ids) > limit and segment.wrapped(layouts[b].segments[n])
    }
    if joined:
        layouts = [
            _layout(block, language, format, splitting, wraps=False) if b in joined else layout
            for b, (block, layout) in enumerate(zip(blocks, layouts, strict=True))
        ]
        origins, numbers, sources = encode(layouts)
    for (b, _), number, ids in zip(origins, numbers, sources, strict=True):
        if len(ids) > limit:
            raise ServiceError(
                ErrorType.INPUT_TOO_LONG,
                f"{label(owners[b])}, sentence {number}: {len(ids)} tokens, more than the "
                f"model's limit of {limit} tokens per sentence (</s> included); split it into "
                "shorter sentences",
            )
    matched = []
    if terms is not None:
        matched = terms.matches(model, [s for layout in layouts for s in layout.inputs])
    aligned = []
    if documents is not None:
        edges = [e for d in documents for e in ([[]] if d is None else markup.edges(d))]
        spans = [layout.spans() for layout in layouts]
        aligned = [
            any(start < edge < end for edge in edges[b])
            for b, n in origins
            for start, end in (spans[b][n],)
        ]
    return Prepared(layouts, sources, origins, owners, documents, matched, aligned)


def _layout(
    block: str, language: str, format: Format, splitting: segment.Splitting, *, wraps: bool = True
) -> segment.Layout:
    """A block's sentences (segment.split). In plain text, a sentence with nothing for the
    model to read (not `markup.translatable`: emoji, numbers, punctuation or a URL alone) comes
    back as it is. A markup block keeps them as sentences: its tags are placed by their word
    alignments (its runs without a letter are no blocks at all, markup.py). A short block's
    layout is remembered (`_remembered`)."""
    if len(block) <= LAYOUT_MEMO_CHARACTERS:
        return _remembered(block, language, format, splitting, wraps)
    return _split(block, language, format, splitting, wraps)


def _split(
    block: str, language: str, format: Format, splitting: segment.Splitting, wraps: bool
) -> segment.Layout:
    layout = segment.split(block, language, wraps=wraps, splitting=splitting)
    return layout.keeping(markup.translatable) if format == "text" else layout


# The layouts of the short blocks split last (a Layout never changes): traffic repeats its
# paragraphs (a popular post, a help-centre page), and splitting one costs ~19 us, a repeat
# 0.3. Longer blocks (a document's) are split each time: at most ~6 MB are kept.
LAYOUT_MEMO = 2048
LAYOUT_MEMO_CHARACTERS = 1000
_remembered = functools.lru_cache(maxsize=LAYOUT_MEMO)(_split)


def _parse(
    texts: Sequence[str],
    format: MarkupFormat,
    translate_attributes: bool,
    label: Callable[[int], str],
    tags: markup.Tags = markup.NO_TAGS,
    protection: Protection | None = None,
) -> list[markup.Document]:
    """Each text parsed as a document; a ServiceError names the first that cannot be."""
    documents = []
    for t, text in enumerate(texts):
        try:
            documents.append(
                markup.parse(
                    text,
                    format,
                    translate_attributes=translate_attributes,
                    tags=tags,
                    protection=protection,
                )
            )
        except markup.MarkupError as e:
            raise ServiceError(ErrorType.INVALID_REQUEST, f"{label(t)}: {e}") from e
    return documents


def detectable(
    texts: Sequence[str], format: Format, tags: markup.Tags = markup.NO_TAGS
) -> list[str]:
    """What language detection reads of each text: the words the model would see, without
    URLs, e-mail addresses, @mentions and #hashtags (a document's blocks, one per line,
    without the elements `tags` ignores)."""
    if format == "text":
        return [markup.without_items(text) for text in texts]
    documents = _parse(texts, format, False, text_label, tags)
    return ["\n".join(d.blocks) for d in documents]


def _encoded(
    model: TextModel,
    layouts: list[segment.Layout],
    *,
    owners: list[int],
    target: str | None,
    source: str | None,
    max_segment_characters: int,
    max_segments: int | None,
    label: Callable[[int], str],
) -> tuple[list[tuple[int, int]], list[int], list[list[int]]]:
    """Each sentence's (block, index), its number within its input text, and its ids, after
    the limits that come before tokenizing (`prepare`)."""
    origins = [(b, n) for b, layout in enumerate(layouts) for n in range(len(layout.segments))]
    if max_segments is not None and len(origins) > max_segments:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            f"{len(origins)} sentences in one request; the limit is {max_segments} "
            "(max_queue_segments)",
        )
    # Sentences are counted per input text, across its blocks.
    numbers = []  # each sentence's number within its input text, across the text's blocks
    counts: dict[int, int] = {}
    for b, _ in origins:
        numbers.append(counts.get(owners[b], 0))
        counts[owners[b]] = numbers[-1] + 1
    for (b, n), number in zip(origins, numbers, strict=True):
        sentence = layouts[b].segments[n]
        if len(sentence) > max_segment_characters:
            raise ServiceError(
                ErrorType.INPUT_TOO_LONG,
                f"{label(owners[b])}, sentence {number}: {len(sentence)} characters, more than "
                f"the limit of {max_segment_characters} (max_segment_characters); split it "
                "into shorter sentences",
            )
    sources = model.encode([s for layout in layouts for s in layout.inputs], target, source)
    return origins, numbers, sources


def assemble(
    model: TextModel,
    prepared: Prepared,
    nbest: Sequence[list[Hypothesis]],
    n: int,
    *,
    alignments: bool = False,
) -> list[TextTranslation]:
    """Each text's translation from its sentences' n-best lists (`nbest[i]` for sentence i).

    A text's k-th alternative joins each sentence's k-th hypothesis (its last if it has fewer).
    A text without sentences translates to "" when it is empty, or only whitespace, control
    and format characters, else to itself (emoji, digits, a URL: nothing to translate). With
    `alignments`, the best translation's word alignment comes along (the hypotheses must carry
    theirs). A document is rendered from its blocks' translations, its inline elements and
    placeholders re-placed through their alignments (a markup document has one translation;
    a plain text's n alternatives are each rendered through its own)."""
    per_block: list[list[list[Hypothesis]]] = [[] for _ in prepared.layouts]
    # Whether each sentence's alignment is read: a hypothesis without one is placed whole.
    read: list[list[bool]] = [[] for _ in prepared.layouts]
    aligned = prepared.aligned if prepared.aligned and not alignments else None
    for i, ((block, _), hypotheses) in enumerate(zip(prepared.origins, nbest, strict=True)):
        per_block[block].append(hypotheses)
        read[block].append(True if aligned is None else aligned[i])
    documents = prepared.documents
    translated = [
        _assemble(model, layout, own, n, alignments or documents is not None, reads)
        for layout, own, reads in zip(prepared.layouts, per_block, read, strict=True)
    ]
    if documents is None:
        return translated
    if n != 1 and any(d is not None and d.format != "text" for d in documents):
        raise ValueError("a markup document has one translation")
    by_document: list[list[TextTranslation]] = [[] for _ in documents]
    for owner, translation in zip(prepared.owners, translated, strict=True):
        by_document[owner].append(translation)
    return [
        _document(document, blocks, n, alignments)
        if document is not None
        else blocks[0]
        if alignments
        else replace(blocks[0], alignment=None, projections=[])
        for document, blocks in zip(documents, by_document, strict=True)
    ]


def _document(
    document: markup.Document, blocks: list[TextTranslation], n: int, alignments: bool
) -> TextTranslation:
    """A document's n translations from its blocks': rendered, scored by its sentences'
    mean; its alignment, when asked for, is its blocks' sentences (placed within their
    blocks)."""
    texts = [
        markup.render(document, [(block.texts[k], _projection(block, k)) for block in blocks])
        for k in range(n)
    ]
    segments = [h for block in blocks for h in block.segments]
    scores: list[float | None] = [
        sum(h.score for h in segments) / len(segments) if segments else None
    ]
    for k in range(1, n):  # an alternative: its blocks' mean
        scored = [s for block in blocks if (s := block.scores[k]) is not None]
        scores.append(sum(scored) / len(scored) if scored else None)
    alignment = None
    if alignments:
        alignment = TextAlignment([s for block in blocks for s in _projection(block).sentences])
    return TextTranslation(texts, scores, segments, alignment)


def _projection(block: TextTranslation, k: int = 0) -> TextAlignment:
    """The alignment of a block's k-th translation."""
    alignment = block.projections[k] if k else block.alignment
    if alignment is None:
        raise ValueError("a document's block is translated with its alignment")
    return alignment


def _assemble(
    model: TextModel,
    layout: segment.Layout,
    nbest: list[list[Hypothesis]],
    n: int,
    alignments: bool,
    read: list[bool],
) -> TextTranslation:
    if not layout.segments:
        # Nothing the model reads: "" for whitespace and format characters alone, else (emoji,
        # digits, a URL alone: `_layout`) the text as it was sent.
        kept = layout.join([])
        text = kept if segment.VISIBLE.search(kept) else ""
        alignment = TextAlignment([]) if alignments else None
        return TextTranslation(
            [text] * n, [None] * n, [], alignment, [] if alignment is None else [alignment] * n
        )
    texts, scores, projections = [], [], []
    for k in range(n):
        chosen = [hyps[min(k, len(hyps) - 1)] for hyps in nbest]
        translations = layout.rewrap([model.decode(h.ids) for h in chosen])
        texts.append(layout.join([t.text for t in translations]))
        scores.append(sum(h.score for h in chosen) / len(chosen))
        if alignments:
            projections.append(_text_alignment(model, layout, chosen, translations, read))
    segments = [hyps[0] for hyps in nbest]
    alignment = projections[0] if projections else None
    return TextTranslation(texts, scores, segments, alignment, projections)


def _text_alignment(
    model: TextModel,
    layout: segment.Layout,
    hypotheses: list[Hypothesis],
    translations: list[segment.Rewrapped],
    read: list[bool],
) -> TextAlignment:
    """The word alignment of a text's best translation: each sentence's, placed where the
    sentence is in the text and in the translation (both keep the text's separators, and a
    hard-wrapped sentence's line breaks). A sentence whose alignment is not `read` may come
    without one: it is placed whole (alignment.placed_whole, by its words: no tokenizer)."""
    whole = [
        h.alignment is None and bool(h.ids) and not reads
        for h, reads in zip(hypotheses, read, strict=True)
    ]
    read_out = [s for s, w in zip(layout.inputs, whole, strict=True) if not w]
    source_spans = iter(model.source_spans(read_out))
    sentences = []
    source_at = target_at = len(layout.separators[0])
    for source, target, hypothesis, separator, placed in zip(
        layout.segments, translations, hypotheses, layout.separators[1:], whole, strict=True
    ):
        if placed:
            aligned = placed_whole(source, target.text)
        else:
            spans = next(source_spans)
            target_spans = [
                (target.position(a, starts=True), target.position(b))
                for a, b in model.target_spans(hypothesis.ids)
            ]
            weights = hypothesis.alignment
            if weights is None:  # a sentence of no tokens (nothing()), or a model without them
                if hypothesis.ids:
                    raise ValueError("the hypotheses carry no alignment (a bundle exported before)")
                weights = np.zeros((0, len(spans) + 1), np.float32)
            aligned = sentence_alignment(source, target.text, spans, target_spans, weights)
        sentences.append((source_at, target_at, aligned))
        source_at += len(source) + len(separator)
        target_at += len(target.text) + len(separator)
    return TextAlignment(sentences)


def decoding_options(
    settings: Settings, requested: Mapping[str, Any], *, max_input_tokens: int
) -> DecodingOptions:
    """`DecodingOptions` from the fields a request set (`requested`, by their DecodingOptions
    names; None: not set) over the settings' defaults, validated, and within the model's
    limit (`DecodingOptions.within`)."""
    fields = {
        "beam_size": settings.default_beam_size,
        "length_penalty": settings.default_length_penalty,
        "max_decoding_length": settings.default_max_decoding_length,
        "no_repeat_ngram_size": settings.default_no_repeat_ngram_size,
        **{name: value for name, value in requested.items() if value is not None},
        # Not the request's to choose: it may ask for fewer tokens, never for more.
        "max_length_a": settings.max_length_a,
        "max_length_b": settings.max_length_b,
    }
    try:
        options = DecodingOptions(**fields)
    except (TypeError, ValueError) as e:
        raise ServiceError(ErrorType.INVALID_REQUEST, str(e)) from e
    if options.beam_size > settings.max_beam_size:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            f"beam_size {options.beam_size} is larger than the limit of "
            f"{settings.max_beam_size} (max_beam_size)",
        )
    return options.within(max_input_tokens)
