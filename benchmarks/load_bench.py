"""Load benchmark: start `python -m service` on 127.0.0.1, drive it with concurrent async
clients, and compare dynamic batching with batching off (max batch size 1).

    python -m benchmarks.load_bench --bundle bundles/multi30k-en-de \\
        [--concurrency 1,8,32,64] [--duration 10] [--max-requests 2000] [--beam-size 1] \\
        [--max-batch-size 32] [--max-wait-ms 0] [--intra-op-threads N] [--texts FILE] \\
        [--client-processes P] [--batching-only] [--json OUT]

For each server configuration and each concurrency level: requests/s, p50/p95/p99 latency of
the answered (200) requests, errors by status, and the mean batch size the server formed (from
its /metrics: segments per engine call; with MT_SCHEDULER=step in the environment, which the
server inherits, rows per decoder step). Each level runs until `--duration` seconds or
`--max-requests` requests, whichever comes first, after a short warm-up. The last table gives
throughput with batching divided by throughput without. `--client-processes P` spreads a
level's clients over P processes (one Python process sends a few thousand requests/s at most),
whose timed phases start together once all have warmed up. `--batching-only` leaves the
configuration without batching (and the ratio table) out, for sweeps of the batching one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.servers import percentile_ms, read_texts, service


@dataclass(frozen=True)
class LevelResult:
    config: str
    concurrency: int
    requests: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int]
    mean_batch_size: float


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    texts = read_texts(args.texts)
    levels = [int(c) for c in args.concurrency.split(",")]
    configs = {
        f"batching (max {args.max_batch_size})": ["--max-batch-size", str(args.max_batch_size)]
    }
    if not args.batching_only:
        configs["no batching (max 1)"] = ["--max-batch-size", "1"]
    results: list[LevelResult] = []
    for name, flags in configs.items():
        server_flags = [*flags, "--max-wait-ms", str(args.max_wait_ms)]
        if args.intra_op_threads is not None:
            server_flags += ["--intra-op-threads", str(args.intra_op_threads)]
        with service(args.bundle, server_flags) as server:
            pair = httpx.get(f"{server.url}/languages", timeout=10).json()[0]
            for concurrency in levels:
                result = asyncio.run(_run_level(server.url, name, concurrency, texts, pair, args))
                results.append(result)
                _print_row(result)
    if not args.batching_only:
        _print_ratios(results, levels, list(configs))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level (at most)")
    p.add_argument("--max-requests", type=int, default=2000, help="requests per level (at most)")
    p.add_argument("--warmup-requests", type=int, default=2, help="per client, not measured")
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=32, help="the batching configuration")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="the batching configuration")
    p.add_argument("--intra-op-threads", type=int, default=None)
    p.add_argument("--texts", type=Path, default=None, help="one sentence per line")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the clients are spread over (a level's requests/s then adds up theirs, "
        "over the longest one's time)",
    )
    p.add_argument(
        "--batching-only", action="store_true", help="no run without batching (max batch 1)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


# How long a client process waits for the others' warm-up (a failed one never comes).
BARRIER_TIMEOUT_S = 300.0


@dataclass
class _Driven:
    """What one process's clients measured at a level."""

    latencies: list[float]
    statuses: Counter[str]  # of the measured requests
    refused: Counter[str]  # of the warm-up's, reported with them
    seconds: float
    before: tuple[float, float]  # the server's batch totals once the warm-up was done


async def _run_level(
    url: str,
    config: str,
    concurrency: int,
    texts: list[str],
    pair: dict[str, str],
    args: argparse.Namespace,
) -> LevelResult:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        processes = min(args.client_processes, concurrency)
        if processes <= 1:
            driven = [await _drive(url, concurrency, args.max_requests, texts, pair, args)]
        else:
            # The clients in several processes: one process's Python tops out at a few
            # thousand requests/s, short of what several workers on a GPU may answer.
            loop = asyncio.get_running_loop()
            shares = zip(
                _shares(concurrency, processes), _shares(args.max_requests, processes), strict=True
            )
            spawn = multiprocessing.get_context("spawn")  # not a fork of this one's threads
            with spawn.Manager() as manager, ProcessPoolExecutor(processes, spawn) as pool:
                # Every process's timed phase starts at once; one that failed breaks it.
                warm = manager.Barrier(processes, timeout=BARRIER_TIMEOUT_S)
                driven = await asyncio.gather(
                    *(
                        loop.run_in_executor(
                            pool, _drive_in_process, url, users, budget, texts, pair, args, warm
                        )
                        for users, budget in shares
                    )
                )
        after = _batch_totals((await http.get("/metrics")).text)
    before = min(d.before for d in driven)  # the earliest: every warm-up done, none measured
    batches, segments = after[0] - before[0], after[1] - before[1]
    latencies = [latency for d in driven for latency in d.latencies]
    statuses: Counter[str] = sum((d.statuses for d in driven), Counter())
    refused: Counter[str] = sum((d.refused for d in driven), Counter())
    seconds = max(d.seconds for d in driven)
    ok = statuses.pop("200", 0)
    return LevelResult(
        config=config,
        concurrency=concurrency,
        requests=ok + sum(statuses.values()),
        seconds=round(seconds, 3),
        requests_per_s=round(ok / seconds, 2),
        p50_ms=percentile_ms(latencies, 50),
        p95_ms=percentile_ms(latencies, 95),
        p99_ms=percentile_ms(latencies, 99),
        errors=dict(statuses + refused),
        mean_batch_size=round(segments / batches, 2) if batches else 0.0,
    )


