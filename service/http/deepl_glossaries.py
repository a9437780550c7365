"""DeepL's glossary endpoints over the service's glossaries (service/glossaries.py: the same
store, ids and owners as /glossaries): v2's (POST/GET /v2/glossaries, GET/DELETE
/v2/glossaries/{id}, GET /v2/glossaries/{id}/entries as TSV, GET /v2/glossary-language-pairs)
and v3's multilingual ones as DeepL's clients call them (POST/GET /v3/glossaries, GET/DELETE
/v3/glossaries/{id}, GET /v3/glossaries/{id}/entries). A glossary here holds one language pair:
a v3 glossary is made of one dictionary. A glossary belongs to the key that made it: another
key's is DeepL's 404.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any, cast

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from service.errors import ErrorType, ServiceError
from service.glossaries import EntriesFormat, Glossary, parse_entries
from service.http.deepl import (
    DeepLCaller,
    DeepLError,
    HeaderKey,
    deepl_call,
    deepl_code,
    deepl_languages,
    glossary_not_found,
)
from service.http.middleware import RuntimeDep
from service.scheduling.runtime import Runtime

deepl_glossary_router = APIRouter(tags=["DeepL"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": DeepLError} for status in (400, 403, 404, 413, 456, 500)
}
_TSV = "text/tab-separated-values; charset=utf-8"


class DeepLGlossary(BaseModel):
    glossary_id: str
    name: str
    ready: bool
    source_lang: str
    target_lang: str
    creation_time: str
    entry_count: int


class DeepLGlossaries(BaseModel):
    glossaries: list[DeepLGlossary]


class DeepLDictionary(BaseModel):
    source_lang: str
    target_lang: str
    entry_count: int


class DeepLMultilingualGlossary(BaseModel):
    glossary_id: str
    name: str
    dictionaries: list[DeepLDictionary]
    creation_time: str


class DeepLMultilingualGlossaries(BaseModel):
    glossaries: list[DeepLMultilingualGlossary]


class DeepLDictionaryEntries(BaseModel):
    source_lang: str
    target_lang: str
    entries: str
    entries_format: str = "tsv"


class DeepLGlossaryEntries(BaseModel):
    dictionaries: list[DeepLDictionaryEntries]


class DeepLLanguagePair(BaseModel):
    source_lang: str
    target_lang: str


class DeepLLanguagePairs(BaseModel):
    supported_languages: list[DeepLLanguagePair]


def _bad(message: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, message)


def _creation_time(glossary: Glossary) -> str:
    """DeepL's timestamp: UTC with milliseconds and a Z ("2021-08-03T14:16:18.329Z"), which
    its clients parse with their fractional seconds and zone."""
    created = datetime.datetime.fromtimestamp(glossary.created, datetime.UTC)
    return created.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pair_codes(runtime: Runtime, glossary: Glossary) -> tuple[str, str]:
    return deepl_code(runtime, glossary.source), deepl_code(runtime, glossary.target)


def _v2(runtime: Runtime, glossary: Glossary) -> DeepLGlossary:
    source, target = _pair_codes(runtime, glossary)
    return DeepLGlossary(
        glossary_id=glossary.id,
        name=glossary.name,
        ready=True,  # made whole, at once
        source_lang=source,
        target_lang=target,
        creation_time=_creation_time(glossary),
        entry_count=len(glossary.entries),
    )


def _v3(runtime: Runtime, glossary: Glossary) -> DeepLMultilingualGlossary:
    source, target = _pair_codes(runtime, glossary)
    dictionary = DeepLDictionary(
        source_lang=source, target_lang=target, entry_count=len(glossary.entries)
    )
    return DeepLMultilingualGlossary(
        glossary_id=glossary.id,
        name=glossary.name,
        dictionaries=[dictionary],
        creation_time=_creation_time(glossary),
    )


def _tsv(glossary: Glossary) -> str:
    return "\n".join(f"{entry.source}\t{entry.target}" for entry in glossary.entries)


def _string(fields: Mapping[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"Missing or invalid argument: {name}")
    return value


async def _create(
    runtime: Runtime, caller: DeepLCaller, name: str, fields: Mapping[str, Any]
) -> Glossary:
    """A glossary of the pair `source_lang` -> `target_lang` from `entries` in
    `entries_format` (DeepL's TSV or CSV), checked as the native API checks one."""
    entries_format = _string(fields, "entries_format")
    if entries_format not in ("tsv", "csv"):
        raise _bad("Unsupported entry format specified")
    entries = _string(fields, "entries")
    _string(fields, "source_lang")  # required: a glossary's source is never detected
    source, target = deepl_languages(runtime, fields)
    assert source is not None  # given
    codes = (deepl_code(runtime, source), deepl_code(runtime, target))
    parsed = parse_entries(entries, cast(EntriesFormat, entries_format), codes)
    return await runtime.create_glossary(caller.owner, name, (source, target), parsed)


async def _owned(
    request: Request, runtime: Runtime, header_key: str | None, glossary_id: str
) -> tuple[Glossary, dict[str, Any], DeepLCaller]:
    """The caller's glossary `glossary_id` (another key's is not found), the request's fields
    and its caller."""
    fields, caller = await deepl_call(request, runtime, header_key)
    try:
        return await runtime.glossaries.get(caller.owner, glossary_id), fields, caller
    except ServiceError:
        raise glossary_not_found(glossary_id) from None


async def _oldest_first(
    request: Request, runtime: Runtime, header_key: str | None
) -> list[Glossary]:
    """The caller's glossaries, oldest first."""
    _, caller = await deepl_call(request, runtime, header_key)
    return sorted(await runtime.glossaries.store.list(caller.owner), key=lambda g: g.created)


@deepl_glossary_router.post(
    "/v2/glossaries", status_code=201, response_model=DeepLGlossary, responses=_ERRORS
)
async def create_glossary(
    request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> DeepLGlossary:
    """A glossary from DeepL's TSV or CSV entries (JSON or form fields)."""
    fields, caller = await deepl_call(request, runtime, header_key)
    return _v2(runtime, await _create(runtime, caller, _string(fields, "name"), fields))


@deepl_glossary_router.get(
    "/v2/glossaries/{glossary_id}/entries",
    response_class=Response,
    responses={200: {"content": {"text/tab-separated-values": {}}}, **_ERRORS},
)
async def glossary_entries(
    glossary_id: str, request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> Response:
    """The entries as TSV, a source and its target term a line."""
    glossary, _, _ = await _owned(request, runtime, header_key, glossary_id)
    return Response(_tsv(glossary), media_type=_TSV)


@deepl_glossary_router.get(
    "/v2/glossary-language-pairs", response_model=DeepLLanguagePairs, responses=_ERRORS
)
async def glossary_language_pairs(
    request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> DeepLLanguagePairs:
    """The served pairs, which glossaries may be made for."""
    await deepl_call(request, runtime, header_key)
    pairs = sorted({(deepl_code(runtime, s), deepl_code(runtime, t)) for s, t in runtime.models})
    return DeepLLanguagePairs(
        supported_languages=[DeepLLanguagePair(source_lang=s, target_lang=t) for s, t in pairs]
    )


@deepl_glossary_router.post(
    "/v3/glossaries", status_code=201, response_model=DeepLMultilingualGlossary, responses=_ERRORS
)
async def create_multilingual_glossary(
    request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> DeepLMultilingualGlossary:
    """A glossary of one dictionary (`dictionaries`: its language pair, entries and their
    format)."""
    fields, caller = await deepl_call(request, runtime, header_key)
    name = _string(fields, "name")
    dictionaries = fields.get("dictionaries")
    if not isinstance(dictionaries, list) or not dictionaries:
        raise _bad("Missing or invalid argument: dictionaries")
    if len(dictionaries) > 1 or not isinstance(dictionaries[0], dict):
        raise _bad("A glossary of this service holds one dictionary (one language pair).")
    return _v3(runtime, await _create(runtime, caller, name, dictionaries[0]))


@deepl_glossary_router.get(
    "/v3/glossaries/{glossary_id}/entries", response_model=DeepLGlossaryEntries, responses=_ERRORS
)
async def multilingual_glossary_entries(
    glossary_id: str, request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> DeepLGlossaryEntries:
    """The entries of the dictionary `source_lang` -> `target_lang` (the glossary's one), as
    TSV."""
    glossary, fields, _ = await _owned(request, runtime, header_key, glossary_id)
    source, target = _pair_codes(runtime, glossary)
    asked = (_string(fields, "source_lang").lower(), _string(fields, "target_lang").lower())
    if asked != (source, target):
        raise ServiceError(
            ErrorType.NOT_FOUND, f"The glossary has no dictionary {asked[0]} -> {asked[1]}"
        )
    entries = DeepLDictionaryEntries(source_lang=source, target_lang=target, entries=_tsv(glossary))
    return DeepLGlossaryEntries(dictionaries=[entries])


async def delete_glossary(
    glossary_id: str, request: Request, runtime: RuntimeDep, header_key: HeaderKey
) -> Response:
    _, _, caller = await _owned(request, runtime, header_key, glossary_id)
    await runtime.glossaries.delete(caller.owner, glossary_id)
    return Response(status_code=204)


def _read_routes(
    version: str,
    shape: Callable[[Runtime, Glossary], BaseModel],
    one: type[BaseModel],
    many: type[DeepLGlossaries | DeepLMultilingualGlossaries],
) -> None:
    """A version's list, get and delete routes, its glossaries in `shape`."""

    async def list_glossaries(
        request: Request, runtime: RuntimeDep, header_key: HeaderKey
    ) -> BaseModel:
        """This key's glossaries, oldest first."""
        found = await _oldest_first(request, runtime, header_key)
        return many.model_validate({"glossaries": [shape(runtime, g) for g in found]})

    async def get_glossary(
        glossary_id: str, request: Request, runtime: RuntimeDep, header_key: HeaderKey
    ) -> BaseModel:
        return shape(runtime, (await _owned(request, runtime, header_key, glossary_id))[0])

    path = f"/{version}/glossaries"
    add = deepl_glossary_router.add_api_route
    add(path, list_glossaries, methods=["GET"], response_model=many, responses=_ERRORS)
    add(f"{path}/{{glossary_id}}", get_glossary, methods=["GET"], response_model=one,
        responses=_ERRORS)  # fmt: skip
    add(f"{path}/{{glossary_id}}", delete_glossary, methods=["DELETE"], status_code=204,
        responses=_ERRORS)  # fmt: skip


_read_routes("v2", _v2, DeepLGlossary, DeepLGlossaries)
_read_routes("v3", _v3, DeepLMultilingualGlossary, DeepLMultilingualGlossaries)
