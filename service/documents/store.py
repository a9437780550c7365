"""Where document jobs live: a job's state, the file sent and its result, and the claim of the
process translating it. `Documents` (service/documents/jobs.py) runs the jobs over either store:

- `DirectoryJobs` (no `redis_url`): a directory per job under `documents_dir` (state as JSON,
  `source`, `result`), the processes of one host (`--workers`) sharing it; a process translating
  a job holds an exclusive lock on its `lock` file, which the system frees when the process dies.
- `RedisJobs` (`redis_url`): every replica's, through the process's one Redis client
  (service/store/connection.py): `mt:documents` the set of ids, `mt:document:<id>` the state,
  `...:source` and `...:result` the files, `...:lease` the claim, a lock with a lease of
  `document_lease_s` that the replica translating the job renews; a replica that stops without
  handing the job back (a crash) lets its lease expire, and another takes the job over. A
  finished job's keys expire `document_ttl_s` after its end (besides the workers' own expiry).

A store's calls raise StoreUnavailable when Redis cannot answer (service/store/connection.py);
nothing is changed then, and the caller answers 503 or retries at its next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from redis.asyncio.client import Pipeline
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, WatchError

from service.errors import ErrorType
from service.store.connection import RedisLink, StoreUnavailable, text

Status = Literal["queued", "translating", "done", "error"]
_STATE, _SOURCE, _RESULT, _LOCK = "job.json", "source", "result", "lock"


@dataclass
class Job:
    """A job's state, as a store holds it."""

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
    attempts: int = 0  # times a worker started it (jobs.MAX_ATTEMPTS)
    characters: int = 0  # of text in the file sent (charged to the key that sent it)
    key: str | None = None  # a DeepL upload's document_key, which its status and result need

    @property
    def waiting(self) -> bool:
        """Queued, or left in translation by a process that stopped: for a worker to take."""
        return self.status in ("queued", "translating")

    def seconds_left(self, now: float) -> float | None:
        """At the pace so far; None until a sentence is done."""
        if self.status != "translating" or self.started is None or not self.done:
            return None
        pace = (now - self.started) / self.done
        return round(pace * (self.total - self.done), 1)

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()


def _decode(data: bytes | str) -> Job | str:
    """The job `data` holds, or why it cannot be read."""
    try:
        return Job(**json.loads(data))
    except (ValueError, TypeError) as e:
        return f"its state cannot be read: {e}"


def lost(id: str, created: float, reason: str) -> Job:
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


class Claim(Protocol):
    """A job held by this process until `release()`: no other worker takes it meanwhile."""

    async def lost(self) -> None:
        """Returns if the job is no longer this process's (deleted, or taken by another after
        its lease expired); a lock held is never lost."""
        ...

    async def release(self) -> None: ...


class JobStore(Protocol):
    async def add(self, job: Job, data: bytes) -> None: ...

    async def load(self, id: str) -> Job | None: ...

    async def jobs(self) -> list[Job]: ...

    async def save(self, job: Job) -> None:
        """Its new state, unless it was deleted meanwhile."""
        ...

    async def source(self, id: str) -> bytes | None: ...

    async def finish(self, job: Job, result: bytes) -> None:
        """Its result and final state together, unless it was deleted meanwhile."""
        ...

    async def result(self, id: str) -> bytes | None: ...

    async def remove(self, id: str) -> None: ...

    async def claim(self, id: str) -> Claim | None:
        """The job held by this process, or None if another holds it."""
        ...

    async def close(self) -> None: ...


class _FileLock:
    def __init__(self, descriptor: int) -> None:
        self._descriptor = descriptor

    async def lost(self) -> None:
        await asyncio.get_running_loop().create_future()  # never

    async def release(self) -> None:
        os.close(self._descriptor)


