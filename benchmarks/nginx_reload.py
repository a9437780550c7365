"""nginx reloaded under load: what a reload does to clients' kept-alive connections, with and
without `keepalive_min_timeout` (nginx 1.27.4 and later).

    python -m benchmarks.nginx_reload [--nginx /usr/sbin/nginx] [--root DIR] \\
        [--keepalive-min-timeout 1s] [--seconds 20] [--every 0.25] [--clients 8]

An nginx of its own on a free port answers every request itself (`return 200`: no service
behind it, so that what fails is the connection between client and nginx, which is all a
reload touches), while `--clients` httpx clients, each on one kept-alive connection, POST a
translation request after another, and nginx is reloaded (SIGHUP) every `--every` seconds.
Before 1.27.4 an old worker closes its connections, idle or just answered, and a request sent
on one as it closes gets no answer; with `--keepalive-min-timeout` it keeps them that long and
answers with "Connection: close". `--root` runs an nginx installed under another root
(chroot: e.g. Debian unstable's, `mmdebstrap --variant=minbase --include=nginx-light sid
DIR`). Reports the reloads, the answers and the failures by kind; the last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import HOST, free_port, nginx_binary

CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    keepalive_timeout 75s;
    {min_timeout}
    server {{
        listen {host}:{port};
        location / {{ return 200 "{{}}"; }}
    }}
}}
"""
BODY = {"text": "Two dogs are playing in the snow.", "source": "en", "target": "de"}


async def load(
    url: str, clients: int, seconds: float, every: float, reload: object
) -> dict[str, Any]:
    """Clients posting back to back for `seconds`, `reload()` every `every` seconds: the
    reloads and the outcomes (status codes and exception names) counted."""
    outcomes: Counter[str] = Counter()
    stop = time.monotonic() + seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            while time.monotonic() < stop:
                try:
                    outcomes[str((await http.post("/translate", json=BODY)).status_code)] += 1
                except httpx.HTTPError as e:
                    outcomes[type(e).__name__] += 1

    async def reloader() -> int:
        reloads = 0
        while time.monotonic() + every < stop:
            await asyncio.sleep(every)
            reload()  # type: ignore[operator]
            reloads += 1
        return reloads

    *_, reloads = await asyncio.gather(*(client() for _ in range(clients)), reloader())
    return {"reloads": reloads, "outcomes": dict(outcomes)}


def run(
    nginx: str, root: str, min_timeout: str, clients: int, seconds: float, every: float
) -> dict[str, Any]:
    """One run on an nginx of its own (under `root` if given): see the module's docstring."""
    port = free_port()
    with tempfile.TemporaryDirectory(
        prefix="mt-reload-", dir=f"{root}/tmp" if root else None
    ) as tmp:
        inside = tmp.removeprefix(root) if root else tmp  # the directory as nginx sees it
        directive = f"keepalive_min_timeout {min_timeout};" if min_timeout else ""
        conf = CONF.format(dir=inside, min_timeout=directive, host=HOST, port=port)
        Path(tmp, "nginx.conf").write_text(conf, encoding="utf-8")
        command = [nginx, "-c", f"{inside}/nginx.conf", "-g", "daemon off;"]
        # What it says before its error_log is open (a refused directive) goes to stderr.
        with open(Path(tmp, "stderr"), "w") as stderr:
            process = subprocess.Popen(
                ["chroot", root, *command] if root else command, stderr=stderr
            )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    said = [Path(tmp, name) for name in ("stderr", "error.log")]
                    text = "".join(path.read_text() for path in said if path.exists())
                    raise RuntimeError(f"nginx did not start: {text}")
                try:
                    httpx.get(f"http://{HOST}:{port}/", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            version = subprocess.run(
                ["chroot", root, nginx, "-v"] if root else [nginx, "-v"],
                capture_output=True, text=True, check=True,
            ).stderr.strip().rsplit("/", 1)[-1]  # fmt: skip
            result = asyncio.run(
                load(f"http://{HOST}:{port}", clients, seconds, every,
                     lambda: process.send_signal(signal.SIGHUP))
            )  # fmt: skip
        finally:
            process.send_signal(signal.SIGQUIT)  # graceful: what is in progress ends
            process.wait(timeout=30)
    answered = result["outcomes"].get("200", 0)
    failed = sum(result["outcomes"].values()) - answered
    return {"nginx": version, "keepalive_min_timeout": min_timeout or None, **result,
            "answered": answered, "failed": failed}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nginx", default=None, help="its path (default: nginx on PATH)")
    parser.add_argument("--root", default="", help="run it with chroot under this root")
    parser.add_argument("--keepalive-min-timeout", default="", help="e.g. 1s (1.27.4 and later)")
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
