"""Rolling restart under load: replicas of `python -m service` behind nginx (the committed
deploy/nginx/transformer-mt.conf, one server line per replica), async clients sending
translations without pause, and each replica restarted in turn (SIGTERM: it drains and exits;
then started again on its port and waited for until ready) while they do.

    python -m benchmarks.rolling_restart --bundle bundles/multi30k-en-de \\
        [--replicas 3] [--clients 8] [--rounds 1] [--pause 2] [--beam-size 1] [--json OUT]
    python -m benchmarks.rolling_restart --compose PROJECT [--engine docker|podman] \\
        [--url http://127.0.0.1:8000] [--clients 8] ...

With --compose, the replicas are the `mt` containers of a running docker-compose.yml stack
(project PROJECT), loaded through its nginx at --url: each is stopped (SIGTERM, the drain),
started again, waited for until ready, and nginx is reloaded so that it resolves `mt` anew (a
restarted container may get another address), as docs/operations.md says to do by hand.

Reports the requests sent, answered (200), retried by nginx (answered after a first try on a
replica that was draining or gone: its access log's upstream list), and lost (anything but a
200 reaching a client), each replica's exit status after its drain, and the time the restarts
took. The goal: nothing lost. Needs nginx (Debian: apt-get install nginx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import (
    DEFAULT_TEXTS,
    HOST,
    free_port,
    nginx,
    nginx_binary,
    start_service,
    wait_until_ready,
)

# Each replica: one ONNX Runtime thread (they share the machine), a drain bounded at 20 s.
_FLAGS = ["--intra-op-threads", "1", "--drain-timeout-s", "20"]


@dataclass
class Result:
    replicas: int
    clients: int
    restarts: int
    seconds: float  # the restarts, first SIGTERM to last replica ready
    sent: int
    answered: int
    retried: int | None  # answered after nginx tried another replica first (None: not known)
    lost: int  # not answered with 200
    failures: dict[str, int]  # what the lost ones got
    exit_codes: list[int]  # of each drained replica


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.compose is not None:
        result = run_compose(args)
    elif args.bundle is None:
        raise SystemExit("--bundle or --compose is needed")
    elif nginx_binary() is None:
        raise SystemExit("nginx not found (Debian: apt-get install nginx)")
    else:
        result = run(args)
    retried = "" if result.retried is None else f"retried {result.retried}, "
    print(
        f"{result.replicas} replicas, {result.clients} clients, {result.restarts} restarts in "
        f"{result.seconds:.1f} s: sent {result.sent}, answered {result.answered}, {retried}"
        f"lost {result.lost} {result.failures or ''} (goal: 0 lost); "
        f"drained replicas exited with {sorted(set(result.exit_codes))}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.rolling_restart",
        description="Restart replicas behind nginx one by one under load; count what is lost.",
    )
    p.add_argument("--bundle", type=Path, help="the model the replicas (processes) serve")
    p.add_argument("--compose", metavar="PROJECT", help="restart this compose stack's replicas")
    p.add_argument("--engine", default="docker", help="with --compose: docker or podman")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="with --compose: its nginx")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=8, help="concurrent clients, one connection each")
    p.add_argument("--rounds", type=int, default=1, help="times every replica is restarted")
    p.add_argument("--pause", type=float, default=2.0, help="seconds between two restarts")
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> Result:
    ports = [free_port() for _ in range(args.replicas)]
    processes = [start_service(args.bundle, _FLAGS, port) for port in ports]
    exit_codes: list[int] = []
    try:
        for port, process in zip(ports, processes, strict=True):
            wait_until_ready(f"http://{HOST}:{port}", process)
        with tempfile.TemporaryDirectory(prefix="mt-rolling-") as tmp:
            log = Path(tmp) / "access.log"
            with nginx(ports, access_log=log) as proxy:
                statuses, seconds = asyncio.run(
                    _under_load(
                        proxy.url, args, lambda: _restart_all(args, ports, processes, exit_codes)
                    )
                )
            tries = log.read_text().splitlines()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
    answered = statuses.pop("200", 0)
    # "$status $upstream_addr $upstream_status": a comma in the list when nginx tried again.
    retried = sum(1 for line in tries if line.startswith("200 ") and "," in line)
    return Result(
        replicas=args.replicas,
        clients=args.clients,
        restarts=args.rounds * args.replicas,
        seconds=round(seconds, 2),
        sent=answered + sum(statuses.values()),
        answered=answered,
        retried=retried,
        lost=sum(statuses.values()),
        failures=dict(statuses),
        exit_codes=exit_codes,
    )


def run_compose(args: argparse.Namespace) -> Result:
    replicas = _containers(args, "mt")
    (proxy,) = _containers(args, "nginx")
    exit_codes: list[int] = []
    statuses, seconds = asyncio.run(
        _under_load(args.url, args, lambda: _restart_containers(args, replicas, proxy, exit_codes))
    )
    answered = statuses.pop("200", 0)
    return Result(
        replicas=len(replicas),
        clients=args.clients,
        restarts=args.rounds * len(replicas),
        seconds=round(seconds, 2),
        sent=answered + sum(statuses.values()),
        answered=answered,
        retried=None,  # nginx's access log is the container's output
        lost=sum(statuses.values()),
        failures=dict(statuses),
        exit_codes=exit_codes,
    )


def _engine(args: argparse.Namespace, *command: str) -> str:
    done = subprocess.run(
        [args.engine, *command], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args.engine} {' '.join(command)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _containers(args: argparse.Namespace, service: str) -> list[str]:
    """The running containers of a compose service (both compose tools label them so)."""
    labels = [f"com.docker.compose.project={args.compose}", f"com.docker.compose.service={service}"]
    found = _engine(args, "ps", "--quiet", *(f"--filter=label={label}" for label in labels))
    if not found:
        raise SystemExit(f"no running {service} container in compose project {args.compose}")
    return sorted(found.split())


def _restart_containers(
    args: argparse.Namespace, replicas: list[str], proxy: str, exit_codes: list[int]
) -> None:
    """Each replica in turn, `rounds` times: stop (SIGTERM; the drain), start, wait until its
    /ready answers inside the container, reload nginx (it resolves `mt` at load) and wait for
    its old workers to finish, pause."""
    ready = ["-e", "MT_HEALTH_URL=http://127.0.0.1:8000/ready"]
    for _ in range(args.rounds):
        for replica in replicas:
            _engine(args, "stop", "--time", "60", replica)
            exit_codes.append(
                int(_engine(args, "inspect", "--format", "{{.State.ExitCode}}", replica))
            )
            _engine(args, "start", replica)
            end = time.monotonic() + 300
            while True:
                try:
                    _engine(
                        args, "exec", *ready, replica, "python", "/app/deploy/docker/healthcheck.py"
                    )
                    break
                except RuntimeError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.5)
            _engine(args, "exec", proxy, "nginx", "-s", "reload")
            _wait_for_old_workers(args, proxy)
            time.sleep(args.pause)


def _wait_for_old_workers(args: argparse.Namespace, proxy: str) -> None:
    """Until nginx's workers from before the reload are gone: each keeps the addresses `mt`
    had when it started, and one still serving a client's kept-alive connection would send its
    requests to replicas restarted since (their old addresses: nobody there)."""
    old = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[s]hutting down' || true"
    end = time.monotonic() + 120
    while int(_engine(args, "exec", proxy, "sh", "-c", old) or 0) > 0:
        if time.monotonic() > end:
            raise RuntimeError("nginx's old workers did not finish within 120 s")
        time.sleep(0.2)


def _restart_all(
    args: argparse.Namespace,
    ports: list[int],
    processes: list[subprocess.Popen[Any]],
    exit_codes: list[int],
) -> None:
    """Each replica in turn, `rounds` times: SIGTERM, wait for its drain to end, start it
    again on its port, wait until it is ready, pause."""
    for _ in range(args.rounds):
        for i, port in enumerate(ports):
            processes[i].terminate()
            exit_codes.append(processes[i].wait(60))
            processes[i] = start_service(args.bundle, _FLAGS, port)
            wait_until_ready(f"http://{HOST}:{port}", processes[i])
            time.sleep(args.pause)


async def _under_load(
    url: str, args: argparse.Namespace, restart: Callable[[], None]
) -> tuple[Counter[str], float]:
    """Clients send translations without pause from before the first restart until after the
    last; -> what they got (status or exception name) and how long the restarts took."""
    statuses: Counter[str] = Counter()
    done = asyncio.Event()
    body = {"source": "en", "target": "de", "beam_size": args.beam_size}

    async def client(n: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
            i = n
            while not done.is_set():
                text = DEFAULT_TEXTS[i % len(DEFAULT_TEXTS)]
                i += 1
                try:
                    response = await http.post("/translate", json={**body, "text": text})
                    statuses[str(response.status_code)] += 1
                except httpx.HTTPError as e:
                    statuses[type(e).__name__] += 1

    clients = [asyncio.create_task(client(n)) for n in range(args.clients)]
    await asyncio.sleep(args.pause)  # load first
    start = time.perf_counter()
    await asyncio.to_thread(restart)
    seconds = time.perf_counter() - start
    await asyncio.sleep(args.pause)
    done.set()
    await asyncio.gather(*clients)
    return statuses, seconds


if __name__ == "__main__":
    sys.exit(main())