class DirectoryJobs:
    """A directory per job (module docstring); a temporary one (no documents_dir) is removed
    at close."""

    def __init__(self, directory: Path | None) -> None:
        self._temporary = directory is None
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="mt-documents-"))
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    async def add(self, job: Job, data: bytes) -> None:
        folder = self.directory / job.id
        folder.mkdir()
        _write(folder / _SOURCE, data)
        _write(folder / _STATE, job.encode())

    async def load(self, id: str) -> Job | None:
        """The job's state; one that cannot be read is reported as failed, not dropped."""
        folder = self.directory / id
        try:
            found = _decode((folder / _STATE).read_bytes())
        except FileNotFoundError:
            if not folder.is_dir():
                return None
            found = "its state was never written (the service stopped as it was sent)"
        except OSError as e:
            found = f"its state cannot be read: {e}"
        if isinstance(found, Job):
            return found
        try:
            created = folder.stat().st_mtime
        except FileNotFoundError:  # deleted meanwhile
            return None
        return lost(id, created, found)

    async def jobs(self) -> list[Job]:
        found = [
            await self.load(folder.name)
            for folder in self.directory.iterdir()
            if folder.is_dir() and valid_id(folder.name)
        ]
        return [job for job in found if job is not None]

    async def save(self, job: Job) -> None:
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
            _write(self.directory / job.id / _STATE, job.encode())

    async def source(self, id: str) -> bytes | None:
        with contextlib.suppress(FileNotFoundError):
            return (self.directory / id / _SOURCE).read_bytes()
        return None

    async def finish(self, job: Job, result: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
            _write(self.directory / job.id / _RESULT, result)
            _write(self.directory / job.id / _STATE, job.encode())

    async def result(self, id: str) -> bytes | None:
        with contextlib.suppress(FileNotFoundError):
            return (self.directory / id / _RESULT).read_bytes()
        return None

    async def remove(self, id: str) -> None:
        shutil.rmtree(self.directory / id, ignore_errors=True)

    async def claim(self, id: str) -> Claim | None:
        try:
            descriptor = os.open(self.directory / id / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:  # deleted meanwhile
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)  # another process has it
            return None
        return _FileLock(descriptor)

    async def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


REDIS_IDS = "mt:documents"
REDIS_PREFIX = "mt:document:"


class _Lease:
    """A job's lease in Redis, renewed every third of its length until released (or lost:
    deleted, or expired while Redis was unreachable)."""

    def __init__(self, link: RedisLink, lock: Lock, lease_s: float) -> None:
        self._link, self._lock, self._lease_s = link, lock, lease_s
        self._renewal = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        async def reacquire() -> bool:
            try:
                await self._lock.reacquire()
            except LockError:
                return False
            return True

        while True:
            await asyncio.sleep(self._lease_s / 3)
            with contextlib.suppress(StoreUnavailable):  # tried again at the next third
                if not await self._link.run("document_lease", reacquire):
                    return

    async def lost(self) -> None:
        await asyncio.shield(self._renewal)  # it ends when the lease is lost

    async def release(self) -> None:
        self._renewal.cancel()
        await asyncio.gather(self._renewal, return_exceptions=True)

        async def release() -> None:
            with contextlib.suppress(LockError):  # lost already
                await self._lock.release()

        with contextlib.suppress(StoreUnavailable):  # it expires on its own
            await self._link.run("document_release", release)


class RedisJobs:
    """The jobs every replica shares (module docstring)."""

    def __init__(self, link: RedisLink, *, ttl_s: float, lease_s: float) -> None:
        self._link, self._ttl_s, self._lease_s = link, ttl_s, lease_s
        self._client = link.client

    @staticmethod
    def _key(id: str, part: str = "") -> str:
        return f"{REDIS_PREFIX}{id}{part and ':' + part}"

    def _keys(self, id: str) -> list[str]:
        return [self._key(id, part) for part in ("", "source", "result", "lease")]

    async def add(self, job: Job, data: bytes) -> None:
        async def call() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self._key(job.id, "source"), data)
                pipe.set(self._key(job.id), job.encode())
                pipe.sadd(REDIS_IDS, job.id)
                await pipe.execute()

        await self._link.run("document_add", call)

    async def _get(self, operation: str, key: str) -> bytes | None:
        found = await self._link.run(operation, lambda: self._client.get(key))
        return found.encode() if isinstance(found, str) else found

    async def load(self, id: str) -> Job | None:
        data = await self._get("document_get", self._key(id))
        return None if data is None else _readable(id, data)

    async def jobs(self) -> list[Job]:
        async def call() -> list[Job]:
            ids = sorted(map(text, await self._client.smembers(REDIS_IDS)))
            states = await self._client.mget([self._key(id) for id in ids]) if ids else []
            gone = [id for id, state in zip(ids, states, strict=True) if state is None]
            if gone:  # expired in Redis
                await self._client.srem(REDIS_IDS, *gone)
            return [
                _readable(id, state)
                for id, state in zip(ids, states, strict=True)
                if state is not None
            ]

        return await self._link.run("document_list", call)

    def _set_state(self, pipe: Pipeline, job: Job) -> None:
        pipe.set(self._key(job.id), job.encode(), xx=True)  # not again once deleted
        if job.finished is not None:
            ttl = max(1, round(job.finished + self._ttl_s - time.time()))
            for key in self._keys(job.id)[:3]:
                pipe.expire(key, ttl)

    async def save(self, job: Job) -> None:
        async def call() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                self._set_state(pipe, job)
                await pipe.execute()

        await self._link.run("document_save", call)

    async def source(self, id: str) -> bytes | None:
        return await self._get("document_source", self._key(id, "source"))

    async def finish(self, job: Job, result: bytes) -> None:
        async def call() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                await pipe.watch(self._key(job.id))
                if not await pipe.exists(self._key(job.id)):
                    return  # deleted meanwhile
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(self._key(job.id, "result"), result)
                self._set_state(pipe, job)
                with contextlib.suppress(WatchError):  # deleted meanwhile
                    await pipe.execute()

        await self._link.run("document_finish", call)

    async def result(self, id: str) -> bytes | None:
        return await self._get("document_result", self._key(id, "result"))

    async def remove(self, id: str) -> None:
        async def call() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(*self._keys(id))
                pipe.srem(REDIS_IDS, id)
                await pipe.execute()

        await self._link.run("document_delete", call)

    async def claim(self, id: str) -> Claim | None:
        lock = Lock(self._client, self._key(id, "lease"), timeout=self._lease_s, thread_local=False)
        if not await self._link.run("document_claim", lambda: lock.acquire(blocking=False)):
            return None
        return _Lease(self._link, lock, self._lease_s)

    async def close(self) -> None:
        """Nothing: the Redis client is the runtime's."""


def _readable(id: str, data: bytes | str) -> Job:
    """A state in Redis; one that cannot be read (another version's?) is reported as failed,
    left as it is (another replica may read it) and kept until deleted."""
    found = _decode(data)
    return found if isinstance(found, Job) else lost(id, time.time(), found)


def valid_id(id: str) -> bool:
    return len(id) == 32 and all(c in "0123456789abcdef" for c in id)


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a reader (or a restart) never sees half a file."""
    temporary = path.with_name(path.name + ".part")
    temporary.write_bytes(data)
    os.replace(temporary, path)
