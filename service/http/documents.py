"""The document routes: POST /documents (a file, answered 202 with the job's id), GET
/documents/{id} (its status and progress), GET /documents/{id}/result (the translated file),
DELETE /documents/{id}. The jobs are service/documents/jobs.py's; `upload` is shared with
LibreTranslate's /translate_file (service/http/libretranslate.py)."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile

from service.documents.base import Limits
from service.documents.formats import by_name, choose, extension
from service.documents.jobs import AUTO, Documents, Job
from service.documents.translate import GLOSSARY
from service.errors import ErrorType, ServiceError
from service.glossaries import owner_of
from service.http.middleware import Caller, identify, validate
from service.http.schemas import ErrorBody
from service.keys.store import ApiKey
from service.scheduling.runtime import Runtime
from service.text.terms import Terms

# Form fields besides the file: a few short values (the form parser's own limit per part).
_MAX_FIELDS = 16


async def get_documents(request: Request) -> Documents:
    documents: Documents = request.app.state.documents
    return documents


DocumentsDep = Annotated[Documents, Depends(get_documents)]

documents_router = APIRouter(tags=["Documents"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 404, 409, 413, 415, 422, 429)
}


class DocumentFields(BaseModel):
    """POST /documents's fields besides `file` (multipart/form-data, all strings)."""

    source: str = Field(AUTO, description="source language code, or auto (detected)")
    target: str = Field(description="target language code")
    beam_size: int | None = Field(None, ge=1)
    length_penalty: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False)
    max_decoding_length: int | None = Field(None, ge=1)
    no_repeat_ngram_size: int | None = Field(None, ge=0)
    glossary_id: str | None = Field(
        None, description="a glossary of this API key and language pair, enforced in decoding"
    )

    def decoding(self) -> dict[str, Any]:
        return self.model_dump(exclude={"source", "target", "glossary_id"}, exclude_none=True)


@dataclass(frozen=True)
class Sender:
    """Who sends a document: the key of the key store it is charged to (None: no limits), the
    owner of the glossaries it may name (glossaries.owner_of), and the glossary's terms where a
    compatible API has read them already (DeepL's, to answer in its own words)."""

    key: ApiKey | None
    owner: str
    terms: Terms | None = None


class Progress(BaseModel):
    done: int = Field(description="sentences translated")
    total: int = Field(description="sentences in the document (an estimate until it is done)")


class DocumentError(BaseModel):
    type: str
    message: str


class DocumentStatus(BaseModel):
    id: str
    status: str = Field(description="queued, translating, done or error")
    filename: str
    format: str
    source: str
    detected_source: str | None = Field(None, description="the language found (source auto)")
    target: str
    progress: Progress
    seconds_left: float | None = Field(None, description="an estimate while translating")
    error: DocumentError | None = None
    expires_in_s: float | None = Field(None, description="when done or failed: removed then")


async def upload(
    request: Request,
    runtime: Runtime,
    documents: Documents,
    authorize: Callable[[dict[str, Any]], Awaitable[Sender]],
    *,
    document_key: str | None = None,
) -> Job:
    """The file of a multipart request and its fields (the query string's first), checked
    (`authorize(fields)` first: the caller, and a compatible API's fields put into the native
    ones; then the file's format by its name, else the `filename` field's, and content,
    readable within the limits, a served language pair, the glossary it names), its characters
    charged to the caller's key (service/keys/), and queued with the glossary's entries as they
    are now (and a DeepL `document_key`)."""
    settings = runtime.settings
    form = await request.form(max_files=1, max_fields=_MAX_FIELDS)
    fields: dict[str, Any] = dict(request.query_params)
    for key, value in form.multi_items():
        if isinstance(value, str):
            fields.setdefault(key, value)
    sender = await authorize(fields)
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise ServiceError(ErrorType.INVALID_REQUEST, "Invalid request: missing file parameter")
    fields.pop("api_key", None)
    body = validate(DocumentFields, fields, strict=False)
    filename = (file.filename or str(fields.get("filename") or "")).replace("\\", "/")
    filename = filename.rsplit("/", 1)[-1]
    data = await file.read(settings.max_document_bytes + 1)
    if len(data) > settings.max_document_bytes:
        raise ServiceError(
            ErrorType.PAYLOAD_TOO_LARGE,
            f"the file is larger than the limit of {settings.max_document_bytes} bytes "
            "(max_document_bytes)",
        )
    format = choose(filename, file.content_type, data)
    if body.source == AUTO:
        if all(target != body.target for _, target in runtime.models):
            served = ", ".join(f"{s} -> {t}" for s, t in runtime.models)
            raise ServiceError(
                ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                f"no model translates into {body.target}; served: {served}",
            )
    elif body.source != body.target:
        runtime.model(body.source, body.target)
        runtime.decoding_options((body.source, body.target), body.decoding())
    options = body.decoding()
    terms = sender.terms
    if terms is None:
        terms = await runtime.terms(sender.owner, (body.source, body.target), body.glossary_id)
    if terms is not None:
        options[GLOSSARY] = [[e.source, e.target, e.case_sensitive] for e in terms.entries]
    # Read now, off the event loop: a broken, encrypted or too large file is a 4xx here.
    limits = Limits(max_characters=settings.max_document_characters)
    extracted = await asyncio.to_thread(format.read, data, limits)
    characters = sum(len(unit.text) for unit in extracted.units)
    if characters > limits.max_characters:
        raise ServiceError(
            ErrorType.PAYLOAD_TOO_LARGE,
            f"the document holds {characters} characters of text; the limit is "
            f"{limits.max_characters} (max_document_characters)",
        )
    await runtime.access.charge(sender.key, characters)
    return await documents.submit(
        filename or f"document{format.extensions[0]}",
        format.name,
        data,
        body.source,
        body.target,
        options,
        characters=characters,
        key=document_key,
    )


