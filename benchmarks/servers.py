"""What the load benchmarks and the server tests run against, on 127.0.0.1 only: `python -m
service` in a subprocess, and nginx in front of it with the configuration users take
(deploy/nginx/transformer-mt.conf), in a temporary prefix of its own (no root needed).
Also the helpers they share: a free port, the readiness poll, the sentences to send."""

from __future__ import annotations

import contextlib
import grp
import gzip
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.paths import REPO

HOST = "127.0.0.1"  # loopback only, always
NGINX_CONF = REPO / "deploy" / "nginx" / "transformer-mt.conf"

# Image-caption sentences like the shipped model's domain (Multi30k).
DEFAULT_TEXTS = [
    "A man in a blue shirt is riding a bike.",
    "Two young children are playing in the sand on the beach.",
    "A woman with a red hat is sitting on a bench in the park.",
    "A black dog runs through the snow.",
    "Several people are standing in front of a large building.",
    "A little girl climbs the stairs to her playhouse.",
    "A group of men are playing soccer on a field.",
    "An older man is cooking food in a small kitchen.",
]


def read_texts(path: Path | None) -> list[str]:
    """One sentence per line (plain or .gz), blank lines dropped; DEFAULT_TEXTS without a
    file."""
    if path is None:
        return DEFAULT_TEXTS
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f]
    return [t for t in texts if t] or DEFAULT_TEXTS


