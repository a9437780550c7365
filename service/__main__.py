"""`python -m service [--bundle DIR ...] [--host H] [--port P] [--any-setting V]`: serve with
uvicorn. Every setting is a flag (`--help` lists them) and an `MT_*` environment variable.

SIGTERM drains: /ready turns 503 and new requests get 503 while every accepted request is
translated and answered; then the server exits, all within `--drain-timeout-s`
(service/http/server.py). `--workers N` runs N such servers on the one port, under a process
that supervises them (service/http/workers.py).

Keep-alive: an idle connection stays open `--keep-alive-timeout-s` (75 s), longer than the
proxies and client pools in front keep theirs, so that they close idle connections, never the
server (see service/settings.py). A connection's request head and body are bounded in size and
time, and open connections in number (service/http/connections.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from pydantic import ValidationError
from pydantic_settings import CliApp

from service.bundle.manifest import BundleError
from service.http.app import create_app
from service.http.server import DrainingServer, uvicorn_config
from service.http.workers import serve_workers
from service.inference.models import bundle_directories
from service.settings import Settings, invalid_settings

log = logging.getLogger("service")


def main(argv: list[str] | None = None) -> int:
    try:
        settings = CliApp.run(Settings, cli_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as e:  # a value out of range, of the wrong type, inconsistent ones
        print(f"python -m service: {invalid_settings(e)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if "MT_SHIPPED_BUNDLE" in os.environ:
        log.warning(
            "MT_SHIPPED_BUNDLE is not read any more: the shipped bundles are built under "
            "MT_SHIPPED_BUNDLES (a directory; now %s)",
            settings.shipped_bundles,
        )
    # Once, before the server binds its port and before any worker starts: the first start may
    # export the shipped models or import a --model directory (N workers would each do it, and
    # race to put their bundle in the cache).
    try:
        bundles = bundle_directories(settings)
    except BundleError as e:
        log.error("%s", e)
        return 2
    settings = settings.model_copy(update={"bundle": bundles, "model": []})
    if settings.workers > 1:
        return serve_workers(settings)
    app = create_app(settings)
    server = DrainingServer(uvicorn_config(app, settings), app, settings.drain_timeout_s)
    # uvicorn raises a SIGINT (Ctrl-C) again once it has shut down: the shutdown is done, and
    # ends with status 0 as in `--workers` mode, not a traceback.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()  # exits with status 3 itself when the app cannot start (a bad bundle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
