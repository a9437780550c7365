"""`python -m service --workers 2` on the tiny eos bundle: two server processes on one port under
a supervisor (service/http/workers.py). Both serve, a scrape of either adds up both, a killed
worker is replaced without losing what it counted, SIGTERM drains both, and a worker that cannot
start stops the service with its status."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.service.helpers import ServerProcess, async_wait_for, server_process, wait_for
from tests.service.test_server import EN_DE, metric, post_all, server_args


def workers_of(server: ServerProcess) -> list[int]:
    """The supervisor's worker processes: its children that run the service (not
    multiprocessing's resource tracker)."""
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie has ended: its state is Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process frozen (SIGSTOP): it accepts no connection until it goes on."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def translate(url: str, n: int) -> list[int]:
    """n requests, each on a connection of its own; their statuses."""
    statuses = []
    for i in range(n):
        with httpx.Client(base_url=url, timeout=30) as client:
            body = {"text": f"A dog number {i} runs.", **EN_DE}
            statuses.append(client.post("/translate", json=body).status_code)
    return statuses


def answered(url: str) -> float:
    return metric(url, "mt_http_requests_total", route="/translate", status="200")


def started(server: ServerProcess) -> list[int]:
    """Its two workers, once both have loaded their model and serve."""
    wait_for(lambda: server.written().count(": ready: ") == 2, timeout=60)
    workers = workers_of(server)
    assert len(workers) == 2
    return workers


def metrics_dir(worker: int) -> Path:
    """Where the workers write their metrics (the supervisor removes it, unless killed)."""
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    [entry] = [e for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(entry.split(b"=", 1)[1].decode())


def test_each_worker_serves_and_a_scrape_of_one_counts_both(eos_bundle: Path) -> None:
    with server_process(server_args(eos_bundle, "--workers", "2")) as server:
        first, second = started(server)
        directory = metrics_dir(first)
        before = answered(server.url)
        with stopped(first):  # every connection goes to the second worker
            assert translate(server.url, 3) == [200] * 3
        # Counted once the answer is written: wait for the last count before freezing it.
        wait_for(lambda: answered(server.url) - before == 3)
        with stopped(second):  # and now to the first, which also answers the scrape
            assert translate(server.url, 2) == [200] * 2
            assert answered(server.url) - before == 5
        # A killed worker is replaced; what it counted stays counted.
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: len(set(workers_of(server)) - {first, second}) == 1, timeout=30)
        [replacement] = set(workers_of(server)) - {first, second}
        assert translate(server.url, 4) == [200] * 4
        wait_for(lambda: answered(server.url) - before == 9, timeout=60)
    assert "died (exit -9): starting another" in server.output()
    # The supervisor was killed (the context's stop): its workers leave with it.
    wait_for(lambda: not alive(second) and not alive(replacement), timeout=30)
    shutil.rmtree(directory)  # a killed supervisor could not


def test_sigterm_drains_every_worker_then_exits(eos_bundle: Path) -> None:
    flags = ("--workers", "2", "--scheduler", "batch", "--max-wait-ms", "1500")
    with server_process(server_args(eos_bundle, *flags, "--drain-timeout-s", "20")) as server:
        workers = started(server)
        directory = metrics_dir(workers[0])
        bodies: list[dict[str, object]] = [
            {"text": f"A man number {i} sings.", **EN_DE} for i in range(8)
        ]

        async def scenario() -> list[httpx.Response]:
            accepted = asyncio.ensure_future(post_all(server.url, bodies))

            def all_in_flight() -> bool:  # in either worker's batching window
                return metric(server.url, "mt_in_flight_requests") == len(bodies)

            await async_wait_for(all_in_flight, timeout=30)
            server.terminate()
            return await accepted

        responses = asyncio.run(scenario())
        assert [r.status_code for r in responses] == [200] * len(bodies)  # none lost
        assert server.process.wait(30) == 0
        assert not [pid for pid in workers if alive(pid)]
    assert server.output().count("finishing accepted requests") == 2
    assert not directory.exists()


def test_a_worker_that_cannot_start_stops_the_service(tmp_path: Path) -> None:
    server = ServerProcess(["--bundle", str(tmp_path), "--workers", "2"])
    try:
        assert server.process.wait(90) == 3
    finally:
        server.stop()
    assert "could not start: stopping the service" in server.output()


def test_a_replacement_that_cannot_start_is_tried_again_while_the_other_serves(
    eos_bundle: Path, tmp_path: Path
) -> None:
    """Only the first workers' failure to start stops the service: a replacement that cannot
    load its bundle (gone after the start, here) is started again after a pause, and the other
    worker serves meanwhile."""
    bundle = shutil.copytree(eos_bundle, tmp_path / "bundle")
    with server_process(server_args(bundle, "--workers", "2")) as server:
        first, second = started(server)
        directory = metrics_dir(first)
        away = bundle.rename(tmp_path / "away")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "died (exit 3): starting another" in server.written(), timeout=60)
        assert server.process.poll() is None
        assert translate(server.url, 3) == [200] * 3
        away.rename(bundle)
        wait_for(lambda: server.written().count(": ready: ") == 3, timeout=60)
        assert len(workers_of(server)) == 2 and second in workers_of(server)
    wait_for(lambda: not alive(second), timeout=30)
    shutil.rmtree(directory, ignore_errors=True)  # a killed supervisor could not
