"""Who may call, and how much: the static keys (`api_keys`, unlimited), the stored keys with
their limits (service/keys/store.py), and the counting of each request against them.

Limits are counted by the `limits` library in one place for every replica: in this process,
or in Redis with `redis_url` (where the quotas of every replica add up). Requests per minute
are a moving window (each request's time is kept: exact); characters per day and per month are
the library's sliding-window counter (two counters per limit: a moving window approximated by
weighting the previous fixed window), since a moving window keeps one entry per unit counted. A
request is charged before any work, and a request over a limit is not charged characters; each
count checks its limit in the same step (concurrent requests, on any replica, never pass it).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from limits import RateLimitItem, RateLimitItemPerDay, RateLimitItemPerMinute, RateLimitItemPerMonth
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from service.errors import ErrorType, ServiceError
from service.keys.store import ApiKey, KeyStore, digest, open_store
from service.metrics import Metrics
from service.settings import Settings
from service.store.connection import RedisLink, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# The characters of a key without a limit are counted against this (for its usage).
UNLIMITED = 10**15
LIMITS_PREFIX = "mt:limits"


@dataclass(frozen=True)
class Count:
    """One limit's use: `used` within its window of `window_s` seconds, of `limit` (None:
    unlimited)."""

    used: int
    limit: int | None
    window_s: int


@dataclass(frozen=True)
class Usage:
    name: str
    requests_per_minute: Count | None  # None: not counted (no limit)
    characters_per_day: Count
    characters_per_month: Count


class Quotas:
    """Each stored key's use, counted by the `limits` library (module docstring)."""

    def __init__(self, storage: Storage, link: RedisLink | None, fail_open: bool, metrics: Metrics):
        self._requests = MovingWindowRateLimiter(storage)
        self._characters = SlidingWindowCounterRateLimiter(storage)
        self._link = link
        self._fail_open = fail_open
        self._metrics = metrics

    @classmethod
    def create(cls, settings: Settings, link: RedisLink | None, metrics: Metrics) -> Quotas:
        storage: Storage = MemoryStorage()
        if link is not None:
            storage = RedisStorage(
                "async+redis://",
                implementation="redispy",
                key_prefix=LIMITS_PREFIX,
                connection_pool=link.pool,  # type: ignore[arg-type]  # passed to redis.Redis
            )
        return cls(storage, link, settings.quota_fail_open, metrics)

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        if self._link is None:
            return await call()
        return await self._link.run("quotas", call)

    async def charge(self, key: ApiKey, characters: int) -> None:
        """Count a request of `characters` against `key`'s limits, or raise RATE_LIMITED or
        QUOTA_EXCEEDED (with the seconds until there is room) and count nothing more; when Redis
        fails, serve (quota_fail_open) or raise UNAVAILABLE."""
        try:
            await self._charge(key, characters)
        except StoreUnavailable:
            self._metrics.quota_unchecked.inc()
            if not self._fail_open:
                raise ServiceError(
                    ErrorType.UNAVAILABLE, "the API keys' limits cannot be counted now; retry"
                ) from None

    async def _charge(self, key: ApiKey, characters: int) -> None:
        if key.requests_per_minute is not None:
            per_minute: RateLimitItem = RateLimitItemPerMinute(key.requests_per_minute)
            if not await self._call(partial(self._requests.hit, per_minute, key.name)):
                await self._refuse(self._requests, per_minute, key, "requests_per_minute")
        if characters == 0:
            return
        items = _character_items(key)
        # The later limits first, without counting: the first one's count below refuses without
        # counting too, and the day must not be counted for a request its month refuses.
        for name, item, limit in items[1:]:
            test = partial(self._characters.test, item, key.name, cost=characters)
            if limit is not None and not await self._call(test):
                await self._refuse(self._characters, item, key, name)
        # The count checks again in the same step (one script in Redis): of requests that all
        # passed the test at once, those that no longer fit are refused here. One refused at its
        # month after its day was counted keeps that count (a race at the month's limit: the key
        # is charged for it, never served beyond a limit).
        for name, item, _ in items:
            hit = partial(self._characters.hit, item, key.name, cost=characters)
            if not await self._call(hit):
                await self._refuse(self._characters, item, key, name)

    async def _refuse(
        self,
        limiter: MovingWindowRateLimiter | SlidingWindowCounterRateLimiter,
        item: RateLimitItem,
        key: ApiKey,
        limit: str,
    ) -> None:
        stats = await self._call(partial(limiter.get_window_stats, item, key.name))
        self._metrics.quota_rejections.labels(limit=limit).inc()
        retry = max(1, math.ceil(stats.reset_time - time.time()))
        type = (
            ErrorType.RATE_LIMITED if limit == "requests_per_minute" else ErrorType.QUOTA_EXCEEDED
        )
        what = limit.replace("_", " ")
        raise ServiceError(
            type,
            f"the API key {key.name!r} is over its limit of {item.amount} {what}",
            retry_after_s=retry,
        )

    async def usage(self, key: ApiKey) -> Usage:
        """What `key` has used of each limit (in every replica, with Redis); UNAVAILABLE
        while Redis fails."""
        try:
            return await self._usage(key)
        except StoreUnavailable:
            raise ServiceError(ErrorType.UNAVAILABLE, "usage cannot be read now; retry") from None

    async def _usage(self, key: ApiKey) -> Usage:
        requests = None
        if key.requests_per_minute is not None:
            per_minute: RateLimitItem = RateLimitItemPerMinute(key.requests_per_minute)
            stats = await self._call(partial(self._requests.get_window_stats, per_minute, key.name))
            requests = Count(per_minute.amount - stats.remaining, key.requests_per_minute, 60)
        counts = []
        for _, item, limit in _character_items(key):
            stats = await self._call(partial(self._characters.get_window_stats, item, key.name))
            counts.append(Count(item.amount - stats.remaining, limit, item.get_expiry()))
        return Usage(key.name, requests, *counts)


