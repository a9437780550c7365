"""The LibreTranslate-compatible surface (mounted under `libretranslate_prefix`): its
/translate, /detect and /languages with LibreTranslate's fields, form bodies and error shape, over
the same pipeline as the native routes; its /translate_file, /download_file and /frontend/settings
over the document jobs (service/http/documents.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, field_validator

from service.documents.formats import FORMATS
from service.documents.jobs import Documents, Job
from service.errors import ErrorType, ServiceError
from service.glossaries import owner_of
from service.http.documents import (
    DocumentsDep,
    Sender,
    multipart_body,
    result_name,
    result_response,
    upload,
)
from service.http.errors import ERROR_TABLE, ErrorFace
from service.http.middleware import (
    KEYED,
    PresentedKey,
    RuntimeDep,
    check_api_key,
    check_text,
    form_items,
    get_runtime,
    is_json,
    json_or_form_body,
    protection,
    read_json_or_refuse,
    request_key,
    translate_texts,
    unless_disconnected,
    validate,
)
from service.http.schemas import GlossaryEntry
from service.keys.store import ApiKey
from service.scheduling.runtime import UNDETERMINED, Runtime, Untranslated
from service.text.detect import Candidate
from service.text.pipeline import Form, TextTranslation

# English names for the codes LibreTranslate clients display; others show their code.
LANGUAGE_NAMES = {
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
    alternatives: int = Field(0, description="number of alternative translations")
    api_key: str | None = None
    # Ours (docs/api.md): placeholders kept byte for byte, and a request's own patterns.
    placeholders: bool = True
    placeholder_patterns: list[str] = Field([], max_length=16)
    glossary_id: str | None = None
    glossary: list[GlossaryEntry] | None = None

    @field_validator("format", mode="before")
    @classmethod
    def _text_unless_given(cls, value: Any) -> Any:
        """As LibreTranslate's `if not text_format`: null or empty is text."""
        return value or "text"

    @field_validator("alternatives", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        """As LibreTranslate's `max(0, int(alternatives))`, in JSON too: a string of an integer
        counts, a negative number is 0; anything else is left for the type to refuse."""
        if isinstance(value, int | str):
            with contextlib.suppress(ValueError):
                return max(0, int(value))
        return value


class LibreTranslateDetectRequest(BaseModel):
    q: str | None = None
    api_key: str | None = None


class DetectedLanguage(BaseModel):
    confidence: float
    language: str


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's names
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None
    alternatives: list[str] | list[list[str]] | None = None
    # Ours, with source auto: why a text came back as sent (docs/api.md); absent when none did.
    untranslated: Untranslated | list[Untranslated | None] | None = None


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
        "alternatives": {"type": "integer"},
        "api_key": {"type": "string"},
    },
    "required": ["q", "source", "target"],
}
_DETECT_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "api_key": {"type": "string"}},
    "required": ["q"],
}


def libretranslate_face(prefix: str) -> ErrorFace:
    """LibreTranslate's error body, `{"error": message}`, and its statuses for those the
    native API uses and it does not: 422 and 415 -> 400, 401 -> 403."""
    statuses = {
        **{type: 400 for type, row in ERROR_TABLE.items() if row.status in (422, 415)},
        ErrorType.UNAUTHORIZED: 403,
    }
    return ErrorFace((prefix,), statuses, lambda message: {"error": message})


_LIBRETRANSLATE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": LibreTranslateError} for status in (400, 403, 413, 429, 500, 503, 504)
}

libretranslate_router = APIRouter(tags=["LibreTranslate"])


