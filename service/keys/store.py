"""Where API keys with limits live: a SQLite file on one host (`key_store: sqlite`, `keys_db`) or
Redis for every replica (`key_store: redis`). A key is stored by its name and the sha256 of its
secret (the secret itself is shown once, by `python -m service.keys add`, and never stored). Each
change bumps the store's version number, which a running service reads every `keys_reload_s`
(one cheap read) to reload the keys when it moved."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from service.settings import Settings
from service.store.connection import RedisLink


@dataclass(frozen=True)
class ApiKey:
    """A key's name, the sha256 of its secret, and its limits (None: unlimited); `origins`:
    the browser origins it may be used from (Origin header), none: any."""

    name: str
    digest: str
    requests_per_minute: int | None = None
    characters_per_day: int | None = None
    characters_per_month: int | None = None
    origins: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ApiKey:
        fields: dict[str, Any] = json.loads(text)
        fields["origins"] = tuple(fields.get("origins", ()))
        return cls(**fields)


def digest(secret: str) -> str:
    """How a key's secret is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyExists(Exception):
    """A key of that name (or secret) is already stored."""


class KeyStore(Protocol):
    async def version(self) -> int: ...

    async def keys(self) -> list[ApiKey]: ...

    async def add(self, key: ApiKey) -> None: ...

    async def replace(self, key: ApiKey) -> bool: ...

    async def remove(self, name: str) -> bool: ...


class SqliteKeys:
    """The keys in a SQLite file (created on first use). Each call opens its own connection:
    the CLI and the service's processes share the file, and SQLite's locking orders them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            # Readers (every service process, every keys_reload_s) never wait for a writer.
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS api_keys (name TEXT PRIMARY KEY, digest TEXT UNIQUE "
                "NOT NULL, key TEXT NOT NULL)"
            )
            db.execute("CREATE TABLE IF NOT EXISTS version (n INTEGER NOT NULL)")
            if db.execute("SELECT COUNT(*) FROM version").fetchone()[0] == 0:
                db.execute("INSERT INTO version VALUES (0)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5)

    async def version(self) -> int:
        with self._connect() as db:
            return cast(int, db.execute("SELECT n FROM version").fetchone()[0])

    async def keys(self) -> list[ApiKey]:
        with self._connect() as db:
            rows = db.execute("SELECT key FROM api_keys ORDER BY name").fetchall()
        return [ApiKey.from_json(row[0]) for row in rows]

    async def add(self, key: ApiKey) -> None:
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT INTO api_keys VALUES (?, ?, ?)", (key.name, key.digest, key.to_json())
                )
                db.execute("UPDATE version SET n = n + 1")
        except sqlite3.IntegrityError:
            raise KeyExists(key.name) from None

    async def replace(self, key: ApiKey) -> bool:
        with self._connect() as db:
            changed = db.execute(
                "UPDATE api_keys SET key = ? WHERE name = ?", (key.to_json(), key.name)
            ).rowcount
            db.execute("UPDATE version SET n = n + 1")
        return changed == 1

    async def remove(self, name: str) -> bool:
        with self._connect() as db:
            removed = db.execute("DELETE FROM api_keys WHERE name = ?", (name,)).rowcount
            db.execute("UPDATE version SET n = n + 1")
        return removed == 1


REDIS_KEYS = "mt:keys"  # hash: name -> ApiKey's JSON
REDIS_VERSION = "mt:keys:version"


class RedisKeys:
    """The keys in Redis, for every replica."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def version(self) -> int:
        value = await self._link.run("keys_version", lambda: self._link.client.get(REDIS_VERSION))
        return 0 if value is None else int(value)

    async def keys(self) -> list[ApiKey]:
        values = await self._link.run("keys_load", lambda: self._link.client.hvals(REDIS_KEYS))
        return sorted((ApiKey.from_json(v) for v in values), key=lambda k: k.name)

    async def add(self, key: ApiKey) -> None:
        if any(k.digest == key.digest for k in await self.keys()):
            raise KeyExists(key.name)
        added = await self._link.run(
            "keys_add", lambda: self._link.client.hsetnx(REDIS_KEYS, key.name, key.to_json())
        )
        if not added:
            raise KeyExists(key.name)
        await self._bump()

    async def replace(self, key: ApiKey) -> bool:
        if not await self._link.run(
            "keys_set", lambda: self._link.client.hexists(REDIS_KEYS, key.name)
        ):
            return False
        await self._link.run(
            "keys_set", lambda: self._link.client.hset(REDIS_KEYS, key.name, key.to_json())
        )
        await self._bump()
        return True

    async def remove(self, name: str) -> bool:
        removed = await self._link.run(
            "keys_remove", lambda: self._link.client.hdel(REDIS_KEYS, name)
        )
        await self._bump()
        return bool(removed)

    async def _bump(self) -> None:
        await self._link.run("keys_version", lambda: self._link.client.incr(REDIS_VERSION))


def open_store(settings: Settings, link: RedisLink | None) -> KeyStore | None:
    """The key store the settings name (None: none), over the process's Redis `link`."""
    if settings.key_store == "sqlite":
        return SqliteKeys(settings.keys_db)
    if settings.key_store == "redis":
        if link is None:
            raise ValueError("key_store redis needs redis_url")
        return RedisKeys(link)
    return None
