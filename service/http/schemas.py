"""The native API's request and response models (the OpenAPI schema at /openapi.json).

A decoding option is a field of `TranslateRequest` named as in `DecodingOptions`
(service/bundle/decoding.py): `TranslateRequest.decoding()` hands every such field the request
set to the runtime in one mapping, so a new option needs no code between here and the search.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.bundle.decoding import DecodingOptions
from service.errors import ErrorType
from service.glossaries import Entry

# The request fields that are decoding options.
OPTION_FIELDS = {field.name for field in dataclasses.fields(DecodingOptions)}


class GlossaryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    source: str = Field(description="the source term, matched by whole words")
    target: str = Field(description="its translation, which the output holds exactly once")
    case_sensitive: bool = Field(False, description="match the source term's case exactly")

    def entry(self) -> Entry:
        return Entry(self.source, self.target, self.case_sensitive)


class GlossaryRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "shop",
                    "source": "en",
                    "target": "de",
                    "entries": "checkout\tKasse\nbike\tRad",
                    "entries_format": "tsv",
                }
            ]
        },
    )

    name: str
    source: str = Field(description="source language code")
    target: str = Field(description="target language code")
    entries: list[GlossaryEntry] | str = Field(
        description="entries as objects, or as DeepL's TSV or CSV text (entries_format)"
    )
    entries_format: Literal["tsv", "csv"] = Field(
        "tsv", description="when entries is text: tsv (source<TAB>target) or csv (source,target)"
    )


class GlossaryOut(BaseModel):
    glossary_id: str
    name: str
    source: str
    target: str
    entry_count: int
    creation_time: str = Field(description="ISO 8601, UTC")


class GlossaryList(BaseModel):
    glossaries: list[GlossaryOut]


class GlossaryEntries(BaseModel):
    entries: list[GlossaryEntry]


class TranslateRequest(BaseModel):
    # Strict: "8" is not a beam size, true is not 1.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"text": "A dog runs.", "source": "en", "target": "de"}]},
    )

    text: str | list[str] = Field(description="a text or a list of texts; line breaks are kept")
    source: str = Field(
        description="source language code, e.g. en; auto: each text's language is detected on "
        "its own and picks its model (docs/api.md)"
    )
    target: str = Field(description="target language code, e.g. de")
    beam_size: int | None = Field(None, ge=1, description="1 is greedy; default from settings")
    num_hypotheses: int = Field(1, ge=1, description="n-best list size, at most beam_size")
    length_penalty: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False)
    max_decoding_length: int | None = Field(
        None, ge=1, description="tokens per sentence, capped by the model; default from settings"
    )
    no_repeat_ngram_size: int | None = Field(
        None,
        ge=0,
        description="no n-gram of this many tokens twice in a sentence's translation (0: off); "
        "default from settings",
    )
    return_scores: bool = False
    format: Literal["text", "html", "xml"] = Field(
        "text",
        description="html or xml: markup whose text is translated and whose inline elements "
        "are re-placed around the words they wrapped (docs/api.md)",
    )
    translate_attributes: bool = Field(
        False, description="html/xml: translate alt and title attributes too"
    )
    return_alignments: bool = Field(
        False, description="per sentence: source and target tokens and which align"
    )
    cache: bool = Field(
        True,
        description="false: every sentence is decoded for this request, neither answered from "
        "the translation cache or another request's decoding nor stored",
    )
    placeholders: bool = Field(
        True,
        description="placeholders (%s, {name}, {{x}}, ${x}, <0>...</0>, `code`), URLs and "
        "e-mail addresses come back byte for byte (docs/api.md)",
    )
    placeholder_patterns: list[str] = Field(
        [],
        max_length=16,
        description="more spans to keep as they are, as regular expressions",
    )
    glossary_id: str | None = Field(
        None, description="a glossary of this API key and language pair (POST /glossaries)"
    )
    glossary: list[GlossaryEntry] | None = Field(
        None, description="inline glossary entries, instead of a glossary_id"
    )

    def decoding(self) -> dict[str, Any]:
        """The decoding options this request set (None: the settings' default)."""
        return self.model_dump(include=OPTION_FIELDS, exclude_none=True)


class Alternative(BaseModel):
    text: str
    score: float | None = None


class SegmentInfo(BaseModel):
    # A "deadline" hypothesis never reaches an answer: its request got a 504.
    finish_reason: Literal["eos", "length"]
    score: float | None = None


class Token(BaseModel):
    text: str
    start: int = Field(description="its first character in the sentence")
    end: int = Field(description="after its last character")


class SentenceAlignmentOut(BaseModel):
    source: str = Field(description="the sentence as the model read it")
    target: str = Field(description="its translation")
    source_tokens: list[Token]
    target_tokens: list[Token]
    pairs: list[tuple[int, int]] = Field(description="(source token, target token) links")
    weights: list[list[float]] | None = Field(
        None,
        description="the attention the links were read from: one row per target token, one "
        "column per source token (a row sums to at most 1), to 3 decimals",
    )


class DetectedLanguage(BaseModel):
    language: str = Field(description="a served language's code; und: nothing to detect")
    confidence: float = Field(description="the detector's probability, 0-1")


class TranslationOut(BaseModel):
    text: str
    score: float | None = Field(None, description="when return_scores: mean sentence score")
    alternatives: list[Alternative] | None = Field(None, description="when num_hypotheses > 1")
    segments: list[SegmentInfo] = Field(description="one per sentence, in order")
    alignments: list[SentenceAlignmentOut] | None = Field(
        None, description="when return_alignments: one per sentence, in order"
    )
    detected_language: DetectedLanguage | None = Field(
        None, description="with source auto: the language detected in this text"
    )
    untranslated: Literal["source_is_target", "nothing_to_detect"] | None = Field(
        None,
        description="with source auto, why `text` is the text as sent: it is in the target "
        "language already, or has no letter to detect a language from (emoji, a URL, digits)",
    )


class TranslateResponse(BaseModel):
    model: str = Field(
        description="the model that translated; with source auto, each one that did, in the "
        "order of the texts, comma-separated (empty when none did)"
    )
    source: str
    target: str
    translations: list[TranslationOut] = Field(description="one per input text, in order")


class DetectRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"text": ["A dog runs.", "Ein Hund läuft."]}]},
    )

    text: str | list[str] = Field(description="a text or a list of texts")
    format: Literal["text", "html", "xml"] = Field(
        "text", description="html or xml: the language of the document's text is detected"
    )


