"""`python -m service.keys add|list|set|remove|usage`: manage the API keys of the key store
(service/keys/store.py), which a running service reloads within keys_reload_s.

The store is the service's: MT_KEY_STORE, MT_KEYS_DB and MT_REDIS_URL, or --store, --db and
--redis-url here. Limits are a number or "unlimited"."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.keys.access import Quotas
from service.keys.store import ApiKey, KeyExists, KeyStore, digest, open_store
from service.metrics import Metrics
from service.settings import Settings, invalid_settings
from service.store.connection import RedisLink, StoreUnavailable

LIMITS = ("requests_per_minute", "characters_per_day", "characters_per_month")
UNLIMITED = "unlimited"
COMMANDS = """commands (each has --help):
  add NAME [--key SECRET] [--requests-per-minute N] [--characters-per-day N]
           [--characters-per-month N] [--origin ORIGIN]...
  set NAME [--requests-per-minute N] [--characters-per-day N] [--characters-per-month N]
           [--origin ORIGIN]... [--any-origin]
  list
  remove NAME
  usage NAME"""


def _limit(value: str) -> int | None:
    if value == UNLIMITED:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"a positive whole number or {UNLIMITED}, not {value!r}")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.keys",
        description=__doc__,
        epilog=COMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", choices=["sqlite", "redis"], help="default: MT_KEY_STORE")
    parser.add_argument("--db", type=Path, help="the SQLite file; default: MT_KEYS_DB")
    parser.add_argument("--redis-url", help="default: MT_REDIS_URL")
    commands = parser.add_subparsers(dest="command", required=True)

    def limits(command: argparse.ArgumentParser, default: Any) -> None:
        for name in LIMITS:
            command.add_argument(
                f"--{name.replace('_', '-')}", type=_limit, default=default, metavar="N"
            )
        command.add_argument(
            "--origin",
            action="append",
            dest="origins",
            help="a browser origin the key may be used from (repeat); none: any",
        )

    add = commands.add_parser("add", help="add a key; its secret is printed once")
    add.add_argument("name")
    add.add_argument("--key", help="the secret (default: 32 random URL-safe characters)")
    limits(add, None)
    change = commands.add_parser("set", help="change a key's limits or origins")
    change.add_argument("name")
    limits(change, argparse.SUPPRESS)
    change.add_argument("--any-origin", action="store_true", help="remove its origins")
    commands.add_parser("list", help="the keys and their limits (not their secrets)")
    remove = commands.add_parser("remove", help="remove a key")
    remove.add_argument("name")
    usage = commands.add_parser("usage", help="a key's use of its limits (needs Redis)")
    usage.add_argument("name")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    given = {
        "key_store": args.store,
        "keys_db": args.db,
        "redis_url": args.redis_url,
    }
    return Settings(**{name: value for name, value in given.items() if value is not None})


def _describe(key: ApiKey) -> str:
    def shown(value: int | None) -> str:
        return UNLIMITED if value is None else str(value)

    origins = ", ".join(key.origins) or "any"
    return (
        f"{key.name}: {shown(key.requests_per_minute)} requests/minute, "
        f"{shown(key.characters_per_day)} characters/day, "
        f"{shown(key.characters_per_month)} characters/month; origins: {origins}"
    )


async def _run(args: argparse.Namespace, settings: Settings) -> str:
    link = None
    if settings.redis_url is not None:
        link = RedisLink(
            settings.redis_url.get_secret_value(),
            timeout_s=max(settings.redis_timeout_s, 2.0),  # a person waits, not a request
            retry_s=settings.redis_retry_s,
            metrics=Metrics(),
        )
    try:
        store = open_store(settings, link)
        if store is None:
            raise LookupError("no key store: set MT_KEY_STORE (or --store) to sqlite or redis")
        return await _command(args, store, settings, link)
    finally:
        if link is not None:
            await link.close()


async def _find(store: KeyStore, name: str) -> ApiKey:
    for key in await store.keys():
        if key.name == name:
            return key
    raise LookupError(f"no key named {name!r}")


async def _command(
    args: argparse.Namespace, store: KeyStore, settings: Settings, link: RedisLink | None
) -> str:
    if args.command == "add":
        secret = args.key or secrets.token_urlsafe(24)
        key = ApiKey(
            args.name,
            digest(secret),
            args.requests_per_minute,
            args.characters_per_day,
            args.characters_per_month,
            tuple(args.origins or ()),
        )
        await store.add(key)
        return f"{_describe(key)}\nkey (shown only now): {secret}"
    if args.command == "list":
        return "\n".join(_describe(key) for key in await store.keys()) or "no keys"
    if args.command == "set":
        changes = {name: getattr(args, name) for name in LIMITS if hasattr(args, name)}
        if args.origins or args.any_origin:
            changes["origins"] = tuple(args.origins or ())
        key = dataclasses.replace(await _find(store, args.name), **changes)
        await store.replace(key)
        return _describe(key)
    if args.command == "remove":
        if not await store.remove(args.name):
            raise LookupError(f"no key named {args.name!r}")
        return f"removed {args.name}"
    key = await _find(store, args.name)  # usage
    if link is None:
        raise LookupError(
            "without redis_url each service process counts its own use: ask it, GET /usage"
        )
    used = await Quotas.create(settings, link, Metrics()).usage(key)
    lines = [f"{key.name}:"]
    for name in LIMITS:
        count = getattr(used, name)
        if count is not None:
            limit = UNLIMITED if count.limit is None else count.limit
            lines.append(f"  {name.replace('_', ' ')}: {count.used} of {limit}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ValidationError as e:
        print(invalid_settings(e), file=sys.stderr)
        return 2
    try:
        print(asyncio.run(_run(args, settings)))
    except KeyExists as e:
        print(f"a key named {e} (or with that secret) exists already", file=sys.stderr)
        return 1
    except (LookupError, StoreUnavailable) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
