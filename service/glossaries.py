"""Glossaries: named sets of source term -> target term entries for one language pair, owned
by the API key that made them, kept in a `GlossaryStore`.

A glossary is made from entries (JSON objects), or from DeepL's formats: TSV (`source<TAB>
target` a line) or CSV (`source,target`, quoted as CSV quotes, optionally followed by the
source and target language codes, which must be the glossary's). Every entry is checked before
anything is stored, and the first bad one is named: an empty side, a term over
MAX_TERM_CHARACTERS, the same source term (as it matches: case-folded unless the entry is
case-sensitive) with two targets, more entries than the settings allow; a term the model's
vocabulary cannot spell is refused by the runtime, which knows the model
(service/scheduling/runtime.py). A request names a glossary by id or carries its entries
inline; `Terms` is what the text pipeline matches sentences against
(service/text/terms.py).

Stores: `RedisStore` (`redis_url` set: the glossaries every replica shares, through the
process's one Redis client; Redis down or failing answers 503 with Retry-After on the calls that
need a glossary, while translations without one go on), `DirectoryStore` (one JSON file per
glossary under a directory per owner, written atomically: the glossaries of one host, surviving
restarts) and `MemoryStore` (neither set: the process's lifetime). Owners are SHA-256 digests of
API keys, never the keys; without API keys every client is the one owner "".
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from service.errors import ErrorType, ServiceError
from service.store.connection import RedisLink, required, text

T = TypeVar("T")
EntriesFormat = Literal["tsv", "csv"]
MAX_TERM_CHARACTERS = 256
MAX_NAME_CHARACTERS = 256
_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class Entry:
    source: str
    target: str
    case_sensitive: bool = False

    def key(self) -> str:
        """The source term as matching reads it."""
        return self.source if self.case_sensitive else self.source.casefold()


@dataclass(frozen=True, slots=True)
class Glossary:
    id: str
    name: str
    source: str  # language codes
    target: str
    entries: tuple[Entry, ...]
    owner: str  # owner_of(api key)
    created: float  # time.time()


def owner_of(api_key: str | None) -> str:
    """Who owns what a request with this key makes: its key's digest ("" without keys)."""
    return "" if not api_key else hashlib.sha256(api_key.encode()).hexdigest()


def parse_entries(text: str, format: EntriesFormat, pair: tuple[str, str]) -> list[Entry]:
    """DeepL's TSV or CSV entries, one a line; blank lines are skipped. CSV's optional third
    and fourth columns are the language codes, which must be `pair`."""
    if format not in ("tsv", "csv"):
        raise _invalid(f"entries_format must be tsv or csv, not {format!r}")
    if format == "tsv":
        rows = [line.split("\t") for line in text.splitlines()]
    else:
        try:
            rows = list(csv.reader(io.StringIO(text), strict=True))
        except csv.Error as e:
            raise _invalid(f"the CSV entries are not CSV: {e}") from None
    entries = []
    for number, row in enumerate(rows, 1):
        if not any(cell.strip() for cell in row):
            continue
        if format == "csv" and len(row) == 4:
            languages = (row[2].strip().lower(), row[3].strip().lower())
            if languages != pair:
                raise _invalid(
                    f"line {number}: its languages {languages[0]} -> {languages[1]} are not "
                    f"the glossary's {pair[0]} -> {pair[1]}"
                )
            row = row[:2]
        if len(row) != 2:
            separator = "a tab" if format == "tsv" else "a comma"
            raise _invalid(
                f"line {number}: {len(row)} fields; an entry is a source and a target term "
                f"separated by {separator}"
            )
        entries.append(Entry(row[0], row[1]))
    return entries


