"""Document jobs: the file sent, its state and its result in a `JobStore` (a directory, or Redis
shared by every replica: service/documents/store.py), translated by background workers in the
app's lifespan.

The store is the truth: any process serving it answers a job's status, result and deletion;
the process translating a job holds its claim (a lock, or a lease in Redis), so a job is
translated by one process at a time, and a job whose process died (a restart, a crash) has its
claim free again: a worker takes it up where its state says (queued or translating: from the
start) at its next look. A job that cannot be read back is not dropped silently: it is reported
as failed, with the reason. Jobs are bounded in count and bytes (`max_documents`,
`max_documents_bytes`: 429 beyond), and removed `document_ttl_s` after they end. With Redis
down, the routes' calls answer 503 with Retry-After and the workers try again at their next
look; what was accepted stays in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from service.documents.base import Limits
from service.documents.formats import by_name
from service.documents.store import (
    Claim,
    DirectoryJobs,
    Job,
    JobStore,
    RedisJobs,
    valid_id,
)
from service.documents.translate import Progress, count_sentences, detect_source, translate_units
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.scheduling.runtime import Runtime
from service.settings import Settings
from service.store.connection import StoreUnavailable, required

log = logging.getLogger(__name__)

__all__ = ["AUTO", "Documents", "Job"]

AUTO = "auto"
# How often workers look for jobs no process holds (another's, one left by a restart) and
# remove expired ones; with Redis, at least twice a lease (document_lease_s).
SCAN_S = 2.0
# Progress is saved at most this often (a status request reads it from the store).
SAVE_PROGRESS_S = 0.5
# Starts of one job (each restart takes up a job left unfinished) before it is failed.
MAX_ATTEMPTS = 3


class Documents:
    """The jobs of one store, and this process's workers."""

    def __init__(
        self,
        settings: Settings,
        runtime: Runtime,
        metrics: Metrics,
        store: JobStore,
        scan_s: float = SCAN_S,
    ) -> None:
        self.settings, self.runtime, self.metrics = settings, runtime, metrics
        self.store = store
        self.limits = Limits(max_characters=settings.max_document_characters)
        self._scan_s = scan_s
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}
        self._progress: dict[str, asyncio.Task[None]] = {}  # saves of progress, by job
        self._stopping = False

    @classmethod
    def open(cls, settings: Settings, runtime: Runtime, metrics: Metrics) -> Documents:
        """Over Redis when the runtime has it, else over `documents_dir` (or a temporary one)."""
        store: JobStore
        if runtime.redis is not None:
            lease_s = settings.document_lease_s
            store = RedisJobs(runtime.redis, ttl_s=settings.document_ttl_s, lease_s=lease_s)
            return cls(settings, runtime, metrics, store, min(SCAN_S, lease_s / 2))
        return cls(settings, runtime, metrics, DirectoryJobs(settings.documents_dir))

    # --- Lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"documents-{i}")
            for i in range(self.settings.document_workers)
        ]
        self._wake.set()  # jobs left by a previous run: at once

    async def stop(self) -> None:
        """Stop translating: jobs in progress are queued again in the store, for the next
        start (or, in Redis, another replica)."""
        self._stopping = True
        tasks = [*self._tasks, *self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.close()

    # --- What the routes ask (StoreUnavailable: 503) ---------------------------------------

    async def submit(
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
        with required("documents"):
            jobs = await self.expire()
            if len(jobs) >= self.settings.max_documents:
                raise ServiceError(
                    ErrorType.QUEUE_FULL,
                    f"{len(jobs)} documents are kept (max_documents); retry when some have "
                    "expired or delete finished ones",
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
            await self.store.add(job, data)
        self._wake.set()
        return job

    async def get(self, id: str) -> Job:
        with required("documents"):
            job = await self.store.load(id) if valid_id(id) else None
        if job is None or self._expired(job, time.time()):
            raise ServiceError(ErrorType.NOT_FOUND, f"no document {id!r} (deleted or expired?)")
        return job

    async def result(self, id: str) -> tuple[Job, bytes]:
        job = await self.get(id)
        if job.status == "error":  # as it failed: a 4xx for the file, a 5xx for the service
            type = ErrorType(job.error_type or ErrorType.INTERNAL.value)
            raise ServiceError(type, f"document {id} failed: {job.error_message}")
        if job.status != "done":
            raise ServiceError(
                ErrorType.DOCUMENT_NOT_READY,
                f"document {id} is {job.status} ({job.done} of {job.total} sentences); ask "
                "GET /documents/{id} until its status is done",
            )
        with required("documents"):
            result = await self.store.result(id)
        if result is None:  # deleted meanwhile, or evicted by Redis (maxmemory)
            raise ServiceError(ErrorType.NOT_FOUND, f"document {id}'s result is gone")
        return job, result

    async def delete(self, id: str) -> Job:
        job = await self.get(id)
        task = self._running.get(id)
        if task is not None:
            task.cancel()
        with required("documents"):
            await self.store.remove(id)
        if job.status not in ("done", "error"):
            self.metrics.documents.labels(job.format, "deleted").inc()
        return job

    async def expire(self) -> list[Job]:
        """The jobs kept, once those expired are removed."""
        now = time.time()
        counts: dict[str, int] = dict.fromkeys(("queued", "translating", "done", "error"), 0)
        kept = []
        for job in await self.store.jobs():
            if self._expired(job, now):
                await self.store.remove(job.id)
            else:
                counts[job.status] += 1
                kept.append(job)
        for status, count in counts.items():
            self.metrics.documents_kept.labels(status).set(count)
        return kept

    def _expired(self, job: Job, now: float) -> bool:
        return job.finished is not None and now - job.finished > self.settings.document_ttl_s

    # --- Workers ---------------------------------------------------------------------------

    async def _worker(self) -> None:
        me = asyncio.current_task()
        while True:
            # A cancellation a library swallowed on the way (redis-py's calls can, under a
            # timeout) still stops the worker: the shutdown waits for it.
            if me is not None and me.cancelling():
                raise asyncio.CancelledError
            # Not wait_for: Python 3.11's can swallow the cancellation that stops the worker.
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({woken}, timeout=self._scan_s)
            finally:
                woken.cancel()
            self._wake.clear()
            try:
                await self._work()
            except StoreUnavailable:  # logged by the link; tried again at the next look
                continue

    async def _work(self) -> None:
        """Every job this worker can claim, one after the other."""
        await self.expire()
        while (claimed := await self._claim()) is not None:
            job, claim = claimed
            task = asyncio.create_task(self._run(job))
            lost = asyncio.ensure_future(claim.lost())
            self._running[job.id] = task
            try:
                await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # deleted through another process, or taken over
                    log.info("document %s is no longer this process's: stopped", job.id)
                    task.cancel()
                    await asyncio.wait({task})
            finally:
                lost.cancel()
                self._running.pop(job.id, None)
                if not task.done():  # this worker was cancelled: the job is set aside first
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                await claim.release()

    async def _claim(self) -> tuple[Job, Claim] | None:
        """The oldest job waiting or left unfinished by a process gone, claimed by this one."""
        waiting = sorted(
            (job for job in await self.store.jobs() if job.waiting), key=lambda job: job.created
        )
        for job in waiting:
            claim = await self.store.claim(job.id)
            if claim is None:  # another worker has it
                continue
            fresh = await self.store.load(job.id)
            if fresh is not None and fresh.waiting:
                return fresh, claim
            await claim.release()
        return None

    async def _run(self, job: Job) -> None:
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
            with contextlib.suppress(StoreUnavailable):  # failed at the next look
                await self.store.save(job)
                self.metrics.documents.labels(job.format, job.error_type).inc()
            return
        job.status, job.started, job.done = "translating", started, 0
        job.attempts += 1
        try:
            await self.store.save(job)
            data = await self.store.source(job.id)
            if data is None:
                return  # deleted meanwhile
            result: bytes | None = await self._translate(job, data)
        except ServiceError as e:
            if e.type is ErrorType.UNAVAILABLE and self.runtime.draining:
                await self._set_aside(job)
                return
            job.status, job.error_type, job.error_message = "error", e.type.value, e.message
            result = None
        except StoreUnavailable:
            return  # the job stays as the store has it, taken again once its claim is free
        except asyncio.CancelledError:
            if self._stopping:
                await self._set_aside(job)
            raise  # stopped, or deleted
        except Exception:
            log.exception("document %s (%s) failed", job.id, job.format)
            job.status, job.error_type = "error", ErrorType.INTERNAL.value
            job.error_message = "the translation of the document failed"
            result = None
        job.finished = time.time()
        if result is not None:
            job.size += len(result)
            job.status, job.done = "done", job.total
            self.metrics.document_sentences.labels(job.format).inc(job.total)
        await self._saved(job)
        with contextlib.suppress(StoreUnavailable):  # unfinished in the store: taken again
            if result is None:
                await self.store.save(job)
            else:
                await self.store.finish(job, result)
            self.metrics.documents.labels(job.format, job.error_type or "done").inc()
            self.metrics.document_seconds.labels(job.format).observe(job.finished - started)

    async def _set_aside(self, job: Job) -> None:
        """The service stops while `job` is translated: queued again for the next start, this
        start not counted (only a start that the process did not survive is)."""
        job.status, job.attempts, job.done = "queued", job.attempts - 1, 0
        await self._saved(job)
        with contextlib.suppress(StoreUnavailable):  # taken again once its lease expires
            await self.store.save(job)

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
                self._save_progress(job)

        translations = await translate_units(
            self.runtime, units, pair, job.options, progress, on_progress
        )
        return await asyncio.to_thread(extracted.write, translations)

    def _save_progress(self, job: Job) -> None:
        """In the background (progress is for status requests, not worth waiting for), one
        save at a time; `_saved` waits for it before the job's next state."""
        if job.id not in self._progress:
            task = asyncio.create_task(self.store.save(job))
            self._progress[job.id] = task
            task.add_done_callback(lambda _: self._progress.pop(job.id, None))

    async def _saved(self, job: Job) -> None:
        task = self._progress.get(job.id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)  # StoreUnavailable: logged
