"""The glossary routes: POST /glossaries (from entries, DeepL's TSV or CSV), GET /glossaries,
GET /glossaries/{id}, GET /glossaries/{id}/entries, DELETE /glossaries/{id}. A glossary
belongs to the API key that made it (service/glossaries.py): another key's is a 404."""

from __future__ import annotations

import datetime
from typing import Any

from fastapi import APIRouter, Request, Response

from service.glossaries import Entry, Glossary, owner_of, parse_entries
from service.http.middleware import Caller, read_json, validate
from service.http.schemas import (
    ErrorBody,
    GlossaryEntries,
    GlossaryEntry,
    GlossaryList,
    GlossaryOut,
    GlossaryRequest,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 404, 413, 422, 500)
}

glossary_router = APIRouter(prefix="/glossaries", tags=["glossaries"])


def _out(glossary: Glossary) -> GlossaryOut:
    created = datetime.datetime.fromtimestamp(glossary.created, datetime.UTC)
    return GlossaryOut(
        glossary_id=glossary.id,
        name=glossary.name,
        source=glossary.source,
        target=glossary.target,
        entry_count=len(glossary.entries),
        creation_time=created.isoformat(timespec="seconds"),
    )


@glossary_router.post(
    "",
    status_code=201,
    response_model=GlossaryOut,
    responses=_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": GlossaryRequest.model_json_schema()}},
        }
    },
)
async def create_glossary(request: Request, caller: Caller) -> GlossaryOut:
    """A glossary for one language pair; each target term must be one its model can spell."""
    body = validate(GlossaryRequest, await read_json(request))
    pair = (body.source, body.target)
    if isinstance(body.entries, str):
        entries = parse_entries(body.entries, body.entries_format, pair)
    else:
        entries = [entry.entry() for entry in body.entries]
    glossary = await caller.runtime.create_glossary(owner_of(caller.key), body.name, pair, entries)
    return _out(glossary)


@glossary_router.get("", response_model=GlossaryList, responses=_ERRORS)
async def list_glossaries(caller: Caller) -> GlossaryList:
    """This API key's glossaries, oldest first."""
    found = await caller.runtime.glossaries.store.list(owner_of(caller.key))
    return GlossaryList(glossaries=[_out(g) for g in sorted(found, key=lambda g: g.created)])


@glossary_router.get("/{glossary_id}", response_model=GlossaryOut, responses=_ERRORS)
async def get_glossary(glossary_id: str, caller: Caller) -> GlossaryOut:
    return _out(await caller.runtime.glossaries.get(owner_of(caller.key), glossary_id))


@glossary_router.get("/{glossary_id}/entries", response_model=GlossaryEntries, responses=_ERRORS)
async def glossary_entries(glossary_id: str, caller: Caller) -> GlossaryEntries:
    glossary = await caller.runtime.glossaries.get(owner_of(caller.key), glossary_id)
    return GlossaryEntries(entries=[_entry(e) for e in glossary.entries])


def _entry(entry: Entry) -> GlossaryEntry:
    return GlossaryEntry(
        source=entry.source, target=entry.target, case_sensitive=entry.case_sensitive
    )


@glossary_router.delete("/{glossary_id}", status_code=204, responses=_ERRORS)
async def delete_glossary(glossary_id: str, caller: Caller) -> Response:
    await caller.runtime.glossaries.delete(owner_of(caller.key), glossary_id)
    return Response(status_code=204)