@libretranslate_router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses=_LIBRETRANSLATE_ERRORS,
    openapi_extra=json_or_form_body(LibreTranslateRequest.model_json_schema(), _FORM_SCHEMA)
    | KEYED,
)
async def libretranslate_translate(request: Request) -> LibreTranslateResponse:
    """LibreTranslate's /translate: JSON or form body; `q` a string or a list."""
    runtime, header_key = await get_runtime(request), await request_key(request)
    deadline = time.monotonic() + runtime.settings.request_timeout_s
    with runtime.accept():
        fields, strict = await _libretranslate_fields(request, runtime, header_key)
        caller = await _check_key(runtime, fields, header_key, request)
        body = validate(LibreTranslateRequest, fields, strict=strict)
        q, source, target = body.q, body.source, body.target
        if not q:
            raise _missing("q")
        if not source:
            raise _missing("source")
        if not target:
            raise _missing("target")
        texts = q if isinstance(q, list) else [q]
        if len(texts) > runtime.settings.max_texts:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"Invalid request: request ({len(texts)}) exceeds text limit "
                f"({runtime.settings.max_texts})",
            )
        if source != "auto":
            runtime.model(source, target)  # an unknown pair is refused before anything else
        if body.alternatives + 1 > runtime.settings.max_beam_size:
            raise ServiceError(
                ErrorType.INVALID_REQUEST,
                f"Invalid request: alternatives parameter must be <= "
                f"{runtime.settings.max_beam_size - 1}",
            )
        await runtime.access.charge(caller, sum(len(text) for text in texts))
        n = body.alternatives + 1
        requested = {"beam_size": max(runtime.settings.default_beam_size, n), "num_hypotheses": n}
        form = Form(body.format, protection=protection(body))
        inline = None if body.glossary is None else [e.entry() for e in body.glossary]
        owner = owner_of(_key(fields, header_key))
        terms = await runtime.terms(owner, (source, target), body.glossary_id, inline)
        # With auto, each text's own language, not one for the batch as LibreTranslate does.
        auto = source == "auto"
        found = await translate_texts(
            request, runtime, texts, None if auto else source, target, requested,
            deadline=deadline, form=form, terms=terms,
        )  # fmt: skip
        results = [d.translation for d in found]
        detected = [_detected(d.detected) for d in found] if auto else None
        untranslated = [d.untranslated for d in found]
    single = isinstance(body.q, str)

    def each(values: list[Any]) -> Any:
        return values[0] if single else values

    return LibreTranslateResponse(
        translatedText=each([r.texts[0] for r in results]),
        detectedLanguage=None if detected is None else each(detected),
        alternatives=each([_alternatives(r) for r in results]) if body.alternatives else None,
        untranslated=each(untranslated) if any(untranslated) else None,
    )


def _alternatives(result: TextTranslation) -> list[str]:
    """As LibreTranslate: alternatives differ from the translation and from each other."""
    best = result.texts[0]
    return list(dict.fromkeys(t for t in result.texts[1:] if t and t != best))


def _detected(candidate: Candidate) -> DetectedLanguage:
    """LibreTranslate's confidence is a percentage."""
    return DetectedLanguage(
        confidence=round(100 * candidate.confidence, 2), language=candidate.language
    )


def _missing(name: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, f"Invalid request: missing {name} parameter")


async def _check_key(
    runtime: Runtime, fields: dict[str, Any], header_key: str | None, request: Request
) -> ApiKey | None:
    """The key in the body (LibreTranslate's `api_key`), else the header's: checked before the
    fields are validated, so that a client without a key learns nothing about the API."""
    return await check_api_key(runtime, _key(fields, header_key), request)


def _key(fields: dict[str, Any], header_key: str | None) -> str | None:
    """The request's API key: the body's `api_key`, else the header's."""
    api_key = fields.get("api_key")
    return api_key if isinstance(api_key, str) else header_key


async def _libretranslate_fields(
    request: Request, runtime: Runtime, header_key: str | None
) -> tuple[dict[str, Any], bool]:
    """The fields, and whether to validate them strictly (JSON has types; form fields are all
    strings). JSON when the client says so, else query parameters and form fields as Flask's
    `request.values` in LibreTranslate: the query string first, then the form, and the first
    value of a repeated name wins (line endings made \\n)."""
    if is_json(request):
        try:
            return await read_json_or_refuse(request, runtime, header_key), True
        except ServiceError as e:
            if e.type == ErrorType.UNAUTHORIZED:
                raise
            # The body's problem in LibreTranslate's words and ours.
            raise ServiceError(e.type, f"Invalid JSON format: {e.message}") from None
    fields: dict[str, Any] = {}
    for key, value in await form_items(request):
        fields.setdefault(key, value)
    if "q" in fields:
        fields["q"] = "\n".join(fields["q"].splitlines())
    check_text(fields)
    return fields, False


@libretranslate_router.post(
    "/detect",
    response_model=list[DetectedLanguage],
    responses=_LIBRETRANSLATE_ERRORS,
    openapi_extra=json_or_form_body(_DETECT_SCHEMA, _DETECT_SCHEMA),
)
async def libretranslate_detect(
    request: Request, runtime: RuntimeDep, header_key: PresentedKey
) -> list[DetectedLanguage]:
    """LibreTranslate's /detect: the served languages `q` may be in, most likely first (und
    with confidence 0 when none is: clients read the first)."""
    with runtime.accept():  # refused while draining, like every request that carries text
        fields, strict = await _libretranslate_fields(request, runtime, header_key)
        caller = await _check_key(runtime, fields, header_key, request)
        q = validate(LibreTranslateDetectRequest, fields, strict=strict).q
        if not q:
            raise _missing("q")
        await runtime.access.charge(caller, 0)  # a request; no characters translated
        (found,) = await runtime.detect([q])
    return [_detected(c) for c in found or [UNDETERMINED]]


