"""Document jobs: a directory per job under `documents_dir` (the file sent, its state as JSON,
the result), translated by background workers in the app's lifespan.

The state on disk is the truth: any process serving that directory (`--workers`) answers a
job's status, result and deletion; the process translating a job holds an exclusive lock on its
`lock` file, so a job is translated by one process at a time, and a job whose process died
(a restart, a crash) has its lock free again: a worker takes it up where its state says (queued
or translating: from the start) at its next look. A job that cannot be read back is not
dropped silently: it is reported as failed, with the reason. Jobs are bounded in count and bytes
(`max_documents`, `max_documents_bytes`: 429 beyond), and removed `document_ttl_s` after they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.documents.base import Limits
from service.documents.formats import by_name
from service.documents.translate import Progress, count_sentences, detect_source, translate_units
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.scheduling.runtime import Runtime
from service.settings import Settings

log = logging.getLogger(__name__)

Status = Literal["queued", "translating", "done", "error"]
AUTO = "auto"
# How often workers look for jobs no process holds (another's, one left by a restart) and
# remove expired ones.
SCAN_S = 2.0
# Progress is written to disk at most this often (a status request reads it from there).
SAVE_PROGRESS_S = 0.5
# Starts of one job (each restart takes up a job left unfinished) before it is failed.
MAX_ATTEMPTS = 3
_STATE, _SOURCE, _RESULT, _LOCK = "job.json", "source", "result", "lock"


@dataclass
class Job:
    """A job's state, as job.json holds it."""

    id: str
    filename: str
    format: str
    source: str  # a language code or "auto"
    target: str
    options: dict[str, Any]
    created: float  # time.time()
    status: Status = "queued"
    detected: str | None = None  # the source language found when `source` is "auto"
    started: float | None = None
    finished: float | None = None
    done: int = 0  # sentences translated
    total: int = 0  # sentences in all (estimated until done)
    error_type: str | None = None
    error_message: str | None = None
    size: int = 0  # bytes of the file sent and its result
    attempts: int = 0  # times a worker started it (MAX_ATTEMPTS)
    characters: int = 0  # of text in the file sent (charged to the key that sent it)
    key: str | None = None  # a DeepL upload's document_key, which its status and result need

    def seconds_left(self, now: float) -> float | None:
        """At the pace so far; None until a sentence is done."""
        if self.status != "translating" or self.started is None or not self.done:
            return None
        pace = (now - self.started) / self.done
        return round(pace * (self.total - self.done), 1)