def _character_items(key: ApiKey) -> list[tuple[str, RateLimitItem, int | None]]:
    return [
        (
            "characters_per_day",
            RateLimitItemPerDay(key.characters_per_day or UNLIMITED),
            key.characters_per_day,
        ),
        (
            "characters_per_month",
            RateLimitItemPerMonth(key.characters_per_month or UNLIMITED),
            key.characters_per_month,
        ),
    ]


class Access:
    """Authentication (static and stored keys) and the stored keys' limits."""

    def __init__(self, settings: Settings, link: RedisLink | None, metrics: Metrics) -> None:
        self._static = [key.get_secret_value().encode() for key in settings.api_keys]
        self.store = open_store(settings, link)
        self.quotas = Quotas.create(settings, link, metrics)
        if self.store is not None and link is None and settings.workers > 1:
            log.warning(
                "each of the %d worker processes counts the API keys' limits on its own (a key "
                "gets up to %d times its limits): set redis_url to count them in one place",
                settings.workers,
                settings.workers,
            )
        self._reload_s = settings.keys_reload_s
        self._keys: dict[str, ApiKey] | None = None  # by digest; None: never loaded
        self._version = -1
        self._checked = -math.inf  # time.monotonic() of the last version check
        self._lock = asyncio.Lock()

    @property
    def required(self) -> bool:
        """Whether a request needs a key: with static keys or a key store."""
        return bool(self._static) or self.store is not None

    async def authenticate(self, secret: str | None, origin: str | None) -> ApiKey | None:
        """The stored key `secret` is (None: a static key, or no key needed), or a
        ServiceError: UNAUTHORIZED, or UNAVAILABLE while the store was never read."""
        if not self.required:
            return None
        if secret is None:
            raise ServiceError(ErrorType.UNAUTHORIZED, "an API key is required")
        presented = secret.encode()
        # Constant time, and every static key compared: the answer's timing tells nothing.
        accepted = False
        for known in self._static:
            accepted |= hmac.compare_digest(known, presented)
        if accepted:
            return None
        stored = (await self._stored()).get(digest(secret))
        if stored is None:
            raise ServiceError(ErrorType.UNAUTHORIZED, "invalid API key")
        if stored.origins and origin not in stored.origins:
            raise ServiceError(
                ErrorType.UNAUTHORIZED, f"this API key may not be used from origin {origin!r}"
            )
        return stored

    async def _stored(self) -> dict[str, ApiKey]:
        """The stored keys by digest, reloaded when the store's version moved (checked at most
        every keys_reload_s); the last ones read while the store cannot be read."""
        if self.store is None:
            return {}
        if time.monotonic() - self._checked >= self._reload_s:
            async with self._lock:
                if time.monotonic() - self._checked >= self._reload_s:
                    await self._reload(self.store)
        if self._keys is None:
            raise ServiceError(ErrorType.UNAVAILABLE, "the API keys cannot be read now; retry")
        return self._keys

    async def _reload(self, store: KeyStore) -> None:
        try:
            version = await store.version()
            if version != self._version:
                self._take(await store.keys(), version)
        except StoreUnavailable:
            pass  # counted and logged by the link; the keys last read stay
        finally:
            self._checked = time.monotonic()

    def _take(self, keys: list[ApiKey], version: int) -> None:
        if version < self._version and not keys and self._keys:
            # Versions only grow: the store lost its data (Redis restarted without
            # persistence). The keys last read stay until one is added again.
            log.warning(
                "the key store is empty and its version went back from %d to %d (Redis lost "
                "its data?): keeping the %d keys last read until one is added again",
                self._version,
                version,
                len(self._keys),
            )
        else:
            self._keys = {key.digest: key for key in keys}
            log.info("API keys: %d stored (version %d)", len(keys), version)
        self._version = version

    async def start(self) -> None:
        """Read the stored keys before the first request needs them."""
        if self.store is not None:
            async with self._lock:
                await self._reload(self.store)

    async def charge(self, key: ApiKey | None, characters: int) -> None:
        """Count a request against a stored key's limits (Quotas.charge); a static key or no
        key has none."""
        if key is not None:
            await self.quotas.charge(key, characters)