def percentile_ms(values: list[float], q: int) -> float:
    """The q-th percentile of durations in seconds, in milliseconds."""
    if len(values) < 2:
        return round(1000 * values[0], 1) if values else 0.0
    return round(1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def wrk_percentile_ms(out: str, percent: int) -> float | None:
    """A percentile (50, 75, 90 or 99) of the latency distribution wrk prints with --latency,
    in ms; None where `out` has none."""
    found = re.search(rf"^\s*{percent}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    if found is None:
        return None
    return float(found.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[found.group(2)]


def metric(text: str, name: str, **labels: str) -> float:
    """The value of sample `name` with `labels` in Prometheus text (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def cpu_ns(pid: int) -> tuple[int, int]:
    """CPU time so far (ns, from the scheduler's own accounting: /proc/.../schedstat) of
    process `pid` and its children: its main thread's (a service's event loop), and all its
    other threads' and its children's (the engine's threads; nginx's workers)."""
    main = other = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # ended and reaped
        return main, other
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns = int(f.read().split()[0])
            if int(task) == pid:
                main += ns
            else:
                other += ns
            with open(f"/proc/{pid}/task/{task}/children") as f:
                other += sum(sum(cpu_ns(int(child))) for child in f.read().split())
        except (FileNotFoundError, ProcessLookupError):  # this task ended meanwhile
            continue
    return main, other


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def wait_until_ready(
    url: str, process: subprocess.Popen[Any], timeout: float = 300.0, path: str = "/ready"
) -> None:
    """Poll `url``path` until 200; fail with the process's output (when captured) if it exits
    first. The tests start their servers with it too."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout is not None else ""
            raise RuntimeError(f"exited {process.returncode} before {url} was ready: {output}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url}{path} not ready after {timeout:.0f} s")


@dataclass(frozen=True)
class Running:
    port: int
    process: subprocess.Popen[Any]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_service(bundle: Path, flags: list[str], port: int) -> subprocess.Popen[Any]:
    """`python -m service` on 127.0.0.1:`port`, started (not yet ready); its output goes to
    this process's. Without the sentence cache unless `flags` say `--cache`: the benchmarks
    send the same sentences again and again, and measure the model and the service, not the
    cache (benchmarks/cache_replay.py measures that)."""
    if "--cache" not in flags and "--no-cache" not in flags:
        flags = [*flags, "--no-cache"]
    command = [
        sys.executable, "-m", "service", "--bundle", str(bundle), "--host", HOST,
        "--port", str(port), "--log-level", "warning", *flags,
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=os.environ.copy())


@contextlib.contextmanager
def service(bundle: Path, flags: list[str], port: int | None = None) -> Iterator[Running]:
    """`python -m service` on 127.0.0.1 (a free port unless given), ready when yielded; its
    output goes to this process's. A server that does not start ends the run (SystemExit)."""
    with services(bundle, flags, 1, None if port is None else [port]) as (running,):
        yield running


@contextlib.contextmanager
def services(
    bundle: Path, flags: list[str], count: int, ports: Sequence[int] | None = None
) -> Iterator[list[Running]]:
    """`count` of `service` (on `ports`, else free ones), started side by side (their models
    load at once, not one after the other), all ready when yielded."""
    ports = list(ports or [free_port() for _ in range(count)])
    processes: list[subprocess.Popen[Any]] = []
    try:
        for port in ports:
            processes.append(start_service(bundle, flags, port))
        for port, process in zip(ports, processes, strict=True):
            try:
                wait_until_ready(f"http://{HOST}:{port}", process)
            except (RuntimeError, TimeoutError) as e:
                raise SystemExit(str(e)) from None
        yield [Running(port, process) for port, process in zip(ports, processes, strict=True)]
    finally:
        for process in processes:
            stop(process)


def nginx_binary() -> str | None:
    """nginx on PATH, or where Debian installs it (/usr/sbin is not on a user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


def nginx_config(upstream_ports: Sequence[int], listen_port: int, conf: Path = NGINX_CONF) -> str:
    """`conf` (an http-context file: one upstream server, one listen port) pointed at the
    services on `upstream_ports` (one server line each, in place of its one) and listening on
    127.0.0.1:`listen_port`."""
    text = conf.read_text(encoding="utf-8")
    text, servers = re.subn(
        r"^(\s*server\s+)[^\s;]+(.*;)$",  # the address, then the line's parameters
        lambda m: "\n".join(f"{m.group(1)}{HOST}:{port}{m.group(2)}" for port in upstream_ports),
        text,
        flags=re.M,
    )
    text, listens = re.subn(
        r"^(\s*listen\s+)\S+;", rf"\g<1>{HOST}:{listen_port};", text, flags=re.M
    )
    if (servers, listens) != (1, 1):
        raise ValueError(
            f"{conf}: expected one upstream server line and one listen line, found "
            f"{servers} and {listens}"
        )
    return text


def nginx_main(prefix: Path, http: str, worker_connections: int = 1024) -> str:
    """An nginx.conf in the foreground whose pid file, error log and temporary files are all
    under `prefix` (as nginx sees it), around `http` (the http context's lines)."""
    temp_paths = "".join(
        f"    {kind}_temp_path {prefix / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # Started as root, nginx would run its workers as nobody, who cannot write here.
    user = f"user root {grp.getgrgid(os.getegid()).gr_name};\n" if os.geteuid() == 0 else ""
    return (
        f"daemon off;\n{user}worker_processes auto;\npid {prefix / 'nginx.pid'};\n"
        f"error_log {prefix / 'error.log'} warn;\n"
        f"events {{\n    worker_connections {worker_connections};\n}}\n"
        f"http {{\n{temp_paths}{http}}}\n"
    )


def nginx_command(binary: str, prefix: Path) -> list[str]:
    """`binary` run with `prefix`'s nginx.conf (`nginx_main`), logging there from the start."""
    return [binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
            "-e", str(prefix / "error.log")]  # fmt: skip


@contextlib.contextmanager
def nginx(
    upstream: int | Sequence[int], worker_connections: int = 1024, access_log: Path | None = None
) -> Iterator[Running]:
    """nginx in the foreground with deploy/nginx/transformer-mt.conf in front of the
    service(s) on the `upstream` port(s); its pid file, logs and temporary files in a directory
    of its own; with `access_log`, each request's status and the upstream(s) it went to
    (`$status $upstream_addr $upstream_status`, a comma between the tries). Ready (proxying
    /health with 200) when yielded. Needs nginx (`nginx_binary()`)."""
    binary = nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx not found (Debian: apt-get install nginx)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mt-nginx-") as tmp:
        prefix = Path(tmp)
        ports = [upstream] if isinstance(upstream, int) else list(upstream)
        (prefix / "transformer-mt.conf").write_text(nginx_config(ports, port))
        logging = (
            "    access_log off;\n"
            if access_log is None
            else "    log_format tries '$status $upstream_addr $upstream_status';\n"
            f"    access_log {access_log} tries;\n"
        )
        http = f"{logging}    include {prefix / 'transformer-mt.conf'};\n"
        (prefix / "nginx.conf").write_text(nginx_main(prefix, http, worker_connections))
        command = nginx_command(binary, prefix)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        url = f"http://{HOST}:{port}"
        try:
            try:
                wait_until_ready(url, process, timeout=30, path="/health")
            except (RuntimeError, TimeoutError) as e:
                errors = (prefix / "error.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{e}\n{errors}") from None
            yield Running(port, process)
        finally:
            stop(process)


REDIS_SERVER = "redis-server"


class RedisServer:
    """Debian's `redis-server` from PATH on a free loopback port, in `directory`: what the
    shared-state tests and benchmarks/cache_replay.py run against; `persistent`: every write
    appended to its file before it answers (as deploy/ runs it), else no persistence.
    `stop()` (a kill) and `start()` take it down and bring it back on the same port, with what
    it had written when persistent; `freeze()` and `thaw()` make it hang and go on (the fault
    tests). Raises FileNotFoundError where it is not
    installed (Debian: apt-get install redis-server)."""

    def __init__(self, directory: Path, *, persistent: bool = False) -> None:
        executable = shutil.which(REDIS_SERVER)
        if executable is None:
            raise FileNotFoundError(f"{REDIS_SERVER} is not on PATH")
        self.executable = executable
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else []

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port", str(self.port),
                "--bind", HOST,
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "yes",
                *self.persistence,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def freeze(self) -> None:
        """Stop the server without closing anything (SIGSTOP): connections open and commands
        are sent, and nothing answers, as from a Redis that hangs; `thaw()` lets it go on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def flush(self) -> None:
        """Empty every key (between tests that share the server)."""
        with socket.create_connection((HOST, self.port), timeout=2) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)