def _shares(total: int, parts: int) -> list[int]:
    """`total` split into `parts` as evenly as whole numbers go, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def _drive_in_process(*arguments: Any) -> _Driven:
    """`_drive`, in a process of the pool."""
    return asyncio.run(_drive(*arguments))


async def _drive(
    url: str,
    concurrency: int,
    max_requests: int,
    texts: list[str],
    pair: dict[str, str],
    args: argparse.Namespace,
    warm: threading.Barrier | None = None,
) -> _Driven:
    """`concurrency` clients, each warmed up, then (past `warm`, the other processes' clients
    warmed up too) sending one request after another until `args.duration` seconds or
    `max_requests` requests in all."""

    def body(i: int) -> dict[str, object]:
        text = texts[i % len(texts)]
        return {"text": text, "source": pair["source"], "target": pair["target"],
                "beam_size": args.beam_size}  # fmt: skip

    # One client with one connection per simulated user. A single AsyncClient pooling N
    # connections spends CPU on its pool per request that grows with N: at 64 it took a whole
    # core and capped the measured rate at a quarter of what the server sustains.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=120, limits=one)
            )
            for _ in range(concurrency)
        ]
        driven = _Driven(latencies=[], statuses=Counter(), refused=Counter(), seconds=0.0,
                         before=(0.0, 0.0))  # fmt: skip

        async def warm_up(client: httpx.AsyncClient) -> None:
            # Connects, so no measured request pays for a TCP handshake. An overloaded server
            # may refuse it (429, 503): counted with the errors, and the level goes on.
            for i in range(args.warmup_requests):
                try:
                    response = await client.post("/translate", json=body(i))
                except httpx.HTTPError as e:
                    driven.refused[f"warm-up {type(e).__name__}"] += 1
                    continue
                if response.status_code != 200:
                    driven.refused[f"warm-up {response.status_code}"] += 1

        await asyncio.gather(*(warm_up(client) for client in clients))
        if warm is not None:
            await asyncio.to_thread(warm.wait)
        driven.before = _batch_totals((await clients[0].get("/metrics")).text)
        issued = 0
        start = time.perf_counter()
        end = start + args.duration

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal issued
            while issued < max_requests and time.perf_counter() < end:
                i = issued
                issued += 1
                sent = time.perf_counter()
                try:
                    response = await client.post("/translate", json=body(i))
                except httpx.HTTPError as e:
                    driven.statuses[type(e).__name__] += 1
                    continue
                driven.statuses[str(response.status_code)] += 1
                if response.status_code == 200:  # a fast 429 or 503 must not flatter p99
                    driven.latencies.append(time.perf_counter() - sent)

        await asyncio.gather(*(worker(client) for client in clients))
        driven.seconds = time.perf_counter() - start
    return driven


def _batch_totals(metrics_text: str) -> tuple[float, float]:
    """(batches, segments) the server decoded so far, over all models: engine calls and their
    segments (whole batches), or decoder steps and their rows (step-level batching)."""
    batches = segments = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in ("mt_batch_size_segments_count", "mt_step_rows_count"):
                batches += sample.value
            elif sample.name in ("mt_batch_size_segments_sum", "mt_step_rows_sum"):
                segments += sample.value
    return batches, segments


def _print_row(r: LevelResult) -> None:
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "none"
    print(
        f"{r.config:<22} c={r.concurrency:<3} {r.requests:>6} req {r.requests_per_s:>8.1f} req/s  "
        f"p50 {r.p50_ms:>7.1f} ms  p95 {r.p95_ms:>7.1f} ms  p99 {r.p99_ms:>7.1f} ms  "
        f"batch {r.mean_batch_size:>5.1f}  errors: {errors}",
        flush=True,
    )


def _print_ratios(results: list[LevelResult], levels: list[int], configs: list[str]) -> None:
    batched, single = configs
    by_key = {(r.config, r.concurrency): r for r in results}
    # Unloaded latency: one client, no batching, the p50 of a request alone on the server.
    unloaded = by_key.get((single, 1))
    print("\nthroughput ratio, batching / no batching; batching p99 / unloaded p50:")
    for c in levels:
        base = by_key[single, c].requests_per_s
        ratio = by_key[batched, c].requests_per_s / base if base else float("nan")
        tail = (
            f"{by_key[batched, c].p99_ms / unloaded.p50_ms:6.1f}x"
            if unloaded and unloaded.p50_ms
            else "   n/a (no c=1 level)"
        )
        print(f"  c={c:<3} {ratio:5.2f}x  {tail}")


if __name__ == "__main__":
    sys.exit(main())
