"""The process's one connection to Redis (`redis_url`), which every shared-state user goes
through: the sentence cache (service/scheduling/cache.py), the API keys and their quotas
(service/keys/), document jobs (service/documents/store.py) and glossaries
(service/glossaries.py).

Redis is never on a request's critical path for longer than `redis_timeout_s`: every call runs
under that timeout (a connection from the pool, connecting, the command), and a failure opens a
breaker for `redis_retry_s` during which calls fail at once (`StoreUnavailable`), so that a Redis
that is down or restarting costs each request nothing; the next call after it tries Redis again.
What a caller does with `StoreUnavailable` is its own policy: the cache skips itself, quotas
fail open or closed (`quota_fail_open`), documents and glossaries answer 503 (`required`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError
from redis.maint_notifications import MaintNotificationsConfig

from service.errors import ErrorType, ServiceError
from service.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# Connections one process holds to Redis at most; a call that finds all busy waits for one,
# within its timeout.
MAX_CONNECTIONS = 64
# Idle connections are checked with a PING before use after this long (a Redis restart or an
# idle timeout in between would otherwise fail the first command on them).
HEALTH_CHECK_S = 30


class StoreUnavailable(Exception):
    """Redis did not answer within the timeout, failed, or failed within the last
    `redis_retry_s` (the breaker is open)."""


def text(value: bytes | str) -> str:
    """A Redis reply as text (the client answers bytes)."""
    return value.decode() if isinstance(value, bytes) else value


@contextlib.contextmanager
def required(what: str) -> Iterator[None]:
    """Around the calls that cannot go on without Redis (documents, glossaries): a
    StoreUnavailable answered as a 503 with Retry-After, naming `what` could not be reached."""
    try:
        yield
    except StoreUnavailable as e:
        raise ServiceError(
            ErrorType.UNAVAILABLE, f"{what} cannot be reached now ({e}); retry later"
        ) from None


class RedisLink:
    """One Redis client (one connection pool) per process, its calls bounded in time."""

    def __init__(self, url: str, *, timeout_s: float, retry_s: float, metrics: Metrics) -> None:
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._metrics = metrics
        self.pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_s,  # waiting for a free connection
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=HEALTH_CHECK_S,
            # Made once: by default each new connection reads redis-py's version from its
            # package metadata (a file parsed, ~1 ms of the event loop per connection, which a
            # burst opening connections pays on every one).
            driver_info=DriverInfo(),
            # Off: with them on ("auto", redis-py 8's default over RESP3) the pool hands out a
            # connection without checking that the server has not closed it, so after a Redis
            # restart each connection left in the pool failed its first command (and opened the
            # breaker for everyone); they are Redis Enterprise's failover notices besides, and
            # "auto" asks for them (an error from Redis 7) on every new connection.
            maint_notifications_config=MaintNotificationsConfig(enabled=False),
        )
        # No retries inside the client: one attempt within the timeout, then the breaker.
        self.client = redis.Redis(connection_pool=self.pool, retry=Retry(NoBackoff(), 0))
        self._down_until = -float("inf")  # time.monotonic() until which calls fail at once
        self._down = False
        metrics.redis_up.set(1)

    @property
    def up(self) -> bool:
        """Whether the last call succeeded (or none failed yet)."""
        return not self._down

    async def run(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, or StoreUnavailable within `timeout_s`; `operation` labels the
        failure's metric and log line."""
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"Redis failed in the last {self.retry_s:g} s")
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await call()
        except (RedisError, OSError, TimeoutError) as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # The caller was cancelled (a shutdown stopping a worker), not Redis failing:
                # Python 3.11's timeout can report a cancellation that meets it as its own
                # TimeoutError, and the worker would take it for an outage and go on for ever.
                raise asyncio.CancelledError from e
            self._down_until = time.monotonic() + self.retry_s
            self._metrics.redis_errors.labels(operation=operation).inc()
            if not self._down:  # one line per outage, not one per request
                log.warning(
                    "Redis failed (%s: %s: %s); skipped for %g s at a time until it answers",
                    operation,
                    e.__class__.__name__,
                    e,
                    self.retry_s,
                )
                self._down = True
                self._metrics.redis_up.set(0)
            raise StoreUnavailable(f"Redis failed: {e.__class__.__name__}") from e
        if self._down:
            log.info("Redis answers again")
            self._down = False
            self._metrics.redis_up.set(1)
        return result

    async def close(self) -> None:
        """Close the client and its pool, within `timeout_s` as every call: a shutdown never
        waits on Redis (closing a pool whose connection a store in progress holds can wait for
        ever; seen in tests, two apps one after the other in one process)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.client.aclose()
                await self.pool.aclose()
        except (RedisError, OSError, TimeoutError) as e:
            log.warning("Redis not closed cleanly (%s): left to the process's exit", e)