def status(job: Job, documents: Documents) -> DocumentStatus:
    now = time.time()
    error = None
    if job.error_type is not None:
        error = DocumentError(type=job.error_type, message=job.error_message or "")
    expires = None
    if job.finished is not None:
        expires = round(max(0.0, job.finished + documents.settings.document_ttl_s - now), 1)
    return DocumentStatus(
        id=job.id,
        status=job.status,
        filename=job.filename,
        format=job.format,
        source=job.source,
        detected_source=job.detected,
        target=job.target,
        progress=Progress(done=job.done, total=job.total),
        seconds_left=job.seconds_left(now),
        error=error,
        expires_in_s=expires,
    )


_FILE = {"type": "string", "format": "binary"}


def multipart_body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An upload's request body for the OpenAPI schema (the form is parsed by hand)."""
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


def result_name(job: Job) -> str:
    """The sent file's name with the target language before its extension: report.de.docx."""
    suffix = extension(job.filename)
    stem = job.filename[: len(job.filename) - len(suffix)] if suffix else job.filename
    return f"{stem}.{job.target}{suffix or by_name(job.format).extensions[0]}"


async def result_response(id: str, documents: Documents) -> Response:
    """The translated file, named for download (`result_name`)."""
    job, data = await documents.result(id)
    name = result_name(job)
    quoted = urllib.parse.quote(name)
    disposition = (
        f'attachment; filename="{name}"'
        if quoted == name
        else f"attachment; filename*=utf-8''{quoted}"
    )
    return Response(
        data,
        media_type=by_name(job.format).media_type,
        headers={"Content-Disposition": disposition},
    )


@documents_router.post(
    "/documents",
    status_code=202,
    response_model=DocumentStatus,
    response_model_exclude_none=True,
    responses=_ERRORS,
    openapi_extra=multipart_body(
        {"file": _FILE, **DocumentFields.model_json_schema()["properties"]}, ["file", "target"]
    ),
)
async def post_document(request: Request, documents: DocumentsDep, caller: Caller) -> JSONResponse:
    """Queue a file for translation; its status is at the answer's Location."""

    async def authorize(fields: dict[str, Any]) -> Sender:
        return Sender(caller.stored, owner_of(caller.key))

    job = await upload(request, caller.runtime, documents, authorize)
    body = status(job, documents).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=202, headers={"Location": f"/documents/{job.id}"})


@documents_router.get(
    "/documents/{id}",
    response_model=DocumentStatus,
    response_model_exclude_none=True,
    responses=_ERRORS,
    dependencies=[Depends(identify)],
)
async def get_document(id: str, documents: DocumentsDep) -> DocumentStatus:
    """The job's status, its progress in sentences, and an estimate of the time left."""
    return status(await documents.get(id), documents)


@documents_router.get(
    "/documents/{id}/result",
    responses={200: {"content": {"application/octet-stream": {}}}, **_ERRORS},
    response_class=Response,
    dependencies=[Depends(identify)],
)
async def get_result(id: str, documents: DocumentsDep) -> Response:
    """The translated file, as the file sent with its text translated (409 until done)."""
    return await result_response(id, documents)


@documents_router.delete(
    "/documents/{id}",
    status_code=204,
    responses=_ERRORS,
    dependencies=[Depends(identify)],
)
async def delete_document(id: str, documents: DocumentsDep) -> Response:
    """Stop the job if it runs and remove its files."""
    await documents.delete(id)
    return Response(status_code=204)
