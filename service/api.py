"""The HTTP room: request and response models, routers, middlewares, and the `Runtime` the
routes share (models by language pair, their batchers, readiness and draining).

A translation request goes: validate -> split each text into sentences (segment.py) -> encode ->
length check -> batcher.submit (all segments of the request, batched with everyone else's) ->
decode -> reassemble each text around its original separators.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import APIRouter, Depends, Request, Security
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import segment
from service.batcher import Batcher, BatchLimits
from service.decoding import DecodingOptions, FinishReason, Hypothesis
from service.errors import ErrorRenderer, ErrorType, ServiceError, describe_validation_errors
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
WARM_UP_TEXT = "A man is riding a bike."


class TranslationModel(Protocol):
    """What the service needs of an engine (service.engine.Engine, or a test's fake)."""

    name: str
    source_language: str
    target_language: str
    max_input_tokens: int  # per segment, </s> included
    provider: str

    def encode(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def generate(
        self, sources: Sequence[Sequence[int]], options: DecodingOptions
    ) -> list[list[Hypothesis]]: ...


@dataclass(frozen=True)
class TextTranslation:
    """One input text translated: its n-best texts (best first), their scores (mean of the
    segments' scores; None without segments), and each segment's best hypothesis."""

    texts: list[str]
    scores: Sequence[float | None]
    segments: list[Hypothesis]


class Runtime:
    """Everything the routes share once the models are loaded."""

    def __init__(
        self, settings: Settings, metrics: Metrics, models: Sequence[TranslationModel]
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[tuple[str, str], TranslationModel] = {}
        for model in models:
            pair = (model.source_language, model.target_language)
            if pair in self.models:
                raise ValueError(
                    f"two models for {pair[0]} -> {pair[1]}: {model.name}, {self.models[pair].name}"
                )
            self.models[pair] = model
        limits = BatchLimits(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_wait_s=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue_segments,
        )
        self.batchers = {
            pair: Batcher(model.generate, model=model.name, limits=limits, metrics=metrics)
            for pair, model in self.models.items()
        }
        self.warmed_up = False
        self.draining = False
        self._drain_end = math.inf
        self._in_flight = 0
        self._no_requests = asyncio.Event()
        self._no_requests.set()

    @property
    def ready(self) -> bool:
        running = all(b.running for b in self.batchers.values())
        return self.warmed_up and running and not self.draining

    async def start(self) -> None:
        """Start the batchers and translate one sentence per model through the whole path."""
        for pair, model in self.models.items():
            self.metrics.model_info.labels(model.name, pair[0], pair[1], model.provider).set(1)
            self.batchers[pair].start()
        for pair in self.models:
            options = self.decoding_options(pair)
            await self.translate([WARM_UP_TEXT], pair, options, deadline=math.inf)
        self.warmed_up = True

    @contextmanager
    def accept(self) -> Iterator[None]:
        """Hold a translation request open; refused once draining has begun."""
        if self.draining:
            raise ServiceError(ErrorType.UNAVAILABLE, "the service is shutting down")
        self._in_flight += 1
        self._no_requests.clear()
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()
            if self._in_flight == 0:
                self._no_requests.set()

    async def finish_requests(self, timeout: float) -> bool:
        """Refuse new requests and wait for the accepted ones to be answered, until `timeout`
        seconds after the first call (a second call shares the first one's deadline)."""
        if not self.draining:
            self.draining = True
            self._drain_end = time.monotonic() + timeout
        try:
            await asyncio.wait_for(self._no_requests.wait(), self._drain_left())
        except TimeoutError:
            log.warning("%d requests still open at the drain timeout", self._in_flight)
            return False
        return True

    async def shutdown(self, timeout: float) -> None:
        """Drain (see finish_requests), then stop the batchers within the same deadline."""
        await self.finish_requests(timeout)
        for batcher in self.batchers.values():
            await batcher.stop(self._drain_left())

    def _drain_left(self) -> float:
        return max(0.0, self._drain_end - time.monotonic())

    def model(self, source: str, target: str) -> TranslationModel:
        model = self.models.get((source, target))
        if model is None:
            served = ", ".join(f"{s} -> {t}" for s, t in self.models)
            raise ServiceError(
                ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                f"no model translates {source} -> {target}; served: {served}",
            )
        return model

    def decoding_options(
        self,
        pair: tuple[str, str],
        *,
        beam_size: int | None = None,
        num_hypotheses: int = 1,
        length_penalty: float | None = None,
        max_decoding_length: int | None = None,
        return_scores: bool = False,
    ) -> DecodingOptions:
        """Request fields over the settings' defaults, validated; lengths are capped by the
        model (so equal requests are batched together whatever they asked beyond it)."""
        s = self.settings
        if beam_size is None:
            beam_size = s.default_beam_size
        if length_penalty is None:
            length_penalty = s.default_length_penalty
        if max_decoding_length is None:
            max_decoding_length = s.default_max_decoding_length
        if beam_size > s.max_beam_size:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"beam_size {beam_size} is larger than this server's limit of {s.max_beam_size}",
            )
        try:
            return DecodingOptions(
                beam_size=beam_size,
                num_hypotheses=num_hypotheses,
                length_penalty=length_penalty,
                max_decoding_length=min(max_decoding_length, self.models[pair].max_input_tokens),
                return_scores=return_scores,
            )
        except ValueError as e:
            raise ServiceError(ErrorType.INVALID_REQUEST, str(e)) from e

    def _split_and_encode(
        self, model: TranslationModel, texts: Sequence[str]
    ) -> tuple[list[segment.Layout], list[list[int]]]:
        layouts = [segment.split(text, model.source_language) for text in texts]
        count = sum(len(layout.segments) for layout in layouts)
        limit = self.settings.max_queue_segments
        if count > limit:
            # More than the queue ever holds: refused for good, before the tokeniser's work.
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"{count} sentences in one request; the limit is {limit} (max_queue_segments)",
            )
        return layouts, model.encode([s for layout in layouts for s in layout.segments])

    async def translate(
        self,
        texts: Sequence[str],
        pair: tuple[str, str],
        options: DecodingOptions,
        *,
        deadline: float,
    ) -> list[TextTranslation]:
        model, batcher = self.models[pair], self.batchers[pair]
        if sum(len(text) for text in texts) <= _INLINE_CHARACTERS:
            layouts, sources = self._split_and_encode(model, texts)
        else:
            # Off the event loop: splitting and tokenising a large body takes CPU time that
            # would stall every other request (and /health) meanwhile.
            layouts, sources = await asyncio.to_thread(self._split_and_encode, model, texts)
        # Where each segment comes from: (text index, sentence index).
        origins = [(t, n) for t, layout in enumerate(layouts) for n in range(len(layout.segments))]
        limit = model.max_input_tokens
        for (text, number), ids in zip(origins, sources, strict=True):
            if len(ids) > limit:
                raise ServiceError(
                    ErrorType.INPUT_TOO_LONG,
                    f"text {text}, sentence {number}: {len(ids)} tokens, more than the model's "
                    f"limit of {limit} tokens per sentence (</s> included); split it into "
                    "shorter sentences",
                )
        # Segments that encode to nothing (e.g. only control characters) skip the model.
        to_run = [i for i, ids in enumerate(sources) if ids]
        results = await batcher.submit([sources[i] for i in to_run], options, deadline=deadline)
        nbest = [[_NOTHING] for _ in sources]
        for i, hypotheses in zip(to_run, results, strict=True):
            nbest[i] = hypotheses
        per_text: list[list[list[Hypothesis]]] = [[] for _ in layouts]
        for (text, _), hypotheses in zip(origins, nbest, strict=True):
            per_text[text].append(hypotheses)
        return [
            _assemble(model, layout, own, options.num_hypotheses)
            for layout, own in zip(layouts, per_text, strict=True)
        ]


_NOTHING = Hypothesis([], 0.0, "eos")
# Texts up to this many characters in all are split and tokenised on the event loop: well under
# a millisecond, less than the hop to a worker thread and back costs under load.
_INLINE_CHARACTERS = 2000


def _assemble(
    model: TranslationModel, layout: segment.Layout, nbest: list[list[Hypothesis]], n: int
) -> TextTranslation:
    """The text's k-th alternative joins each segment's k-th hypothesis (its last if it has
    fewer). A text without segments (empty or only whitespace) translates to ""."""
    if not layout.segments:
        return TextTranslation([""] * n, [None] * n, [])
    texts, scores = [], []
    for k in range(n):
        chosen = [hyps[min(k, len(hyps) - 1)] for hyps in nbest]
        texts.append(layout.join([model.decode(h.ids) for h in chosen]))
        scores.append(sum(h.score for h in chosen) / len(chosen))
    return TextTranslation(texts, scores, [hyps[0] for hyps in nbest])


def _finite(score: float | None) -> float | None:
    return score if score is not None and math.isfinite(score) else None


# --- Dependencies ------------------------------------------------------------------------------
# All `async def`: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per
# dependency per request that costs far more than these few lines.


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise ServiceError(ErrorType.UNAVAILABLE, "the service is starting")
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
_bearer = HTTPBearer(auto_error=False)


async def presented_key(
    header_key: Annotated[str | None, Security(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> str | None:
    """The API key from `X-API-Key: KEY` or `Authorization: Bearer KEY`."""
    return header_key if header_key is not None else bearer.credentials if bearer else None


PresentedKey = Annotated[str | None, Depends(presented_key)]


def check_api_key(runtime: Runtime, key: str | None) -> None:
    keys = runtime.settings.api_keys
    if not keys:
        return
    if key is None:
        raise ServiceError(ErrorType.UNAUTHORIZED, "an API key is required")
    presented = key.encode()
    # Constant time, and every key compared: the answer's timing tells nothing.
    accepted = False
    for known in keys:
        accepted |= hmac.compare_digest(known.get_secret_value().encode(), presented)
    if not accepted:
        raise ServiceError(ErrorType.UNAUTHORIZED, "invalid API key")


async def require_api_key(runtime: RuntimeDep, key: PresentedKey) -> None:
    check_api_key(runtime, key)


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has gone. Called after the body was read, so the next ASGI
    message is the disconnect (the server sends it when the connection drops)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`; cancel it if the client disconnects first, which drops its queued segments."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its segments are out of the queue before we answer
    raise ServiceError(ErrorType.CLIENT_DISCONNECTED, "the client closed the connection")


# --- Native API --------------------------------------------------------------------------------


class TranslateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "A dog runs.", "source": "en", "target": "de"}]},
    )

    text: str | list[str] = Field(description="a text or a list of texts; line breaks are kept")
    source: str = Field(description="source language code, e.g. en")
    target: str = Field(description="target language code, e.g. de")
    beam_size: int | None = Field(None, ge=1, description="1 is greedy; default from settings")
    num_hypotheses: int = Field(1, ge=1, description="n-best list size, at most beam_size")
    length_penalty: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False)
    max_decoding_length: int | None = Field(
        None, ge=1, description="tokens per sentence, capped by the model; default from settings"
    )
    return_scores: bool = False


class Alternative(BaseModel):
    text: str
    score: float | None = None


class SegmentInfo(BaseModel):
    finish_reason: FinishReason
    score: float | None = None


class TranslationOut(BaseModel):
    text: str
    score: float | None = Field(None, description="when return_scores: mean sentence score")
    alternatives: list[Alternative] | None = Field(None, description="when num_hypotheses > 1")
    segments: list[SegmentInfo] = Field(description="one per sentence, in order")


class TranslateResponse(BaseModel):
    model: str
    source: str
    target: str
    translations: list[TranslationOut] = Field(description="one per input text, in order")


class LanguagePair(BaseModel):
    source: str
    target: str
    model: str


class Status(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    type: ErrorType
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 413, 422, 429, 500, 503)
}

router = APIRouter()


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=_ERRORS,
    dependencies=[Depends(require_api_key)],
)
async def translate(
    body: TranslateRequest, request: Request, runtime: RuntimeDep
) -> TranslateResponse:
    """Translate one text or a list of texts; the answer keeps the input's order and layout."""
    deadline = time.monotonic() + runtime.settings.request_timeout_s
    with runtime.accept():
        model = runtime.model(body.source, body.target)
        texts = [body.text] if isinstance(body.text, str) else body.text
        _check_count(runtime, len(texts))
        pair = (body.source, body.target)
        options = runtime.decoding_options(
            pair,
            beam_size=body.beam_size,
            num_hypotheses=body.num_hypotheses,
            length_penalty=body.length_penalty,
            max_decoding_length=body.max_decoding_length,
            return_scores=body.return_scores,
        )
        work = runtime.translate(texts, pair, options, deadline=deadline)
        results = await unless_disconnected(request, work)
    return TranslateResponse(
        model=model.name,
        source=body.source,
        target=body.target,
        translations=[_translation_out(r, body) for r in results],
    )


def _translation_out(result: TextTranslation, body: TranslateRequest) -> TranslationOut:
    """Scores only when asked for, alternatives only when more than one hypothesis was."""

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
            SegmentInfo(finish_reason=h.finish_reason, score=score(h.score))
            for h in result.segments
        ],
    )


def _check_count(runtime: Runtime, count: int) -> None:
    limit = runtime.settings.max_texts
    if count > limit:
        raise ServiceError(
            ErrorType.INVALID_REQUEST, f"{count} texts in one request; the limit is {limit}"
        )


@router.get("/languages", response_model=list[LanguagePair])
async def languages(runtime: RuntimeDep) -> list[LanguagePair]:
    """The language pairs served, one model each."""
    return [LanguagePair(source=s, target=t, model=m.name) for (s, t), m in runtime.models.items()]


@router.get("/health", response_model=Status)
async def health() -> Status:
    """The process answers (liveness)."""
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


# --- LibreTranslate-compatible API -------------------------------------------------------------

# English names for the codes LibreTranslate clients display; others show their code.
_LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French", "hi": "Hindi",
    "hu": "Hungarian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's fields; others (e.g. `secret`) are ignored as LibreTranslate does."""

    q: str | list[str] | None = Field(None, description="text or list of texts")
    source: str | None = Field(None, description="language code, or auto")
    target: str | None = None
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(0, ge=0, description="number of alternative translations")
    api_key: str | None = None


class DetectedLanguage(BaseModel):
    confidence: float
    language: str


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's names
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None
    alternatives: list[str] | list[list[str]] | None = None


class LibreTranslateLanguage(BaseModel):
    code: str
    name: str
    targets: list[str]


class LibreTranslateError(BaseModel):
    error: str


_FORM_SCHEMA = {
    "type": "object",
    "properties": {
        "q": {"type": "string"},
        "source": {"type": "string"},
        "target": {"type": "string"},
        "format": {"type": "string", "enum": ["text", "html"]},
        "alternatives": {"type": "integer", "minimum": 0},
        "api_key": {"type": "string"},
    },
    "required": ["q", "source", "target"],
}
_DETECT_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "api_key": {"type": "string"}},
    "required": ["q"],
}


def _openapi_body(json_schema: dict[str, Any], form_schema: dict[str, Any]) -> dict[str, Any]:
    """The request body LibreTranslate documents: JSON or form fields (parsed by hand)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": json_schema},
                "application/x-www-form-urlencoded": {"schema": form_schema},
                "multipart/form-data": {"schema": form_schema},
            },
        }
    }


_LIBRETRANSLATE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": LibreTranslateError} for status in (400, 403, 413, 429, 500, 503)
}

libretranslate_router = APIRouter(tags=["LibreTranslate"])


@libretranslate_router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses=_LIBRETRANSLATE_ERRORS,
    openapi_extra=_openapi_body(LibreTranslateRequest.model_json_schema(), _FORM_SCHEMA),
)
async def libretranslate_translate(
    request: Request, runtime: RuntimeDep, header_key: PresentedKey
) -> LibreTranslateResponse:
    """LibreTranslate's /translate: JSON or form body; `q` a string or a list."""
    deadline = time.monotonic() + runtime.settings.request_timeout_s
    with runtime.accept():
        try:
            body = LibreTranslateRequest.model_validate(await _libretranslate_fields(request))
        except ValidationError as e:
            message = describe_validation_errors(e.errors())
            raise ServiceError(ErrorType.INVALID_REQUEST, message) from e
        check_api_key(runtime, body.api_key if body.api_key is not None else header_key)
        q, source, target = body.q, body.source, body.target
        if not q:
            raise _missing("q")
        if not source:
            raise _missing("source")
        if not target:
            raise _missing("target")
        if body.format != "text":
            raise ServiceError(ErrorType.INVALID_REQUEST, f"{body.format} format is not supported")
        texts = q if isinstance(q, list) else [q]
        if len(texts) > runtime.settings.max_texts:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"Invalid request: request ({len(texts)}) exceeds text limit "
                f"({runtime.settings.max_texts})",
            )
        source = _libretranslate_source(runtime, source)
        pair = (source, target)
        runtime.model(*pair)  # an unknown pair is refused before anything else is checked
        if body.alternatives + 1 > runtime.settings.max_beam_size:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"Invalid request: alternatives parameter must be <= "
                f"{runtime.settings.max_beam_size - 1}",
            )
        n = body.alternatives + 1
        options = runtime.decoding_options(
            pair, beam_size=max(runtime.settings.default_beam_size, n), num_hypotheses=n
        )
        work = runtime.translate(texts, pair, options, deadline=deadline)
        results = await unless_disconnected(request, work)
    translated = [r.texts[0] for r in results]
    # As LibreTranslate: alternatives differ from the translation and from each other.
    alternatives = [
        list(dict.fromkeys(t for t in r.texts[1:] if t and t != r.texts[0])) for r in results
    ]
    detected = DetectedLanguage(confidence=100.0, language=source)
    single = isinstance(body.q, str)
    return LibreTranslateResponse(
        translatedText=translated[0] if single else translated,
        detectedLanguage=(detected if single else [detected] * len(texts))
        if body.source == "auto"
        else None,
        alternatives=(alternatives[0] if single else alternatives) if body.alternatives else None,
    )


def _missing(name: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, f"Invalid request: missing {name} parameter")


async def _libretranslate_fields(request: Request) -> dict[str, Any]:
    """JSON when the client says so, else query parameters and form fields as Flask's
    `request.values` in LibreTranslate: the query string first, then the form, and the first
    value of a repeated name wins (line endings made \\n)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            data = await request.json()
        except ValueError:
            raise ServiceError(ErrorType.INVALID_REQUEST, "Invalid JSON format") from None
        if not isinstance(data, dict):
            raise ServiceError(ErrorType.INVALID_REQUEST, "Invalid JSON format")
        return data
    form = await request.form()
    fields: dict[str, Any] = {}
    for key, value in [*request.query_params.multi_items(), *form.multi_items()]:
        if isinstance(value, str):  # uploaded files are not fields
            fields.setdefault(key, value)
    if "q" in fields:
        fields["q"] = "\n".join(fields["q"].splitlines())
    return fields


def _libretranslate_source(runtime: Runtime, source: str) -> str:
    if source != "auto":
        return source
    sources = {s for s, _ in runtime.models}
    if len(sources) != 1:
        raise ServiceError(
            ErrorType.INVALID_REQUEST,
            "this server detects no language: 'auto' needs a single source language, and it "
            "serves " + ", ".join(sorted(sources)),
        )
    return sources.pop()


@libretranslate_router.post(
    "/detect",
    response_model=list[DetectedLanguage],
    responses=_LIBRETRANSLATE_ERRORS,
    openapi_extra=_openapi_body(_DETECT_SCHEMA, _DETECT_SCHEMA),
)
async def libretranslate_detect(
    request: Request, runtime: RuntimeDep, header_key: PresentedKey
) -> list[DetectedLanguage]:
    """LibreTranslate's /detect, for clients that call it: no detector, the server's only
    source language with confidence 100 (400 when it serves several)."""
    with runtime.accept():  # refused while draining, like every request that carries text
        fields = await _libretranslate_fields(request)
        api_key = fields.get("api_key")
        check_api_key(runtime, api_key if isinstance(api_key, str) else header_key)
        if not fields.get("q"):
            raise _missing("q")
        language = _libretranslate_source(runtime, "auto")
    return [DetectedLanguage(confidence=100.0, language=language)]


@libretranslate_router.get("/languages", response_model=list[LibreTranslateLanguage])
async def libretranslate_languages(runtime: RuntimeDep) -> list[LibreTranslateLanguage]:
    """Every language served, as a source (with its targets) or only as a target."""
    codes = sorted({code for pair in runtime.models for code in pair})
    return [
        LibreTranslateLanguage(
            code=code,
            name=_LANGUAGE_NAMES.get(code, code),
            targets=sorted(t for s, t in runtime.models if s == code),
        )
        for code in codes
    ]


# --- Middlewares -------------------------------------------------------------------------------


class HttpMetricsMiddleware:
    """Counts every response by route and status and times it; unknown paths share one label."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = 500  # if the app fails before answering, the server answers 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)


class CloseWhenDrainingMiddleware:
    """While the service drains, every answer says `Connection: close`. A keep-alive client or
    proxy then opens a new connection for its next request, which the load balancer sends to a
    replica that is not shutting down; otherwise the kept connection stays pinned to this one,
    and gets its 503s, for as long as the keep-alive lasts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                runtime: Runtime | None = getattr(scope["app"].state, "runtime", None)
                if runtime is not None and runtime.draining:
                    headers = [*message.get("headers", []), (b"connection", b"close")]
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing)


class BodyLimitMiddleware:
    """413 for a body over the limit: at once when Content-Length says so, else as soon as
    the bytes received pass it."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, renderer: ErrorRenderer) -> None:
        self.app, self.max_bytes, self.renderer = app, max_bytes, renderer
        self.message = f"the request body is larger than the limit of {max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = self.renderer.response(
                scope["path"], ErrorType.PAYLOAD_TOO_LARGE, self.message
            )
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside body parsing; the HTTPException handler answers 413.
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, receive_within_limit, send)
