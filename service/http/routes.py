"""The native HTTP routes: /translate, /detect, /languages, /health, /ready, /metrics, /status
and the model cards (their request and response models are in schemas.py). The runtime they
call is service/scheduling/runtime.py; the LibreTranslate surface is
service/http/libretranslate.py."""

from __future__ import annotations

import math
import time
import urllib.parse
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.bundle.decoding import FinishReason
from service.errors import ErrorType, ServiceError
from service.glossaries import owner_of
from service.http.middleware import (
    KEYED,
    Caller,
    RuntimeDep,
    caller_of,
    protection,
    read_json,
    unless_disconnected,
    validate,
)
from service.http.schemas import (
    Alternative,
    DetectedLanguage,
    DetectRequest,
    DetectResponse,
    ErrorBody,
    LanguagePair,
    Limits,
    LimitUsage,
    ModelStatus,
    SegmentInfo,
    SentenceAlignmentOut,
    ServiceStatus,
    Status,
    Token,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
    UsageResponse,
)
from service.keys.access import Count
from service.metrics import Metrics
from service.scheduling.runtime import AUTO, DetectedTranslation, Runtime, TranslationModel
from service.text.alignment import TextAlignment
from service.text.detect import Candidate
from service.text.pipeline import Form, TextTranslation

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 413, 422, 429, 500, 503, 504)
}

router = APIRouter()


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=_ERRORS,
    # The key is checked before the body is read: the body is parsed here, not by FastAPI.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
        },
        **KEYED,
    },
)
async def translate(request: Request) -> TranslateResponse:
    """Translate one text or a list of texts; the answer keeps the input's order and layout."""
    caller = await caller_of(request)
    runtime = caller.runtime
    deadline = time.monotonic() + runtime.settings.request_timeout_s
    body = validate(TranslateRequest, await read_json(request))
    texts = [body.text] if isinstance(body.text, str) else body.text
    form = Form(
        body.format, body.translate_attributes, body.return_alignments, protection=protection(body)
    )
    inline = None if body.glossary is None else [e.entry() for e in body.glossary]
    characters = sum(len(text) for text in texts)
    with runtime.accept():
        if body.source != AUTO:
            runtime.model(body.source, body.target)  # an unknown pair before the glossary
        terms = await runtime.terms(
            owner_of(caller.key), (body.source, body.target), body.glossary_id, inline
        )
        if body.source == AUTO:
            _check_count(runtime, len(texts))
            await runtime.access.charge(caller.stored, characters)
            detecting = runtime.translate_detected(
                texts,
                body.target,
                body.decoding(),
                deadline=deadline,
                form=form,
                terms=terms,
                cache=body.cache,
            )
            detected = await unless_disconnected(request, detecting)
            return TranslateResponse(
                model=", ".join(dict.fromkeys(d.model for d in detected if d.model)),
                source=AUTO,
                target=body.target,
                translations=[_translation_out(d.translation, body, d) for d in detected],
            )
        model = runtime.model(body.source, body.target)
        _check_count(runtime, len(texts))
        pair = (body.source, body.target)
        options = runtime.decoding_options(pair, body.decoding())
        await runtime.access.charge(caller.stored, characters)
        work = runtime.translate(
            texts, pair, options, deadline=deadline, form=form, terms=terms, cache=body.cache
        )
        results = await unless_disconnected(request, work)
    return TranslateResponse(
        model=model.name,
        source=body.source,
        target=body.target,
        translations=[_translation_out(r, body) for r in results],
    )


@router.post(
    "/detect",
    response_model=DetectResponse,
    responses=_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": DetectRequest.model_json_schema()}},
        }
    },
)
async def detect(request: Request, caller: Caller) -> DetectResponse:
    """The languages each text may be in, among those served, most likely first."""
    runtime = caller.runtime
    body = validate(DetectRequest, await read_json(request))
    texts = [body.text] if isinstance(body.text, str) else body.text
    with runtime.accept():
        _check_count(runtime, len(texts))
        await runtime.access.charge(caller.stored, 0)  # a request; no characters translated
        found = await runtime.detect(texts, body.format)
    return DetectResponse(detections=[[_detected(c) for c in f or []] for f in found])


def _detected(candidate: Candidate) -> DetectedLanguage:
    return DetectedLanguage(language=candidate.language, confidence=round(candidate.confidence, 4))


def _translation_out(
    result: TextTranslation, body: TranslateRequest, detected: DetectedTranslation | None = None
) -> TranslationOut:
    """Scores only when asked for, alternatives only when more than one hypothesis was; with
    source auto, the language detected and whether the text came back as sent."""

    def score(value: float | None) -> float | None:
        return _finite(value) if body.return_scores else None

    alternatives = [
        Alternative(text=text, score=score(value))
        for text, value in zip(result.texts[1:], result.scores[1:], strict=True)
    ]
    return TranslationOut(
        text=result.texts[0],
        score=score(result.scores[0]),
        alternatives=alternatives if body.num_hypotheses > 1 else None,
        segments=[
            SegmentInfo(finish_reason=_answered(h.finish_reason), score=score(h.score))
            for h in result.segments
        ],
        alignments=None if result.alignment is None else _alignments(result.alignment),
        detected_language=None if detected is None else _detected(detected.detected),
        untranslated=None if detected is None else detected.untranslated,
    )


def _answered(reason: FinishReason) -> Literal["eos", "length"]:
    """A sentence's finish reason in an answer: a "deadline" one failed its request (504)."""
    if reason == "deadline":
        raise AssertionError("a sentence stopped at its deadline reached an answer")
    return reason


