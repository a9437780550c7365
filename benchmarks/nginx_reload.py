"""nginx reloaded under load: what a reload does to clients' kept-alive connections, with and
without `keepalive_min_timeout` (which nginx has from 1.27.4).

    python -m benchmarks.nginx_reload [--nginx /usr/sbin/nginx] [--root DIR] \\
        [--keepalive-min-timeout 1s] [--seconds 20] [--every 0.25] [--clients 8]

An nginx of its own on a free port answers every request itself (`return 200`: no service
behind it, so that what fails is the connection between client and nginx, which is all a
reload touches), while `--clients` httpx clients, each on one kept-alive connection, POST a
translation request after another, and nginx is reloaded (SIGHUP) every `--every` seconds.
Without keepalive_min_timeout an old worker closes its connections, idle or just answered,
and a request sent on one as it closes gets no answer; with `--keepalive-min-timeout` (nginx
has it from 1.27.4) it keeps them that long and answers with "Connection: close". `--root`
runs an nginx installed under another root (chroot: e.g. Debian unstable's, `mmdebstrap
--variant=minbase --include=nginx-light sid DIR`). Reports the reloads, the answers and the
failures by kind; the last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import (
    HOST,
    free_port,
    nginx_binary,
    nginx_command,
    nginx_main,
    stop,
    wait_until_ready,
)

# The http context: a server that answers every request itself.
HTTP = """    access_log off;
    keepalive_timeout 75s;
    {min_timeout}
    server {{
        listen {host}:{port};
        location / {{ return 200 "{{}}"; }}
    }}
"""
BODY = {"text": "Two dogs are playing in the snow.", "source": "en", "target": "de"}


async def load(
    url: str, clients: int, seconds: float, every: float, reload: Callable[[], object]
) -> dict[str, Any]:
    """Clients posting back to back for `seconds`, `reload()` every `every` seconds: the
    reloads and the outcomes (status codes and exception names) counted."""
    outcomes: Counter[str] = Counter()
    end = time.monotonic() + seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            while time.monotonic() < end:
                try:
                    outcomes[str((await http.post("/translate", json=BODY)).status_code)] += 1
                except httpx.HTTPError as e:
                    outcomes[type(e).__name__] += 1

    async def reloader() -> int:
        reloads = 0
        while time.monotonic() + every < end:
            await asyncio.sleep(every)
            reload()
            reloads += 1
        return reloads

    *_, reloads = await asyncio.gather(*(client() for _ in range(clients)), reloader())
    return {"reloads": reloads, "outcomes": dict(outcomes)}


def nginx_version(binary: str, root: str = "") -> tuple[int, ...]:
    """`binary`'s version (under `root` if given), from `nginx -v`."""
    said = subprocess.run(
        ["chroot", root, binary, "-v"] if root else [binary, "-v"],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    return parse_version(said)


def parse_version(said: str) -> tuple[int, ...]:
    """The version in what `nginx -v` says ("nginx version: nginx/1.24.0 (Ubuntu)")."""
    found = re.search(r"nginx/(\d+(?:\.\d+)*)", said)
    if found is None:
        raise ValueError(f"no nginx version in {said!r}")
    return tuple(int(part) for part in found[1].split("."))


def run(
    nginx: str, root: str, min_timeout: str, clients: int, seconds: float, every: float
) -> dict[str, Any]:
    """One run on an nginx of its own (under `root` if given): see the module's docstring."""
    port = free_port()
    top = Path(root).resolve() if root else None
    with tempfile.TemporaryDirectory(prefix="mt-reload-", dir=top and top / "tmp") as tmp:
        # Its directory as nginx sees it: its prefix, configuration, logs and temporary files.
        inside = Path("/", Path(tmp).relative_to(top)) if top else Path(tmp)
        directive = f"keepalive_min_timeout {min_timeout};" if min_timeout else ""
        http = HTTP.format(min_timeout=directive, host=HOST, port=port)
        Path(tmp, "nginx.conf").write_text(nginx_main(inside, http), encoding="utf-8")
        command = nginx_command(nginx, inside)
        process = subprocess.Popen(
            ["chroot", str(top), *command] if top else command,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        url = f"http://{HOST}:{port}"
        try:
            try:
                wait_until_ready(url, process, timeout=30, path="/")
            except (RuntimeError, TimeoutError) as e:
                errors = Path(tmp, "error.log")
                said = errors.read_text(errors="replace")[-2000:] if errors.exists() else ""
                raise RuntimeError(f"nginx did not start: {e}\n{said}") from None
            version = nginx_version(nginx, str(top) if top else "")
            reload = partial(process.send_signal, signal.SIGHUP)
            result = asyncio.run(load(url, clients, seconds, every, reload))
        finally:
            stop(process)
    answered = result["outcomes"].get("200", 0)
    failed = sum(result["outcomes"].values()) - answered
    return {"nginx": ".".join(map(str, version)), "keepalive_min_timeout": min_timeout or None,
            **result, "answered": answered, "failed": failed}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nginx",
        default=None,
        help="its path (default: nginx on PATH; /usr/sbin/nginx with --root)",
    )
    parser.add_argument("--root", default="", help="run it with chroot under this root")
    parser.add_argument(
        "--keepalive-min-timeout", default="", help="e.g. 1s (nginx has it from 1.27.4)"
    )
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between reloads")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    binary = args.nginx or (nginx_binary() if not args.root else "/usr/sbin/nginx")
    if binary is None:
        parser.error("nginx not found (Debian: apt-get install nginx)")
    report = run(binary, args.root, args.keepalive_min_timeout, args.clients, args.seconds,
                 args.every)  # fmt: skip
    print(
        f"nginx {report['nginx']}, keepalive_min_timeout {report['keepalive_min_timeout']}: "
        f"{report['reloads']} reloads, {report['answered']} answered, {report['failed']} "
        f"failed {report['outcomes']}",
        file=sys.stderr,
    )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
