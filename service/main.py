"""`create_app(settings)`: the FastAPI app, its routers and middlewares, and a lifespan that loads
the models, starts the batchers, warms up, and on shutdown answers what was accepted."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.api import (
    BodyLimitMiddleware,
    HttpMetricsMiddleware,
    Runtime,
    TranslationModel,
    libretranslate_router,
    router,
)
from service.bundle import MANIFEST_FILE, BundleError
from service.errors import ErrorRenderer, install_error_handlers
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, models: Sequence[TranslationModel] | None = None) -> FastAPI:
    """The service for `settings`. `models` replaces loading the bundles (tests pass fakes or
    engines they already hold)."""
    metrics = Metrics()
    renderer = ErrorRenderer(metrics, settings.retry_after_s, settings.libretranslate_prefix)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = models
        if loaded is None:
            loaded = await asyncio.to_thread(load_models, settings)
        runtime = Runtime(settings, metrics, loaded)
        try:
            await runtime.start()
            app.state.runtime = runtime
            log.info("ready: %s", ", ".join(f"{s} -> {t}" for s, t in runtime.models))
            yield
        finally:
            await runtime.shutdown(settings.drain_timeout_s)

    app = FastAPI(
        title="transformer-mt",
        description="Machine translation with a from-scratch Transformer on ONNX Runtime.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.metrics = metrics
    app.include_router(router)
    if settings.libretranslate_prefix:
        app.include_router(libretranslate_router, prefix=settings.libretranslate_prefix)
    install_error_handlers(app, renderer)
    # The last added is the outermost: metrics see every answer, CORS and 413s included.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, renderer=renderer)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key"],
        )
    routes = frozenset(path for path in app.openapi()["paths"]) | {"/docs", "/openapi.json"}
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics, routes=routes)
    return app


def load_models(settings: Settings) -> list[TranslationModel]:
    # Imported here: the engine pulls in ONNX Runtime, which apps built on fakes never need.
    from service.engine import Engine

    directories = settings.bundle or [shipped_bundle(settings.checkpoint, settings.shipped_bundle)]
    return [
        Engine.load(
            directory,
            device=settings.device,
            device_id=settings.device_id,
            intra_op_threads=settings.intra_op_threads,
            io_binding=settings.io_binding,
            max_batch_size=settings.max_batch_size,
        )
        for directory in directories
    ]


def shipped_bundle(checkpoint: Path, bundle: Path) -> Path:
    """The shipped model's bundle, exported from its checkpoint on first start.

    The export runs `python -m export` in a subprocess: it needs torch, which the service never
    imports, so a serving image without it gets a clear error instead of an ImportError.
    """
    if (bundle / MANIFEST_FILE).is_file():
        return bundle
    if not checkpoint.is_dir():
        raise BundleError(f"no bundle given (--bundle DIR) and no checkpoint at {checkpoint}")
    if importlib.util.find_spec("export") is None or importlib.util.find_spec("torch") is None:
        raise BundleError(
            f"{bundle} does not exist and building it from {checkpoint} needs the export "
            "package with torch (pip install -e '.[train]'); or pass --bundle DIR"
        )
    log.info("exporting %s to %s (first start)", checkpoint, bundle)
    command = [
        sys.executable,
        "-m",
        "export",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(bundle),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundleError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return bundle