def checked(entries: Sequence[Entry], max_entries: int) -> tuple[Entry, ...]:
    """`entries` with their terms' outer whitespace stripped and exact repeats dropped, or a
    ServiceError naming the first bad entry (module docstring)."""
    if not entries:
        raise _invalid("a glossary needs at least one entry")
    if len(entries) > max_entries:
        raise _invalid(
            f"{len(entries)} entries; the limit is {max_entries} per glossary "
            "(max_glossary_entries)"
        )
    kept: dict[str, Entry] = {}
    for i, raw in enumerate(entries):
        entry = Entry(raw.source.strip(), raw.target.strip(), raw.case_sensitive)
        name = f"entry {i} ({raw.source!r} -> {raw.target!r})"
        if not entry.source or not entry.target:
            raise _invalid(f"{name}: a term is empty")
        if max(len(entry.source), len(entry.target)) > MAX_TERM_CHARACTERS:
            raise _invalid(f"{name}: a term is longer than {MAX_TERM_CHARACTERS} characters")
        if any(c in entry.source + entry.target for c in "\n\r\t"):
            raise _invalid(f"{name}: a term holds a line break or tab")
        other = kept.get(entry.key())
        if other is not None and other.target != entry.target:
            raise _invalid(
                f"{name}: its source term is already translated as {other.target!r}; one "
                "source term has one target"
            )
        kept.setdefault(entry.key(), entry)
    return tuple(kept.values())


class GlossaryStore(Protocol):
    """Where glossaries live. Each method is one short operation (a file, a Redis round trip),
    called on the event loop: a glossary is at most max_glossary_entries entries, a key's list
    at most max_glossaries_per_key of them. A store that cannot answer raises a ServiceError
    (UNAVAILABLE)."""

    async def put(self, glossary: Glossary) -> None: ...

    async def get(self, owner: str, id: str) -> Glossary | None: ...

    async def list(self, owner: str) -> list[Glossary]: ...

    async def delete(self, owner: str, id: str) -> bool:
        """Whether it was there."""
        ...


def _encode(glossary: Glossary) -> str:
    return json.dumps(asdict(glossary), ensure_ascii=False)


def _decode(text: str | bytes) -> Glossary:
    data = json.loads(text)
    entries = tuple(Entry(**entry) for entry in data.pop("entries"))
    return Glossary(entries=entries, **data)


class MemoryStore:
    """Glossaries in this process only (no glossary_dir)."""

    def __init__(self) -> None:
        self._glossaries: dict[tuple[str, str], Glossary] = {}

    async def put(self, glossary: Glossary) -> None:
        self._glossaries[glossary.owner, glossary.id] = glossary

    async def get(self, owner: str, id: str) -> Glossary | None:
        return self._glossaries.get((owner, id))

    async def list(self, owner: str) -> list[Glossary]:
        return [g for (o, _), g in self._glossaries.items() if o == owner]

    async def delete(self, owner: str, id: str) -> bool:
        return self._glossaries.pop((owner, id), None) is not None


