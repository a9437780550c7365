"""DeepL's document endpoints over the service's document jobs (service/documents/jobs.py, the
same as POST /documents): POST /v2/document (multipart: `file`, `source_lang`, `target_lang`,
`filename`) answers the job's `document_id` and a `document_key`; POST /v2/document/{id}
answers its status with `seconds_remaining`, `billed_characters` and `error_message`; POST
/v2/document/{id}/result the translated file, which is then removed, as DeepL removes it. The
id without its key is DeepL's 404; a result not ready yet its 503. A document's characters are
charged to the caller's key when it is sent. A `glossary_id` (the caller's, of the pair, with
`source_lang` given, as /v2/translate takes it) is enforced in the document's decoding.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.background import BackgroundTask

from service.documents.jobs import AUTO, Documents, Job
from service.errors import ErrorType, ServiceError
from service.http.deepl import (
    CharacterUsage,
    DeepLError,
    HeaderKey,
    deepl_call,
    deepl_key,
    deepl_languages,
    deepl_terms,
)
from service.http.documents import (
    DocumentsDep,
    Sender,
    multipart_body,
    result_response,
    upload,
)
from service.http.middleware import RuntimeDep

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": DeepLError} for status in (400, 403, 404, 413, 415, 429, 456, 503)
}
_STRING = {"type": "string"}


class DeepLDocumentHandle(BaseModel):
    document_id: str
    document_key: str


class DeepLDocumentStatus(BaseModel):
    document_id: str
    status: str  # queued, translating, done, error
    seconds_remaining: int | None = None
    billed_characters: int | None = None
    error_message: str | None = None


async def _owned(documents: Documents, document_id: str, fields: dict[str, Any]) -> Job:
    """The job `document_id` if the request's `document_key` is its key; else DeepL's 404."""
    job = None
    with contextlib.suppress(ServiceError):
        job = await documents.get(document_id)
    given = fields.get("document_key")
    if (
        job is None
        or job.key is None
        or not isinstance(given, str)
        or not hmac.compare_digest(job.key.encode(), given.encode())
    ):
        raise ServiceError(ErrorType.NOT_FOUND, "Document not found")
    return job


def deepl_document_router(usage: CharacterUsage) -> APIRouter:
    """DeepL's document routes, counting the characters sent in `usage` (as /v2/translate)."""
    router = APIRouter(tags=["DeepL"])

    @router.post(
        "/v2/document",
        response_model=DeepLDocumentHandle,
        responses=_ERRORS,
        openapi_extra=multipart_body(
            {
                "file": {"type": "string", "format": "binary"},
                **{
                    name: _STRING
                    for name in (
                        "source_lang",
                        "target_lang",
                        "filename",
                        "formality",
                        "glossary_id",
                    )
                },
            },
            ["file", "target_lang"],
        ),
    )
    async def deepl_upload(
        request: Request, runtime: RuntimeDep, documents: DocumentsDep, header_key: HeaderKey
    ) -> DeepLDocumentHandle:
        """Queue a file for translation: its id and the key its status and result need."""
        caller_key: str | None = None

        async def authorize(fields: dict[str, Any]) -> Sender:
            nonlocal caller_key
            caller = await deepl_key(runtime, request, fields, header_key)
            caller_key = caller.key
            if fields.get("output_format"):
                raise ServiceError(
                    ErrorType.INVALID_REQUEST,
                    "Value for 'output_format' not supported: a document is translated into "
                    "its own format.",
                )
            source, target = deepl_languages(runtime, fields)
            terms = await deepl_terms(runtime, fields, caller.owner, source, target)
            filename = fields.get("filename")
            fields.clear()  # DeepL's fields, read: the native ones for `upload`
            fields.update(source=source or AUTO, target=target, filename=filename)
            return Sender(caller.stored, caller.owner, terms)

        with runtime.accept():
            document_key = secrets.token_hex(16)
            job = await upload(request, runtime, documents, authorize, document_key=document_key)
        usage.record(caller_key, job.characters)
        return DeepLDocumentHandle(document_id=job.id, document_key=document_key)

    async def deepl_status(
        document_id: str,
        request: Request,
        runtime: RuntimeDep,
        documents: DocumentsDep,
        header_key: HeaderKey,
    ) -> DeepLDocumentStatus:
        """The job's status; the time left while it is translated, the characters billed
        when it is done, why it failed when it did."""
        fields, _ = await deepl_call(request, runtime, header_key)
        job = await _owned(documents, document_id, fields)
        left = job.seconds_left(time.time())
        return DeepLDocumentStatus(
            document_id=job.id,
            status=job.status,
            seconds_remaining=None if left is None else round(left),
            billed_characters=job.characters if job.status == "done" else None,
            error_message=job.error_message if job.status == "error" else None,
        )

    async def deepl_result(
        document_id: str,
        request: Request,
        runtime: RuntimeDep,
        documents: DocumentsDep,
        header_key: HeaderKey,
    ) -> Response:
        """The translated file, once; removed when it has been sent."""
        fields, _ = await deepl_call(request, runtime, header_key)
        job = await _owned(documents, document_id, fields)
        if job.status in ("queued", "translating"):
            raise ServiceError(ErrorType.DOCUMENT_NOT_READY, "Document translation is not done")
        response = await result_response(job.id, documents)
        response.background = BackgroundTask(_remove, documents, job.id)
        return response

    for method in ("GET", "POST"):  # DeepL's clients POST; its reference also names GET
        router.add_api_route(
            "/v2/document/{document_id}",
            deepl_status,
            methods=[method],
            response_model=DeepLDocumentStatus,
            response_model_exclude_none=True,
            responses=_ERRORS,
        )
        router.add_api_route(
            "/v2/document/{document_id}/result",
            deepl_result,
            methods=[method],
            response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}}, **_ERRORS},
        )
    return router


async def _remove(documents: Documents, id: str) -> None:
    with contextlib.suppress(ServiceError):  # removed meanwhile
        await documents.delete(id)