def _alignments(alignment: TextAlignment) -> list[SentenceAlignmentOut]:
    def tokens(text: str, spans: list[tuple[int, int]]) -> list[Token]:
        return [Token(text=text[a:b], start=a, end=b) for a, b in spans]

    return [
        SentenceAlignmentOut(
            source=sentence.source,
            target=sentence.target,
            source_tokens=tokens(sentence.source, sentence.source_tokens),
            target_tokens=tokens(sentence.target, sentence.target_tokens),
            pairs=sentence.pairs,
            weights=None if sentence.weights is None else _rounded(sentence.weights),
        )
        for _, _, sentence in alignment.sentences
    ]


def _rounded(weights: npt.NDArray[np.float32]) -> list[list[float]]:
    """Three decimals: a heatmap's worth, at a fraction of float32's digits in JSON."""
    rounded: list[list[float]] = np.round(weights.astype(np.float64), 3).tolist()
    return rounded


def _check_count(runtime: Runtime, count: int) -> None:
    limit = runtime.settings.max_texts
    if count > limit:
        raise ServiceError(
            ErrorType.INVALID_REQUEST, f"{count} texts in one request; the limit is {limit}"
        )


@router.get(
    "/usage",
    response_model=UsageResponse,
    responses={status: {"model": ErrorBody} for status in (401, 404, 503)},
)
async def usage(caller: Caller) -> UsageResponse:
    """The calling key's use of its limits, counted in every replica (a key of the key store;
    docs/api.md)."""
    if caller.stored is None:
        raise ServiceError(
            ErrorType.NOT_FOUND,
            "usage is counted for the keys of the key store (python -m service.keys); this "
            "request's key has no limits",
        )
    used = await caller.runtime.access.quotas.usage(caller.stored)
    return UsageResponse(
        name=used.name,
        requests_per_minute=None
        if used.requests_per_minute is None
        else _limit_usage(used.requests_per_minute),
        characters_per_day=_limit_usage(used.characters_per_day),
        characters_per_month=_limit_usage(used.characters_per_month),
    )


def _limit_usage(count: Count) -> LimitUsage:
    return LimitUsage(used=count.used, limit=count.limit, window_s=count.window_s)


@router.get("/languages", response_model=list[LanguagePair])
async def languages(runtime: RuntimeDep) -> list[LanguagePair]:
    """The language pairs served, one model each."""
    return [LanguagePair(source=s, target=t, model=m.name) for (s, t), m in runtime.models.items()]


@router.get("/health", response_model=Status, responses={503: {"model": ErrorBody}})
async def health(request: Request) -> Status:
    """The process answers (liveness), unless a batcher's worker stopped (a bug, logged): then
    nothing answers its model's requests until a restart, which the probe asks for."""
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is not None and runtime.broken:
        raise ServiceError(ErrorType.UNAVAILABLE, "a translation worker stopped; restart")
    return Status(status="ok")


@router.get("/ready", response_model=Status, responses={503: {"model": ErrorBody}})
async def ready(request: Request) -> Status:
    """Models loaded, warm-up translation done, batchers running, not shutting down."""
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None or not runtime.ready:
        reason = "shutting down" if runtime is not None and runtime.draining else "not ready"
        raise ServiceError(ErrorType.UNAVAILABLE, reason)
    return Status(status="ready")


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    registry: Metrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/status", response_model=ServiceStatus)
async def status(runtime: RuntimeDep) -> ServiceStatus:
    """The models and how busy the service is: what the web page's status panel shows, in one
    call (no key needed, as for /metrics, which tells the same)."""
    settings = runtime.settings
    models = {model.name: model for model in runtime.models.values()}  # one per name, in order
    depths = {name: batcher.depth for name, batcher in runtime.batchers.items()}
    return ServiceStatus(
        ready=runtime.ready,
        draining=runtime.draining,
        api_key_required=runtime.access.required,
        language_detection=True,
        queue_depth=sum(depths.values()),
        in_flight=runtime.in_flight,
        requests_per_second=round(runtime.request_rate.per_second(), 3),
        rate_window_s=runtime.request_rate.window_s,
        limits=Limits(
            max_texts=settings.max_texts,
            max_characters=settings.max_characters,
            max_segment_characters=settings.max_segment_characters,
            max_beam_size=settings.max_beam_size,
            default_beam_size=settings.default_beam_size,
        ),
        models=[_model_status(model, depths[name]) for name, model in models.items()],
    )


def _model_status(model: TranslationModel, depth: int) -> ModelStatus:
    # Relative to /status's own URL, so that it resolves under a proxy's path prefix too.
    card = f"models/{urllib.parse.quote(model.name, safe='')}/card"
    return ModelStatus(
        name=model.name,
        source=model.source_language,
        sources=list(model.source_languages),
        targets=list(model.target_languages),
        device=model.device,
        provider=model.provider,
        dtype=model.dtype,
        aligns=model.aligns,
        license=model.license,
        card=card if model.card is not None else None,
        queue_depth=depth,
    )


@router.get(
    "/models/{name}/card",
    response_class=Response,
    responses={200: {"content": {"text/markdown": {}}}, 404: {"model": ErrorBody}},
)
async def model_card(name: str, runtime: RuntimeDep) -> Response:
    """A served model's card, as its bundle carries it (Markdown)."""
    for model in runtime.models.values():
        if model.name == name and model.card is not None:
            return Response(model.card, media_type="text/markdown; charset=utf-8")
    raise ServiceError(ErrorType.NOT_FOUND, f"no model card for {name!r}")


def _finite(score: float | None) -> float | None:
    return score if score is not None and math.isfinite(score) else None
