"""Several server processes on one port (`--workers N`): each a whole service (its own models,
batcher, event loop and decoder-step threads), all accepting on one listening socket that this
process binds, so the kernel hands each new connection to one of them. One process's Python
(HTTP, tokenizing, batching, the search) runs on one core at a time: on a GPU host it, not the
GPU, bounds the requests per second (an H100 was 26-35 % busy at 631 requests/s,
benchmarks/RESULTS.md), and a many-core CPU runs a small model faster as several processes of
a few threads than as one of many.

This process only supervises: it binds the socket, starts the workers (spawned: a fresh
interpreter each, nothing inherited but the socket and the settings; each in a process group
of its own, so that a terminal's Ctrl-C or a signal to this process's group reaches them once,
from here), and
- forwards SIGTERM (each worker drains, service/http/server.py) and SIGINT to them, then waits
  for them, at most the drain timeout and a margin, and exits (1 where one had to be killed);
- starts a new worker when one dies (a crash, the kernel's OOM killer), so the others go on
  serving and the service keeps its size; but when one of the first workers could not start
  (exit status 3: a bad bundle), it stops the others and exits with that status, as one
  process would (and as it does itself when the port is taken). A later worker that cannot
  start (memory short after an OOM kill) is started again after a pause while the others
  serve.
The workers leave with it: each asks the kernel for a SIGTERM when its parent dies.

Metrics: the workers write them to files in one directory (prometheus_client's multiprocess
mode, PROMETHEUS_MULTIPROC_DIR, a fresh temporary directory), and whichever worker a scrape
reaches adds up all of them (service/metrics.py): counters and histograms over every worker
that ever ran, gauges over the live ones.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

import uvicorn
from prometheus_client import multiprocess

from service.settings import Settings

log = logging.getLogger(__name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: where each worker writes
CANNOT_START = 3  # a worker's exit status when its app could not start (server.py)
_RESTART_DELAY_S = 1.0  # after a worker died soon after its start: no tight restart loop
_SHUTDOWN_MARGIN_S = 10.0  # past the drain timeout: uvicorn's own shutdown, then a kill
_PR_SET_PDEATHSIG = 1


def serve_workers(settings: Settings) -> int:
    """Run `settings.workers` server processes on one socket until a signal stops them; the
    exit status (0, or a worker's that could not start)."""
    # uvicorn's own binding (it exits with status 3 when the port is taken); its app is never
    # loaded here (each worker makes its own).
    config = uvicorn.Config(
        "service.http.app:create_app",
        host=settings.host,
        port=settings.port,
        backlog=settings.backlog,
        log_level=settings.log_level,
    )
    listener = config.bind_socket()
    directory = tempfile.mkdtemp(prefix="mt-metrics-")
    os.environ[MULTIPROC_DIR] = directory  # the workers inherit it: read at their import
    context = multiprocessing.get_context("spawn")
    stopping: list[int] = []  # the signal that stops the service, once one came

    workers: dict[int, tuple[BaseProcess, float]] = {}  # by sentinel: the running ones, started
    first: set[int] = set()  # the pids of the first workers (a bad bundle stops the service)

    def start() -> None:
        process = context.Process(target=_work, args=(settings, listener, os.getpid()))
        process.start()
        workers[process.sentinel] = process, time.monotonic()
        if stopping:  # the signal came while it started: it has not had it
            _signal(process, stopping[0])

    def stop(sig: int, frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(sig)
            log.info("%s: stopping %d workers", signal.Signals(sig).name, len(workers))
        for process, _ in list(workers.values()):
            _signal(process, sig)  # a second signal is a worker's forced stop

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for _ in range(settings.workers):
            if not stopping:
                start()
        first.update(process.pid for process, _ in workers.values() if process.pid is not None)
        log.info("%d workers", settings.workers)
        while not stopping:
            for ready in wait(list(workers), timeout=1.0):
                sentinel = int(ready)  # type: ignore[arg-type]  # the sentinels given: ints
                process, since = workers.pop(sentinel)
                process.join()
                multiprocess.mark_process_dead(process.pid)  # type: ignore[no-untyped-call]
                if stopping:
                    continue
                if process.exitcode == CANNOT_START and process.pid in first:
                    log.error("worker %d could not start: stopping the service", process.pid)
                    status = CANNOT_START
                    stop(signal.SIGTERM, None)
                    break
                log.error("worker %d died (exit %s): starting another", process.pid,
                          process.exitcode)  # fmt: skip
                if (
                    process.exitcode == CANNOT_START
                    or time.monotonic() - since < 10 * _RESTART_DELAY_S
                ):
                    time.sleep(_RESTART_DELAY_S)
                if not stopping:
                    start()
        end = time.monotonic() + settings.drain_timeout_s + _SHUTDOWN_MARGIN_S
        while workers:
            process, _ = workers.pop(next(iter(workers)))
            process.join(max(0.0, end - time.monotonic()))
            if process.exitcode is None:
                log.error("worker %d still running after the drain: killed", process.pid)
                process.kill()
                process.join()
                status = status or 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
    return status


def _signal(process: BaseProcess, sig: int) -> None:
    """Send a running worker a signal (one that has just ended is let be)."""
    if process.pid is not None and process.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)


def _work(settings: Settings, listener: socket.socket, supervisor: int) -> None:
    """One worker: the service on the shared socket (a spawned process's target)."""
    os.setpgrp()  # signals reach it from the supervisor only
    _die_with_parent(supervisor)
    from service.http.app import create_app
    from service.http.server import DrainingServer, uvicorn_config

    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s [worker {os.getpid()}]: %(message)s",
    )
    app = create_app(settings)
    server = DrainingServer(uvicorn_config(app, settings), app, settings.drain_timeout_s)
    # uvicorn raises a SIGINT again once it has shut down; here it is the supervisor's stop.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[listener])  # exits with status 3 itself when the app cannot start
    sys.exit(0)


def _die_with_parent(supervisor: int) -> None:
    """A SIGTERM (a drain) when the supervisor dies, however it dies (Linux's prctl); none
    comes for a death before the request, so a worker whose supervisor is already gone stops."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # another system: the worker outlives a killed parent
        log.warning("cannot ask for a signal when the supervisor dies")
    if os.getppid() != supervisor:
        sys.exit(0)
