"""`create_app(settings)`: the FastAPI app, its routers and middlewares, and a lifespan that loads
the models, starts the batchers, warms up, and on shutdown answers what was accepted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.documents.jobs import Documents
from service.http.deepl import InProcessUsage, deepl_face, deepl_router
from service.http.deepl_documents import deepl_document_router
from service.http.deepl_glossaries import deepl_glossary_router
from service.http.docs_ui import docs_router
from service.http.documents import documents_router
from service.http.errors import ErrorRenderer, install_error_handlers
from service.http.glossaries import glossary_router
from service.http.libretranslate import libretranslate_face, libretranslate_router
from service.http.middleware import (
    BodyLimitMiddleware,
    HttpMetricsMiddleware,
    LargeBodyGate,
    ResponseHeadersMiddleware,
)
from service.http.routes import router
from service.http.web_ui import PAGE_PATH, web_router
from service.inference.models import load_models
from service.metrics import Metrics
from service.scheduling.runtime import Runtime, TranslationModel
from service.settings import Settings

log = logging.getLogger(__name__)

# Bodies over this (64 KiB: some 15,000 words) take turns (service.http.middleware.LargeBodyGate).
LARGE_BODY_BYTES = 1 << 16
LARGE_BODY_HOLD_S = 0.05
UPLOAD_OVERHEAD_BYTES = 1 << 16


def create_app(settings: Settings, *, models: Sequence[TranslationModel] | None = None) -> FastAPI:
    """The service for `settings`. `models` replaces loading the bundles (tests pass fakes or
    engines they already hold)."""
    metrics = Metrics(aggregate=settings.workers > 1)
    faces = []
    if settings.libretranslate_prefix:
        faces.append(libretranslate_face(settings.libretranslate_prefix))
    if settings.deepl:
        faces.append(deepl_face(settings.deepl_prefix))
    renderer = ErrorRenderer(metrics, settings.retry_after_s, faces)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = models
        if loaded is None:
            loaded = await asyncio.to_thread(load_models, settings)
        runtime = Runtime(settings, metrics, loaded)
        documents: Documents | None = None
        try:
            await runtime.start()
            app.state.runtime = runtime
            documents = Documents.open(settings, runtime, metrics)
            app.state.documents = documents
            documents.start()
            log.info("ready: %s", runtime.describe())
            yield
        finally:
            if documents is not None:  # documents in progress stay in the store, queued again
                await documents.stop()
            await runtime.shutdown(settings.drain_timeout_s)

    app = FastAPI(
        title="transformer-mt",
        description="Machine translation with a from-scratch Transformer on ONNX Runtime.",
        version="0.1.0",
        lifespan=lifespan,
        # /translate/ is a 404, not a redirect whose Location echoes the Host header and the
        # query string (which may hold an api_key).
        redirect_slashes=False,
        # Swagger UI from the package (service/http/static), not a CDN: the service runs offline.
        docs_url=None,
        redoc_url=None,
    )
    app.state.metrics = metrics
    app.include_router(router)
    app.include_router(glossary_router)
    app.include_router(documents_router)
    app.include_router(docs_router(app.openapi_url or "/openapi.json", app.title))
    if settings.libretranslate_prefix:
        app.include_router(libretranslate_router, prefix=settings.libretranslate_prefix)
    if settings.deepl:
        # Characters counted in this process (a worker's own) until shared quotas replace it.
        usage = InProcessUsage()
        app.include_router(deepl_router(usage), prefix=settings.deepl_prefix)
        app.include_router(deepl_glossary_router, prefix=settings.deepl_prefix)
        app.include_router(deepl_document_router(usage), prefix=settings.deepl_prefix)
    if settings.web_ui:
        app.include_router(web_router())
    install_error_handlers(app, renderer)
    # The last added is the outermost: metrics see every answer, CORS and 413s included.
    # Inside the body limit: a body over it is refused at once, not after waiting its turn.
    app.add_middleware(LargeBodyGate, threshold=LARGE_BODY_BYTES, hold_s=LARGE_BODY_HOLD_S)
    # A document's upload, on every route that takes a file: its file, and room for the
    # multipart framing and fields.
    upload = settings.max_document_bytes + UPLOAD_OVERHEAD_BYTES
    schema = app.openapi()  # every router is in: the routes are known
    uploads = dict.fromkeys(file_uploads(schema), upload)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, renderer=renderer, uploads=uploads
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key"],
            expose_headers=["Retry-After"],  # when a page's script may retry a 429 or 503
        )
    app.add_middleware(ResponseHeadersMiddleware)
    routes = frozenset(schema["paths"]) | {"/docs", "/openapi.json"}
    if settings.web_ui:
        routes |= {PAGE_PATH}
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics, routes=routes)
    return app


def file_uploads(schema: dict[str, Any]) -> set[str]:
    """The paths of `schema` (an OpenAPI document) with a request body that has a file (a
    binary field, `format: binary` in OpenAPI 3.0's words, a `contentMediaType` in 3.1's): the
    routes that take a document. A body is written inline or, as FastAPI writes an
    `UploadFile` parameter's, as a reference to the document's components."""
    components = schema.get("components", {}).get("schemas", {})

    def fields(body: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in body:
            body = components[body["$ref"].removeprefix("#/components/schemas/")]
        properties: dict[str, Any] = body.get("properties", {})
        return properties

    return {
        path
        for path, operations in schema["paths"].items()
        for operation in operations.values()
        for body in operation.get("requestBody", {}).get("content", {}).values()
        if any(
            p.get("format") == "binary" or "contentMediaType" in p
            for p in fields(body["schema"]).values()
        )
    }