class DirectoryStore:
    """One JSON file per glossary, `directory/<owner>/<id>.json` ("_" for the owner ""),
    written to a temporary file and renamed into place: a reader sees a whole glossary or
    none, across processes (--workers) and restarts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, owner: str, id: str) -> Path:
        return self.directory / (owner or "_") / f"{id}.json"

    async def put(self, glossary: Glossary) -> None:
        path = self._path(glossary.owner, glossary.id)
        path.parent.mkdir(exist_ok=True)
        data = _encode(glossary)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False
        ) as file:
            file.write(data)
        os.replace(file.name, path)

    async def get(self, owner: str, id: str) -> Glossary | None:
        try:
            return _decode(self._path(owner, id).read_text("utf-8"))
        except FileNotFoundError:
            return None

    async def list(self, owner: str) -> list[Glossary]:
        folder = self.directory / (owner or "_")
        found = [await self.get(owner, path.stem) for path in sorted(folder.glob("*.json"))]
        return [glossary for glossary in found if glossary is not None]

    async def delete(self, owner: str, id: str) -> bool:
        try:
            self._path(owner, id).unlink()
        except FileNotFoundError:
            return False
        return True


REDIS_PREFIX = "mt:glossary:"


class RedisStore:
    """Glossaries every replica shares: `mt:glossary:<owner>:<id>` a glossary's JSON,
    `mt:glossaries:<owner>` the set of its owner's ids (owner "_" for ""), changed together in
    one transaction. Kept until deleted, as a directory's are (Redis's persistence keeps them
    across its restarts)."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    @staticmethod
    def _key(owner: str, id: str) -> str:
        return f"{REDIS_PREFIX}{owner or '_'}:{id}"

    @staticmethod
    def _index(owner: str) -> str:
        return f"mt:glossaries:{owner or '_'}"

    async def _run(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        with required("glossaries"):
            return await self._link.run(operation, call)

    async def put(self, glossary: Glossary) -> None:
        async def call() -> object:
            async with self._link.client.pipeline(transaction=True) as pipe:
                pipe.set(self._key(glossary.owner, glossary.id), _encode(glossary))
                pipe.sadd(self._index(glossary.owner), glossary.id)
                return await pipe.execute()

        await self._run("glossary_put", call)

    async def get(self, owner: str, id: str) -> Glossary | None:
        found = await self._run("glossary_get", lambda: self._link.client.get(self._key(owner, id)))
        return None if found is None else _decode(found)

    async def list(self, owner: str) -> list[Glossary]:
        async def call() -> list[bytes | str | None]:
            ids = await self._link.client.smembers(self._index(owner))
            names = [self._key(owner, text(id)) for id in sorted(ids, key=text)]
            return await self._link.client.mget(names) if names else []

        return [_decode(text) for text in await self._run("glossary_list", call) if text]

    async def delete(self, owner: str, id: str) -> bool:
        async def call() -> list[int]:
            async with self._link.client.pipeline(transaction=True) as pipe:
                pipe.delete(self._key(owner, id))
                pipe.srem(self._index(owner), id)
                done: list[int] = await pipe.execute()
                return done

        return bool((await self._run("glossary_delete", call))[0])


def open_store(directory: Path | None, link: RedisLink | None = None) -> GlossaryStore:
    """The store the settings name: Redis, a directory, or this process's memory."""
    if link is not None:
        return RedisStore(link)
    return MemoryStore() if directory is None else DirectoryStore(directory)


class Glossaries:
    """The glossaries of every owner, within the settings' bounds."""

    def __init__(self, store: GlossaryStore, *, max_entries: int, max_per_owner: int) -> None:
        self.store = store
        self.max_entries = max_entries
        self.max_per_owner = max_per_owner

    async def create(
        self, owner: str, name: str, pair: tuple[str, str], entries: Sequence[Entry]
    ) -> Glossary:
        """A new glossary of checked entries (`checked`), or a ServiceError."""
        if not name.strip() or len(name) > MAX_NAME_CHARACTERS:
            raise _invalid(f"a glossary's name has 1 to {MAX_NAME_CHARACTERS} characters")
        kept = checked(entries, self.max_entries)
        if len(await self.store.list(owner)) >= self.max_per_owner:
            raise _invalid(
                f"this API key has {self.max_per_owner} glossaries, the limit "
                "(max_glossaries_per_key); delete one first"
            )
        glossary = Glossary(uuid.uuid4().hex, name, *pair, kept, owner, time.time())
        await self.store.put(glossary)
        return glossary

    async def get(self, owner: str, id: str) -> Glossary:
        """The owner's glossary `id`; another owner's is as unknown as a missing one."""
        glossary = await self.store.get(owner, id) if _ID.fullmatch(id) else None
        if glossary is None:
            raise ServiceError(ErrorType.NOT_FOUND, f"no glossary {id!r}")
        return glossary

    async def delete(self, owner: str, id: str) -> None:
        if not (_ID.fullmatch(id) and await self.store.delete(owner, id)):
            raise ServiceError(ErrorType.NOT_FOUND, f"no glossary {id!r}")

    async def for_pair(self, owner: str, id: str, pair: tuple[str, str]) -> Glossary:
        """The glossary a translation of `pair` names: its own, of that pair."""
        glossary = await self.get(owner, id)
        if (glossary.source, glossary.target) != pair:
            raise _invalid(
                f"glossary {id} is for {glossary.source} -> {glossary.target}, not "
                f"{pair[0]} -> {pair[1]}"
            )
        return glossary


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorType.INVALID_REQUEST, message)