class Documents:
    """The jobs of one directory, and this process's workers."""

    def __init__(
        self, settings: Settings, runtime: Runtime, metrics: Metrics, directory: Path
    ) -> None:
        self.settings, self.runtime, self.metrics = settings, runtime, metrics
        self.directory = directory
        self.limits = Limits(max_characters=settings.max_document_characters)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}
        self._stopping = False

    @classmethod
    def open(cls, settings: Settings, runtime: Runtime, metrics: Metrics) -> Documents:
        directory = settings.documents_dir
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="mt-documents-"))
        directory.mkdir(parents=True, exist_ok=True)
        return cls(settings, runtime, metrics, directory)

    # --- Lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"documents-{i}")
            for i in range(self.settings.document_workers)
        ]
        self._wake.set()  # jobs left by a previous run: at once

    async def stop(self) -> None:
        """Stop translating: jobs in progress are queued again on disk, for the next start."""
        self._stopping = True
        tasks = [*self._tasks, *self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.settings.documents_dir is None:
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- What the routes ask ---------------------------------------------------------------

    def submit(
        self,
        filename: str,
        format: str,
        data: bytes,
        source: str,
        target: str,
        options: Mapping[str, Any],
        *,
        characters: int = 0,
        key: str | None = None,
    ) -> Job:
        self.expire()
        jobs = list(self._jobs())
        if len(jobs) >= self.settings.max_documents:
            raise ServiceError(
                ErrorType.QUEUE_FULL,
                f"{len(jobs)} documents are kept (max_documents); retry when some have expired "
                "or delete finished ones",
            )
        kept = sum(job.size for job in jobs)
        if kept + len(data) > self.settings.max_documents_bytes:
            raise ServiceError(
                ErrorType.QUEUE_FULL,
                f"documents kept take {kept} bytes and this one {len(data)}; the limit is "
                f"{self.settings.max_documents_bytes} (max_documents_bytes); retry later",
            )
        job = Job(
            secrets.token_hex(16),
            filename,
            format,
            source,
            target,
            dict(options),
            time.time(),
            size=len(data),
            characters=characters,
            key=key,
        )
        folder = self.directory / job.id
        folder.mkdir()
        _write(folder / _SOURCE, data)
        self._save(job)
        self._wake.set()
        return job

    def get(self, id: str) -> Job:
        job = self._load(id) if _valid_id(id) else None
        if job is None or self._expired(job, time.time()):
            raise ServiceError(ErrorType.NOT_FOUND, f"no document {id!r} (deleted or expired?)")
        return job

    def result(self, id: str) -> tuple[Job, Path]:
        job = self.get(id)
        if job.status == "error":  # as it failed: a 4xx for the file, a 5xx for the service
            type = ErrorType(job.error_type or ErrorType.INTERNAL.value)
            raise ServiceError(type, f"document {id} failed: {job.error_message}")
        if job.status != "done":
            raise ServiceError(
                ErrorType.DOCUMENT_NOT_READY,
                f"document {id} is {job.status} ({job.done} of {job.total} sentences); ask "
                "GET /documents/{id} until its status is done",
            )
        return job, self.directory / id / _RESULT

    def delete(self, id: str) -> Job:
        job = self.get(id)
        task = self._running.get(id)
        if task is not None:
            task.cancel()
        shutil.rmtree(self.directory / id, ignore_errors=True)
        if job.status not in ("done", "error"):
            self.metrics.documents.labels(job.format, "deleted").inc()
        return job

    def expire(self) -> None:
        now = time.time()
        counts: dict[str, int] = dict.fromkeys(("queued", "translating", "done", "error"), 0)
        for job in self._jobs():
            if self._expired(job, now):
                shutil.rmtree(self.directory / job.id, ignore_errors=True)
            else:
                counts[job.status] += 1
        for status, count in counts.items():
            self.metrics.documents_kept.labels(status).set(count)

    def _expired(self, job: Job, now: float) -> bool:
        return job.finished is not None and now - job.finished > self.settings.document_ttl_s

    # --- Workers ---------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            # Not wait_for: Python 3.11's can swallow the cancellation that stops the worker.
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({woken}, timeout=SCAN_S)
            finally:
                woken.cancel()
            self._wake.clear()
            self.expire()
            while (claimed := self._claim()) is not None:
                job, lock = claimed
                task = asyncio.create_task(self._run(job))
                self._running[job.id] = task
                try:
                    await asyncio.wait({task})
                finally:
                    self._running.pop(job.id, None)
                    os.close(lock)
                    if not task.done():  # this worker was cancelled: the job stays as it is
                        task.cancel()

    def _claim(self) -> tuple[Job, int] | None:
        """The oldest job waiting or left unfinished by a process gone, locked by this one."""
        waiting = sorted(
            (job for job in self._jobs() if job.status in ("queued", "translating")),
            key=lambda job: job.created,
        )
        for job in waiting:
            folder = self.directory / job.id
            try:
                lock = os.open(folder / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
            except OSError:  # deleted meanwhile
                continue
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(lock)  # another worker has it
                continue
            fresh = self._load(job.id)
            if fresh is not None and fresh.status in ("queued", "translating"):
                return fresh, lock
            os.close(lock)
        return None

    async def _run(self, job: Job) -> None:
        folder = self.directory / job.id
        started = time.time()
        if job.started is None:
            self.metrics.document_queue_seconds.observe(max(0.0, started - job.created))
        if job.attempts >= MAX_ATTEMPTS:  # a document that takes the process down with it
            job.status, job.error_type = "error", ErrorType.INTERNAL.value
            job.error_message = (
                f"the translation was started {job.attempts} times and never finished (the "
                "service stopped during each)"
            )
            job.finished = started
            self.metrics.documents.labels(job.format, job.error_type).inc()
            self._save(job)
            return
        job.status, job.started, job.done = "translating", started, 0
        job.attempts += 1
        self._save(job)
        try:
            result = await self._translate(job, (folder / _SOURCE).read_bytes())
            _write(folder / _RESULT, result)
            job.size += len(result)
            job.status, job.done = "done", job.total
            self.metrics.document_sentences.labels(job.format).inc(job.total)
        except ServiceError as e:
            if e.type is ErrorType.UNAVAILABLE and self.runtime.draining:
                self._set_aside(job)
                return
            job.status, job.error_type, job.error_message = "error", e.type.value, e.message
        except asyncio.CancelledError:
            if self._stopping:
                self._set_aside(job)
            raise  # stopped, or deleted
        except FileNotFoundError:
            return  # deleted while it was being translated
        except Exception:
            log.exception("document %s (%s) failed", job.id, job.format)
            job.status, job.error_type = "error", ErrorType.INTERNAL.value
            job.error_message = "the translation of the document failed"
        job.finished = time.time()
        self.metrics.documents.labels(job.format, job.error_type or "done").inc()
        self.metrics.document_seconds.labels(job.format).observe(job.finished - started)
        if folder.exists():
            self._save(job)

    def _set_aside(self, job: Job) -> None:
        """The service stops while `job` is translated: queued again for the next start, this
        start not counted (only a start that the process did not survive is)."""
        job.status, job.attempts, job.done = "queued", job.attempts - 1, 0
        if (self.directory / job.id).exists():
            self._save(job)

    async def _translate(self, job: Job, data: bytes) -> bytes:
        format = by_name(job.format)
        extracted = await asyncio.to_thread(format.read, data, self.limits)
        units = extracted.units
        characters = sum(len(unit.text) for unit in units)
        if characters > self.limits.max_characters:
            raise ServiceError(
                ErrorType.PAYLOAD_TOO_LARGE,
                f"the document holds {characters} characters of text; the limit is "
                f"{self.limits.max_characters} (max_document_characters)",
            )
        source = job.source
        if source == AUTO and units:
            source = await detect_source(self.runtime, units) or job.target
            job.detected = source
        if not units or source == job.target:
            return data  # nothing to translate: the file as it was sent
        pair = (source, job.target)
        self.runtime.model(*pair)  # an unsupported pair fails here, before any work
        progress = Progress(await asyncio.to_thread(count_sentences, units, source))
        job.total = progress.total
        saved = time.monotonic()

        def on_progress() -> None:
            nonlocal saved
            job.done, job.total = progress.done, progress.total
            if time.monotonic() - saved >= SAVE_PROGRESS_S:
                saved = time.monotonic()
                self._save(job)

        translations = await translate_units(
            self.runtime, units, pair, job.options, progress, on_progress
        )
        return await asyncio.to_thread(extracted.write, translations)

    # --- The directory ---------------------------------------------------------------------

    def _jobs(self) -> Iterator[Job]:
        for folder in self.directory.iterdir():
            if folder.is_dir() and _valid_id(folder.name):
                job = self._load(folder.name)
                if job is not None:
                    yield job

    def _load(self, id: str) -> Job | None:
        """The job's state; one that cannot be read is reported as failed, not dropped."""
        folder = self.directory / id
        try:
            data = json.loads((folder / _STATE).read_text(encoding="utf-8"))
            return Job(**data)
        except FileNotFoundError:
            if not folder.is_dir():
                return None
            reason = "its state was never written (the service stopped as it was sent)"
        except (OSError, ValueError, TypeError) as e:
            reason = f"its state cannot be read: {e}"
        created = folder.stat().st_mtime if folder.exists() else time.time()
        return Job(
            id,
            "",
            "",
            "",
            "",
            {},
            created,
            status="error",
            finished=created,
            error_type=ErrorType.INTERNAL.value,
            error_message=f"the document was lost: {reason}",
        )

    def _save(self, job: Job) -> None:
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
            _write(self.directory / job.id / _STATE, json.dumps(dataclasses.asdict(job)).encode())


def _valid_id(id: str) -> bool:
    return len(id) == 32 and all(c in "0123456789abcdef" for c in id)


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a reader (or a restart) never sees half a file."""
    temporary = path.with_name(path.name + ".part")
    temporary.write_bytes(data)
    os.replace(temporary, path)
