"""DeepL's API (mounted under `deepl_prefix`, DeepL's own paths by default): /v2/translate,
/v2/languages and /v2/usage with DeepL's field names, language codes, form and JSON bodies,
authentication (`Authorization: DeepL-Auth-Key KEY`, or the deprecated `auth_key` field),
statuses and error body (`{"message": ...}`), over the same pipeline as the native routes.

Glossaries and documents are DeepL faces of the service's own (service/http/deepl_glossaries.py,
deepl_documents.py): their routes sit beside `deepl_router`'s, read their fields and key with
`deepl_call`, their languages with `deepl_languages`, and answer errors through `deepl_face`
(every path under /v2 and /v3). A glossary named in a translation is the caller's own, of the
translation's pair (Runtime.terms).

What each field does, honoured or accepted and ignored, is in docs/api.md#deepls-api.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, cast

import pycountry
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from service.errors import ErrorType, ServiceError
from service.glossaries import owner_of
from service.http.errors import ERROR_TABLE, ErrorFace
from service.http.libretranslate import LANGUAGE_NAMES
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
    read_json_or_refuse,
    request_key,
    translate_texts,
    utf8_header,
)
from service.keys.store import ApiKey
from service.scheduling.runtime import DetectedTranslation, Runtime
from service.text.detect import detector_label
from service.text.markup import Tags
from service.text.pipeline import Form
from service.text.segment import Splitting
from service.text.terms import Terms

# DeepL's regional variants of a served language, which a target code may name (a source code
# never does): each is the served language, and says so in /v2/languages?type=target.
_VARIANTS = {
    "EN-GB": "English (British)",
    "EN-US": "English (American)",
    "PT-BR": "Portuguese (Brazilian)",
    "PT-PT": "Portuguese (European)",
    "ZH-HANS": "Chinese (simplified)",
}
_NAMES = {**_VARIANTS, "ZH-HANT": "Chinese (traditional)"}  # NLLB's zho_Hant
# The detected source language of a text with nothing to detect (emoji, digits): ISO 639's
# "undetermined", as the native API's "und".
UNDETERMINED_CODE = "UND"
# What DeepL's usage answers as the limit of an account without one.
NO_CHARACTER_LIMIT = 1_000_000_000_000
_SPLITTING: dict[str, Splitting] = {"1": "lines", "nonewlines": "sentences", "0": "none"}
_FORMALITIES = ("default", "more", "less", "prefer_more", "prefer_less")
_MODEL_TYPES = ("quality_optimized", "prefer_quality_optimized", "latency_optimized")
# DeepL's tag lists, as markup.Tags holds them.
_TAG_LISTS = ("ignore_tags", "splitting_tags", "non_splitting_tags")
# Fields that may come as a list (JSON) or repeated (form); the lists also comma-separated.
_LISTS = ("text", *_TAG_LISTS, "glossary_ids")


def deepl_face(prefix: str) -> ErrorFace:
    """DeepL's error body, `{"message": ...}`, and its statuses: 400 for what the native API
    answers 422 or 415, 403 for a missing or wrong key, 413 for a request too large in bytes or
    in characters (and a sentence over the model's limit), 456 for a key's character quota
    spent (service/keys/), 503 for a document not translated yet."""
    statuses = {
        **{type: 400 for type, row in ERROR_TABLE.items() if row.status == 422},
        ErrorType.UNAUTHORIZED: 403,
        ErrorType.INPUT_TOO_LONG: 413,
        ErrorType.QUOTA_EXCEEDED: 456,
        ErrorType.UNSUPPORTED_MEDIA_TYPE: 400,  # a file of no format served
        ErrorType.DOCUMENT_NOT_READY: 503,  # DeepL's client retries its download on a 503
    }
    return ErrorFace(
        (f"{prefix}/v2", f"{prefix}/v3"), statuses, lambda message: {"message": message}
    )


def _bad(message: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, message)


def _not_supported(name: str) -> ServiceError:
    return _bad(f"Value for '{name}' not supported.")


# --- Usage -------------------------------------------------------------------------------------


class CharacterUsage(Protocol):
    """Characters translated for each key (None: the service takes no keys) and each key's
    limit (None: none)."""

    def record(self, key: str | None, characters: int) -> None: ...

    def count(self, key: str | None) -> int: ...

    def limit(self, key: str | None) -> int | None: ...


class InProcessUsage:
    """Counts in this process, since it started, without limits: a worker's own counts (shared
    quotas replace it)."""

    def __init__(self) -> None:
        self._counts: dict[str | None, int] = {}

    def record(self, key: str | None, characters: int) -> None:
        self._counts[key] = self._counts.get(key, 0) + characters

    def count(self, key: str | None) -> int:
        return self._counts.get(key, 0)

    def limit(self, key: str | None) -> int | None:
        return None


# --- Fields and key ----------------------------------------------------------------------------


async def deepl_fields(
    request: Request, runtime: Runtime, header_key: str | None
) -> dict[str, Any]:
    """The request's fields, as DeepL reads them: a JSON body's over the query's, else the
    query's and a form body's (`text` and the lists as lists of every value given, other
    fields their first value). A body that is not JSON is answered after the header's key was
    checked: no key, nothing learnt."""
    if is_json(request):
        body = await read_json_or_refuse(request, runtime, header_key)
        items = list(request.query_params.multi_items())
    else:
        body, items = {}, await form_items(request)
    fields: dict[str, Any] = {}
    for name, value in items:
        if name in _LISTS:
            fields.setdefault(name, []).append(value)
        else:
            fields.setdefault(name, value)
    fields.update(body)
    check_text(fields)
    return fields


async def _header_key(request: Request, service_key: PresentedKey) -> str | None:
    """`Authorization: DeepL-Auth-Key KEY`, else the service's own headers' key (X-API-Key,
    Bearer)."""
    scheme, _, key = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "deepl-auth-key":
        return utf8_header(key.strip())
    return service_key


HeaderKey = Annotated[str | None, Depends(_header_key)]


@dataclass(frozen=True)
class DeepLCaller:
    """Who calls: the key presented (None when the service takes no keys: usage then counts
    for everyone together, a key nobody checks names nobody), for a key of the key store its
    limits (service/keys/), and the owner of the glossaries it makes and names (as the native
    API's: the presented key's, service/glossaries.py)."""

    key: str | None
    stored: ApiKey | None
    owner: str


async def deepl_key(
    runtime: Runtime, request: Request, fields: Mapping[str, Any], header_key: str | None
) -> DeepLCaller:
    """The key a request authenticates with (the header's, else the deprecated `auth_key`
    field's), checked."""
    field = fields.get("auth_key")
    key = header_key if header_key is not None or not isinstance(field, str) else field
    stored = await check_api_key(runtime, key, request)
    return DeepLCaller(key if runtime.settings.api_keys or stored else None, stored, owner_of(key))


async def deepl_call(
    request: Request, runtime: Runtime, header_key: str | None
) -> tuple[dict[str, Any], DeepLCaller]:
    """A request's fields (`deepl_fields`) and its caller, checked (`deepl_key`)."""
    fields = await deepl_fields(request, runtime, header_key)
    return fields, await deepl_key(runtime, request, fields, header_key)


# --- Values ------------------------------------------------------------------------------------


def _text(fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _not_supported(name)
    return value


def _choice(fields: Mapping[str, Any], name: str, allowed: Collection[str]) -> str | None:
    value = fields.get(name)
    if isinstance(value, int) and not isinstance(value, bool):  # JSON's split_sentences: 0
        value = str(value)
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in allowed:
        raise _not_supported(name)
    return value.lower()


def _flag(fields: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean: JSON's true/false, or 0/1 and true/false as form values."""
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int | str) and str(value).lower() in ("0", "1", "true", "false"):
        return str(value).lower() in ("1", "true")
    raise _not_supported(name)


def _names(fields: Mapping[str, Any], name: str) -> list[str]:
    """A list of names (tags, glossary ids), in order: a list (JSON) or values (form), each of
    which may be comma-separated."""
    value = fields.get(name)
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _not_supported(name)
    return [part.strip() for v in values for part in v.split(",") if part.strip()]


def _texts(fields: Mapping[str, Any]) -> list[str]:
    value = fields.get("text")
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise _bad("Parameter 'text' not specified.")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _not_supported("text")
    return texts


def _deepl_codes(language: str) -> list[str]:
    """DeepL's codes for a served language: its ISO 639-1 code in upper case (NLLB's FLORES
    codes through the detector's labels: "deu_Latn" is DE), Chinese by its script."""
    if language == "zho_Hans":
        return ["ZH", "ZH-HANS"]
    if language == "zho_Hant":
        return ["ZH-HANT"]
    return [detector_label(language).upper()]


def _by_code(languages: Iterable[str]) -> dict[str, list[str]]:
    """The served languages each DeepL code names, ISO codes before FLORES codes (a bilingual
    model's "de" before NLLB's "deu_Latn")."""
    codes: dict[str, list[str]] = {}
    for language in sorted(set(languages), key=lambda code: ("_" in code, code)):
        for code in _deepl_codes(language):
            codes.setdefault(code, []).append(language)
    return codes


@dataclass(frozen=True)
class _Languages:
    """The served languages by DeepL's codes (each code's served languages, the preferred
    first), and each served language's DeepL code."""

    sources: dict[str, list[str]]
    targets: dict[str, list[str]]
    codes: dict[str, str]

    @classmethod
    def of(cls, runtime: Runtime) -> _Languages:
        known = _LANGUAGES.get(runtime)
        if known is None:  # once per runtime: NLLB serves 40,602 pairs
            sources = _by_code(source for source, _ in runtime.models)
            targets = _by_code(target for _, target in runtime.models)
            for variant in _VARIANTS:
                base = variant.partition("-")[0]
                if base in targets:
                    targets.setdefault(variant, targets[base])
            codes = {
                language: code
                for by_code in (targets, sources)
                for code, languages in by_code.items()
                for language in languages
                if code not in _VARIANTS
            }
            known = _LANGUAGES[runtime] = cls(sources, targets, codes)
        return known


_LANGUAGES: weakref.WeakKeyDictionary[Runtime, _Languages] = weakref.WeakKeyDictionary()


def _code(languages: Mapping[str, list[str]], fields: Mapping[str, Any], name: str) -> list[str]:
    """The served languages the DeepL code in field `name` names ([]: none given)."""
    code = _text(fields, name)
    if not code:
        return []
    served = languages.get(code.upper())
    if served is None:
        raise _not_supported(name)
    return served


def _pair(runtime: Runtime, sources: list[str], targets: list[str]) -> tuple[str, str]:
    """The first pair a model serves of the codes' languages; else the first pair, which
    `Runtime.model` refuses with the served pairs."""
    pairs = [(source, target) for source in sources for target in targets]
    served = [pair for pair in pairs if pair in runtime.models]
    return (served or pairs)[0]


def deepl_languages(runtime: Runtime, fields: Mapping[str, Any]) -> tuple[str | None, str]:
    """The served source (None: not given, detected) and target languages that the fields
    `source_lang` and `target_lang` (required) name; a firm formality is refused (no served
    model has formality)."""
    languages = _Languages.of(runtime)
    if not _text(fields, "target_lang"):
        raise _bad("Parameter 'target_lang' not specified.")
    targets = _code(languages.targets, fields, "target_lang")
    sources = _code(languages.sources, fields, "source_lang")
    if _choice(fields, "formality", _FORMALITIES) in ("more", "less"):
        target_code = str(fields["target_lang"]).upper()
        raise _bad(f"Target language '{target_code}' doesn't support formality.")
    return _pair(runtime, sources, targets) if sources else (None, targets[0])


def deepl_code(runtime: Runtime, language: str) -> str:
    """A served language's DeepL code, as glossaries write it (lower case: "en")."""
    return _Languages.of(runtime).codes[language].lower()


async def deepl_terms(
    runtime: Runtime, fields: Mapping[str, Any], owner: str, source: str | None, target: str
) -> Terms | None:
    """The terms of the glossary a translation or a document names (`glossary_id`, or one in
    `glossary_ids`): the caller's, of the pair, which needs its source given (DeepL's rule)."""
    glossary_id = _text(fields, "glossary_id")
    named = ([glossary_id] if glossary_id else []) + _names(fields, "glossary_ids")
    if not named:
        return None
    if source is None:
        raise _bad("Use of a glossary requires the source_lang parameter to be specified")
    if len(named) > 1:
        raise _bad("Only one glossary per request is supported by this service.")
    try:
        terms = await runtime.terms(owner, (source, target), named[0])
    except ServiceError as e:
        if e.type is ErrorType.NOT_FOUND:
            raise glossary_not_found(named[0]) from None
        raise
    return terms


def glossary_not_found(glossary_id: str) -> ServiceError:
    """DeepL's answer for a glossary this key does not have (another key's included)."""
    return ServiceError(ErrorType.NOT_FOUND, f"Glossary '{glossary_id}' not found.")


@dataclass(frozen=True)
class _Translate:
    """A /v2/translate request, checked."""

    texts: list[str]
    source: str | None
    target: str
    target_code: str
    form: Form
    billed: bool
    model_type: str | None
    terms: Terms | None


async def _translate_request(runtime: Runtime, fields: Mapping[str, Any], owner: str) -> _Translate:
    texts = _texts(fields)
    source, target = deepl_languages(runtime, fields)
    target_code = str(fields["target_lang"]).upper()
    tag_handling = cast(
        Literal["html", "xml"] | None, _choice(fields, "tag_handling", ("html", "xml"))
    )
    default_splitting = "nonewlines" if tag_handling else "1"
    splitting = _SPLITTING[_choice(fields, "split_sentences", _SPLITTING) or default_splitting]
    model_type = _choice(fields, "model_type", _MODEL_TYPES)
    # Accepted, with nothing to do (docs/api.md): the layout is always kept; blocks are the
    # markup's own and its tag lists' (outline detection); no model reads context.
    _flag(fields, "preserve_formatting", False)
    _flag(fields, "outline_detection", True)
    _choice(fields, "tag_handling_version", ("v1", "v2"))
    _text(fields, "context")
    terms = await deepl_terms(runtime, fields, owner, source, target)
    if len(texts) > runtime.settings.max_texts:
        raise _bad(f"Too many texts: {len(texts)}; the limit is {runtime.settings.max_texts}.")
    form = Form(
        tag_handling or "text",
        splitting=splitting,
        tags=Tags(*(frozenset(_names(fields, name)) for name in _TAG_LISTS)),
    )
    billed = _flag(fields, "show_billed_characters", False)
    return _Translate(texts, source, target, target_code, form, billed, model_type, terms)


# --- Answers -----------------------------------------------------------------------------------


class DeepLTranslation(BaseModel):
    detected_source_language: str
    text: str
    billed_characters: int | None = None
    model_type_used: str | None = None


class DeepLTranslateResponse(BaseModel):
    translations: list[DeepLTranslation]


class DeepLLanguage(BaseModel):
    language: str
    name: str
    supports_formality: bool | None = None


class DeepLUsage(BaseModel):
    character_count: int
    character_limit: int


class DeepLError(BaseModel):
    message: str


_DEEPL_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": DeepLError} for status in (400, 403, 404, 413, 429, 500, 503, 504)
}


_STRING = {"type": "string"}
_STRINGS = {"oneOf": [_STRING, {"type": "array", "items": _STRING}]}
_TRANSLATE_FIELDS = {
    "text": _STRINGS,
    "source_lang": _STRING,
    "target_lang": _STRING,
    "split_sentences": {"type": "string", "enum": list(_SPLITTING)},
    "preserve_formatting": {"type": "boolean"},
    "tag_handling": {"type": "string", "enum": ["xml", "html"]},
    "ignore_tags": _STRINGS,
    "non_splitting_tags": _STRINGS,
    "splitting_tags": _STRINGS,
    "outline_detection": {"type": "boolean"},
    "formality": {"type": "string", "enum": list(_FORMALITIES)},
    "glossary_id": _STRING,
    "context": _STRING,
    "model_type": {"type": "string", "enum": list(_MODEL_TYPES)},
    "show_billed_characters": {"type": "boolean"},
    "auth_key": _STRING,
}
_TRANSLATE_SCHEMA = {
    "type": "object",
    "properties": _TRANSLATE_FIELDS,
    "required": ["text", "target_lang"],
}


def deepl_router(usage: CharacterUsage) -> APIRouter:
    """DeepL's routes, counting the characters translated in `usage`."""
    router = APIRouter(tags=["DeepL"])

    @router.post(
        "/v2/translate",
        response_model=DeepLTranslateResponse,
        response_model_exclude_none=True,
        responses=_DEEPL_ERRORS,
        openapi_extra=json_or_form_body(_TRANSLATE_SCHEMA, _TRANSLATE_SCHEMA) | KEYED,
    )
    async def deepl_translate(request: Request) -> DeepLTranslateResponse:
        """DeepL's /v2/translate: one text or many, from a given or detected language."""
        runtime = await get_runtime(request)
        header_key = await _header_key(request, await request_key(request))
        deadline = time.monotonic() + runtime.settings.request_timeout_s
        with runtime.accept():
            fields, caller = await deepl_call(request, runtime, header_key)
            body = await _translate_request(runtime, fields, caller.owner)
            texts = body.texts
            characters = sum(len(text) for text in texts)
            await runtime.access.charge(caller.stored, characters)
            found = await translate_texts(
                request, runtime, texts, body.source, body.target, {},
                deadline=deadline, form=body.form, terms=body.terms,
            )  # fmt: skip
        usage.record(caller.key, characters)
        return DeepLTranslateResponse(
            translations=[
                _translation(body, t, d, _Languages.of(runtime).codes)
                for t, d in zip(texts, found, strict=True)
            ]
        )

    async def languages(
        request: Request, runtime: RuntimeDep, header_key: HeaderKey
    ) -> list[DeepLLanguage]:
        """The served languages with DeepL's codes: as sources, or (`type=target`) as targets,
        English and Portuguese also by their regional variants; no model has formality."""
        fields, _ = await deepl_call(request, runtime, header_key)
        kind = fields.get("type", "source")
        if kind not in ("source", "target"):
            raise _bad("Parameter 'type' is invalid. 'source' and 'target' are valid values.")
        served = _Languages.of(runtime)
        if kind == "source":
            return [
                DeepLLanguage(language=code, name=_name(code)) for code in sorted(served.sources)
            ]
        return [
            DeepLLanguage(language=code, name=_name(code), supports_formality=False)
            for code in sorted(served.targets)
        ]

    for method in ("GET", "POST"):  # one route each: one OpenAPI operation each
        router.add_api_route(
            "/v2/languages",
            languages,
            methods=[method],
            response_model=list[DeepLLanguage],
            response_model_exclude_none=True,
            responses=_DEEPL_ERRORS,
        )

    async def deepl_usage(
        request: Request, runtime: RuntimeDep, header_key: HeaderKey
    ) -> DeepLUsage:
        """The characters translated with this key and its limit: a key of the key store's
        month, counted in every replica; else this process's count, without a limit
        (docs/api.md)."""
        _, caller = await deepl_call(request, runtime, header_key)
        if caller.stored is not None:
            month = (await runtime.access.quotas.usage(caller.stored)).characters_per_month
            count, limit = month.used, month.limit
        else:
            count, limit = usage.count(caller.key), usage.limit(caller.key)
        return DeepLUsage(
            character_count=count,
            character_limit=NO_CHARACTER_LIMIT if limit is None else limit,
        )

    for method in ("GET", "POST"):
        router.add_api_route(
            "/v2/usage",
            deepl_usage,
            methods=[method],
            response_model=DeepLUsage,
            responses=_DEEPL_ERRORS,
        )
    return router


def _name(code: str) -> str:
    """A DeepL code's English name: the regional variants' DeepL's, else the one LibreTranslate
    clients show, else ISO 639's (pycountry's), else the code."""
    if code in _NAMES:
        return _NAMES[code]
    if code.lower() in LANGUAGE_NAMES:
        return LANGUAGE_NAMES[code.lower()]
    kind = "alpha_2" if len(code) == 2 else "alpha_3"
    found = pycountry.languages.get(**{kind: code.lower()})
    return str(getattr(found, "name", code))


def _translation(
    body: _Translate, text: str, done: DetectedTranslation, codes: Mapping[str, str]
) -> DeepLTranslation:
    """One text's answer: the DeepL code of the language it was translated from (UND: nothing
    to detect), and the fields a request asked for."""
    model_type = None
    if body.model_type is not None:
        model_type = (
            "latency_optimized" if body.model_type == "latency_optimized" else "quality_optimized"
        )
    return DeepLTranslation(
        detected_source_language=codes.get(done.detected.language, UNDETERMINED_CODE),
        text=done.translation.texts[0],
        billed_characters=len(text) if body.billed else None,
        model_type_used=model_type,
    )
