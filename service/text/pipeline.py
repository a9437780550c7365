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

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.bundle.decoding import DecodingOptions, Hypothesis
from service.errors import ErrorType, ServiceError
from service.settings import Settings
from service.text import segment


class TextModel(Protocol):
    """What the pipeline needs of a model: its tokenizer and its limits."""

    source_language: str
    max_input_tokens: int  # per segment, </s> included

    def encode(self, texts: Sequence[str], target: str | None = None) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Prepared:
    """Texts ready for the model: each one's layout, and the token ids of every sentence, text
    after text (`origins[i]` is sentence i's (text index, sentence index))."""

    layouts: list[segment.Layout]
    sources: list[list[int]]
    origins: list[tuple[int, int]]

    def texts(self, start: int, stop: int) -> Prepared:
        """Texts `start` to `stop` (excluded) alone, as if prepared by themselves."""
        # origins are sorted: (t,) sorts before every (t, n).
        first, last = bisect_left(self.origins, (start,)), bisect_left(self.origins, (stop,))
        return Prepared(
            self.layouts[start:stop],
            self.sources[first:last],
            [(t - start, n) for t, n in self.origins[first:last]],
        )


@dataclass(frozen=True)
class TextTranslation:
    """One input text translated: its n-best texts (best first), their scores (mean of the
    segments' scores; None without segments), and each segment's best hypothesis."""

    texts: list[str]
    scores: Sequence[float | None]
    segments: list[Hypothesis]


def text_label(index: int) -> str:
    """How errors name a text of a request: by its index in the list."""
    return f"text {index}"


def prepare(
    model: TextModel,
    texts: Sequence[str],
    target: str | None,
    *,
    max_segment_characters: int,
    max_segments: int | None = None,
    label: Callable[[int], str] = text_label,
) -> Prepared:
    """Split, check and encode `texts` for `model`; a ServiceError names the first text (by
    `label(index)`) and sentence over a limit. `max_segments` bounds the sentences of all texts
    together (a request's), checked before anything is tokenized."""
    layouts = [segment.split(text, model.source_language) for text in texts]
    origins = [(t, n) for t, layout in enumerate(layouts) for n in range(len(layout.segments))]
    if max_segments is not None and len(origins) > max_segments:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            f"{len(origins)} sentences in one request; the limit is {max_segments} "
            "(max_queue_segments)",
        )
    for t, layout in enumerate(layouts):
        for n, sentence in enumerate(layout.segments):
            if len(sentence) > max_segment_characters:
                raise ServiceError(
                    ErrorType.INPUT_TOO_LONG,
                    f"{label(t)}, sentence {n}: {len(sentence)} characters, more than the "
                    f"limit of {max_segment_characters} (max_segment_characters); split it into "
                    "shorter sentences",
                )
    sources = model.encode([s for layout in layouts for s in layout.segments], target)
    limit = model.max_input_tokens
    for (t, n), ids in zip(origins, sources, strict=True):
        if len(ids) > limit:
            raise ServiceError(
                ErrorType.INPUT_TOO_LONG,
                f"{label(t)}, sentence {n}: {len(ids)} tokens, more than the model's limit of "
                f"{limit} tokens per sentence (</s> included); split it into shorter sentences",
            )
    return Prepared(layouts, sources, origins)


def assemble(
    model: TextModel, prepared: Prepared, nbest: Sequence[list[Hypothesis]], n: int
) -> list[TextTranslation]:
    """Each text's translation from its sentences' n-best lists (`nbest[i]` for sentence i).

    A text's k-th alternative joins each sentence's k-th hypothesis (its last if it has fewer).
    A text without sentences (empty or only whitespace) translates to ""."""
    per_text: list[list[list[Hypothesis]]] = [[] for _ in prepared.layouts]
    for (text, _), hypotheses in zip(prepared.origins, nbest, strict=True):
        per_text[text].append(hypotheses)
    return [
        _assemble(model, layout, own, n)
        for layout, own in zip(prepared.layouts, per_text, strict=True)
    ]


def _assemble(
    model: TextModel, layout: segment.Layout, nbest: list[list[Hypothesis]], n: int
) -> TextTranslation:
    if not layout.segments:
        return TextTranslation([""] * n, [None] * n, [])
    texts, scores = [], []
    for k in range(n):
        chosen = [hyps[min(k, len(hyps) - 1)] for hyps in nbest]
        texts.append(layout.join([model.decode(h.ids) for h in chosen]))
        scores.append(sum(h.score for h in chosen) / len(chosen))
    return TextTranslation(texts, scores, [hyps[0] for hyps in nbest])


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
        **{name: value for name, value in requested.items() if value is not None},
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