class DetectResponse(BaseModel):
    detections: list[list[DetectedLanguage]] = Field(
        description="one list per input text, in order: the served languages it may be in, "
        "most likely first; empty when it has no letter or none of them is likely at all"
    )


class LanguagePair(BaseModel):
    source: str
    target: str
    model: str


class Status(BaseModel):
    status: str


class ModelStatus(BaseModel):
    name: str
    source: str = Field(description='its source language; "mul" for a multilingual model')
    sources: list[str] = Field(description="every source language it translates from")
    targets: list[str]
    device: Literal["cpu", "cuda"]
    provider: str = Field(description="ONNX Runtime's execution provider")
    dtype: str = Field(description="the bundle's precision: fp32, fp16 or int8")
    aligns: bool = Field(description="serves return_alignments and format html/xml")
    license: str | None = Field(
        description="the weights' license as the bundle records it; null: none recorded"
    )
    card: str | None = Field(
        description="the model card's URL (Markdown), relative to this one's, when the bundle "
        "carries a card"
    )
    queue_depth: int = Field(description="its segments waiting for a batch")


class Limits(BaseModel):
    """The settings a client needs to stay within (docs/configuration.md)."""

    max_texts: int
    max_characters: int
    max_segment_characters: int
    max_beam_size: int
    default_beam_size: int


class ServiceStatus(BaseModel):
    ready: bool = Field(description="what GET /ready answers")
    draining: bool = Field(description="shutting down: new translations get 503")
    api_key_required: bool
    language_detection: bool = Field(
        description="whether source 'auto' is served (it is: each text's language detected)"
    )
    queue_depth: int = Field(description="segments waiting for a batch, all models")
    in_flight: int = Field(description="translation requests accepted and not yet answered")
    requests_per_second: float = Field(
        description="translation requests answered per second over the last rate_window_s"
    )
    rate_window_s: int
    limits: Limits
    models: list[ModelStatus]


class ErrorDetail(BaseModel):
    type: ErrorType
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class LimitUsage(BaseModel):
    used: int = Field(description="requests or characters within the window")
    limit: int | None = Field(description="the key's limit; null: unlimited")
    window_s: int = Field(description="the window's length: 60, a day, 30 days")


class UsageResponse(BaseModel):
    name: str = Field(description="the key's name")
    requests_per_minute: LimitUsage | None = Field(
        description="null: the key has no such limit (its requests are not counted)"
    )
    characters_per_day: LimitUsage
    characters_per_month: LimitUsage
