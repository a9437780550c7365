"""The server: uvicorn with this service's connection limits (service/http/connections.py), a
SIGTERM that drains, and an access log with API keys redacted. `python -m service` (the
module's __main__) builds the app and runs it here.

SIGTERM drains: /ready turns 503 and new requests get 503 while every accepted request is
translated and answered; then the server exits, all within `--drain-timeout-s`; a request still
open when that time is up is answered 503 (Retry-After) before the connections close. A SIGTERM
or SIGINT during the drain (or during uvicorn's own shutdown) stops at once: open connections
are not waited for nor answered, and the process dies of that signal. A first SIGINT is
uvicorn's own graceful shutdown, bounded by `--drain-timeout-s` too.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import resource
import signal
import socket
import time
from types import FrameType
from urllib.parse import unquote_plus

import uvicorn
from fastapi import FastAPI

from service.http.connections import guarded_protocol
from service.metrics import Metrics
from service.scheduling.runtime import Runtime
from service.settings import Settings

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM lets the app finish its accepted requests while
    the port stays open (so new requests get a 503, not a refused connection)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What the start loaded (models, tokenizers, the app: some 130,000 objects with the
        # shipped model) lives as long as the process: out of the garbage collector's way.
        # Else every full collection walks it (80 ms, about every 600 cached requests: 15 % of
        # the event loop's time, and an 80 ms stall for every request in flight).
        gc.collect()
        gc.freeze()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.should_exit:
            # A second signal: uvicorn's own handler would only set should_exit again, and its
            # wait for open connections has no bound until the drain sets one; and its forced
            # exit answers open requests 500 on its way down. Die of the signal now.
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
            return
        if sig == signal.SIGTERM and self._loop is not None:
            self._draining = True
            # A signal handler runs between bytecodes of the loop's thread: hand over to the loop.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        # Held here: the event loop keeps only a weak reference to its tasks.
        self._drain_task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        end = time.monotonic() + self._drain_timeout_s
        runtime: Runtime | None = getattr(self._app.state, "runtime", None)
        log.info("SIGTERM: finishing accepted requests (up to %.0f s)", self._drain_timeout_s)
        if runtime is not None:
            await runtime.finish_requests(self._drain_timeout_s)
        # What is left of the timeout bounds uvicorn's wait for open connections.
        self.config.timeout_graceful_shutdown = max(1, round(end - time.monotonic()))
        self.should_exit = True


# Descriptors the process needs besides its connections: models, threads' pipes, logs, the
# listening socket, connections being refused.
_SPARE_FILES = 256


class RedactApiKeys(logging.Filter):
    """Access-log lines show `api_key=***` (`auth_key=***`) for a key sent in the query string
    (LibreTranslate's and DeepL's clients may send it there): a key must not end up in log
    storage. A parameter is a key by
    its decoded name, in any case (`API_KEY`, and `%61pi_key`, which the route reads as a key)."""

    _PARAMETER = re.compile(r"([?&][^=&#]*)=([^&#]*)")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                self._PARAMETER.sub(self._redacted, arg) if isinstance(arg, str) else arg
                for arg in record.args
            )
        return True

    @staticmethod
    def _redacted(parameter: re.Match[str]) -> str:
        name = parameter[1]
        key = unquote_plus(name[1:]).lower() in ("api_key", "auth_key")
        return f"{name}=***" if key else parameter[0]


def fit_open_files(max_connections: int) -> int:
    """Raise the open-file limit to what `max_connections` needs (up to the hard limit); returns
    the connection limit that fits, lowered (with a warning) when the hard limit is smaller."""
    needed = max_connections + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d: %s", soft, e)
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitted = max(1, soft - _SPARE_FILES)
        log.warning(
            "max_connections %d lowered to %d: the open-file limit is %d (ulimit -n)",
            max_connections,
            fitted,
            soft,
        )
        return fitted
    return max_connections


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings from ours: the httptools protocol with our connection limits (see
    service/http/connections.py). The graceful-shutdown bound is the drain's: the SIGTERM drain
    narrows it to what is left of the drain; a SIGINT shutdown keeps all of it."""
    metrics: Metrics = app.state.metrics
    protocol = guarded_protocol(
        max_connections=fit_open_files(settings.max_connections),
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        retry_after_s=settings.retry_after_s,
        on_event=metrics.connection_event,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        http=protocol,
        ws="none",  # no WebSocket routes: an Upgrade request stays an HTTP request
        server_header=False,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        backlog=settings.backlog,
        limit_concurrency=settings.limit_concurrency,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    # After the Config: it (re)configures uvicorn's loggers.
    logging.getLogger("uvicorn.access").addFilter(RedactApiKeys())
    return config