@libretranslate_router.get("/languages", response_model=list[LibreTranslateLanguage])
async def libretranslate_languages(runtime: RuntimeDep) -> list[LibreTranslateLanguage]:
    """Every language served, as a source (with its targets) or only as a target."""
    targets: dict[str, list[str]] = {}
    for source, target in runtime.models:  # one pass: NLLB serves 40,602 pairs
        targets.setdefault(source, []).append(target)
        targets.setdefault(target, [])
    return [
        LibreTranslateLanguage(
            code=code, name=LANGUAGE_NAMES.get(code, code), targets=sorted(targets[code])
        )
        for code in sorted(targets)
    ]


class LibreTranslateFile(BaseModel):
    translatedFileUrl: str


# How often a synchronous /translate_file looks at its job.
_FILE_POLL_S = 0.1


@libretranslate_router.post(
    "/translate_file",
    response_model=LibreTranslateFile,
    responses=_LIBRETRANSLATE_ERRORS,
    openapi_extra=multipart_body(
        {
            "file": {"type": "string", "format": "binary"},
            **{name: {"type": "string"} for name in ("source", "target", "api_key")},
        },
        ["file", "source", "target"],
    ),
)
async def libretranslate_translate_file(
    request: Request, runtime: RuntimeDep, documents: DocumentsDep, header_key: PresentedKey
) -> LibreTranslateFile:
    """LibreTranslate's /translate_file: answers when the file is translated, with the URL of
    its download (a document job underneath: the same as POST /documents, waited for)."""

    async def authorize(fields: dict[str, Any]) -> Sender:
        stored = await _check_key(runtime, fields, header_key, request)
        for name in ("source", "target"):
            if not fields.get(name):
                raise _missing(name)
        return Sender(stored, owner_of(_key(fields, header_key)))

    with runtime.accept():
        job = await upload(request, runtime, documents, authorize)
        try:
            job = await unless_disconnected(request, _finished(documents, job.id))
        except BaseException:
            with contextlib.suppress(ServiceError):  # gone already
                await documents.delete(job.id)  # nobody will download it
            raise
    if job.status == "error":
        await documents.result(job.id)  # raises the job's own error
    prefix = runtime.settings.libretranslate_prefix
    name = urllib.parse.quote(f"{job.id}.{result_name(job)}")
    return LibreTranslateFile(
        translatedFileUrl=f"{str(request.base_url).rstrip('/')}{prefix}/download_file/{name}"
    )


async def _finished(documents: Documents, id: str) -> Job:
    while (job := await documents.get(id)).status not in ("done", "error"):
        await asyncio.sleep(_FILE_POLL_S)
    return job


@libretranslate_router.get(
    "/download_file/{filename}",
    responses={200: {"content": {"application/octet-stream": {}}}, **_LIBRETRANSLATE_ERRORS},
    response_class=Response,
)
async def libretranslate_download_file(filename: str, documents: DocumentsDep) -> Response:
    """A file /translate_file translated: its id, a dot, then its name."""
    return await result_response(filename.split(".", 1)[0], documents)


class LibreTranslateFrontendLanguage(BaseModel):
    code: str
    name: str


class LibreTranslateFrontendSettings(BaseModel):
    charLimit: int
    frontendTimeout: int
    apiKeys: bool
    keyRequired: bool
    suggestions: bool
    filesTranslation: bool
    supportedFilesFormat: list[str]
    language: dict[str, LibreTranslateFrontendLanguage]


@libretranslate_router.get("/frontend/settings", response_model=LibreTranslateFrontendSettings)
async def libretranslate_frontend_settings(runtime: RuntimeDep) -> LibreTranslateFrontendSettings:
    """What LibreTranslate's web page reads at its start: limits, keys, and the file formats
    /translate_file takes."""
    settings = runtime.settings
    target = next(iter(runtime.models))[1]
    return LibreTranslateFrontendSettings(
        charLimit=settings.max_characters,
        frontendTimeout=500,
        apiKeys=bool(settings.api_keys),
        keyRequired=bool(settings.api_keys),
        suggestions=False,
        filesTranslation=True,
        supportedFilesFormat=[e for f in FORMATS for e in f.extensions],
        language={
            "source": LibreTranslateFrontendLanguage(code="auto", name="Auto Detect"),
            "target": LibreTranslateFrontendLanguage(
                code=target, name=LANGUAGE_NAMES.get(target, target)
            ),
        },
    )
