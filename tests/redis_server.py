"""A real redis-server for the tests that need one (shared state: service/store/): Debian's
`redis-server` from PATH, on a free loopback port, in a temporary directory, without
persistence. A test that finds none on PATH is skipped (CI installs the Debian package).

`stop()` and `start()` take it down and bring it back on the same port (the fault tests)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from benchmarks.servers import free_port

EXECUTABLE = "redis-server"


class RedisServer:
    def __init__(self, directory: Path) -> None:
        executable = shutil.which(EXECUTABLE)
        if executable is None:
            raise FileNotFoundError(f"{EXECUTABLE} is not on PATH")
        self.executable = executable
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
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

    def flush(self) -> None:
        """Empty every key (between tests that share the server)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)
