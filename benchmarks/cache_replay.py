"""Replay benchmark of the sentence cache: statuses drawn with a Zipf law from a pool of
paragraphs, as when a popular post is translated by each of its readers, sent by many clients
to `python -m service` with the cache off, in process, and in Redis; with `--replicas N`, to N
of them behind nginx (deploy/nginx/transformer-mt.conf, benchmarks/servers.py), sharing one
Redis in the redis modes.

    python -m benchmarks.cache_replay --bundle /work/bundles/multi30k-en-de \\
        [--requests 250] [--clients 32] [--zipf 1.1] [--modes off,memory,redis,redis-remote] \\
        [--replicas 1] [--cached-probes 300] [--repeat 1] [--json OUT]

The pool: Multi30k's test2016 English side in paragraphs of one to three consecutive sentences
(486); the load: a sequence of `--requests` of them drawn with P(rank k) proportional to
k ** -zipf, the same sequence (seeded) for every mode (250 requests: a best hit rate near
60 %). `redis` starts Debian's redis-server on a free loopback port (benchmarks/servers.py);
`redis-remote` too, with no in-process store in front of it (every hit read from Redis).

For each mode: requests/s, p50/p99, the service's own counts of sentence-cache hits, misses
(sentences decoded) and single-flight joins, and, once the load is over, the p50 of a cached
request through HTTP (`--cached-probes` requests of paragraphs the load sent, one at a time on
one kept-alive connection); with replicas, the counts are summed over their /metrics and the
load and the probes go through nginx. The load's own figures: its sentences, distinct sentences (the
fewest a cache can decode) and so the best hit rate a cache can reach. `--repeat R` runs every
mode R times, each run on fresh servers (the runs of a mode vary by a tenth on a shared
machine), and ends with each mode's medians. The clients are aiohttp's: the load runs on the
service's cores. The last line is the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np

from benchmarks.servers import (
    RedisServer,
    metric,
    nginx,
    percentile_ms,
    read_texts,
    services,
)
from service.text.segment import split

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
# redis-remote: Redis with no in-process store in front (--cache-bytes 0): every hit is read from
# Redis, as a replica reads what another decoded.
MODES = ("off", "memory", "redis", "redis-remote")


@dataclass
class Run:
    mode: str
    replicas: int = 1
    seconds: float = 0.0
    answered: int = 0
    failed: int = 0
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    joined: float = 0.0
    hit_rate: float = 0.0  # hits and joins over every sentence looked up
    cached_p50_ms: float = 0.0
    round: int = 0  # of --repeat: "vs off" compares runs of one round


def paragraphs(sentences: Sequence[str], rng: np.random.Generator) -> list[str]:
    """`sentences` in order, grouped into paragraphs of one to three."""
    grouped = []
    start = 0
    while start < len(sentences):
        size = int(rng.integers(1, 4))
        grouped.append(" ".join(sentences[start : start + size]))
        start += size
    return grouped


def zipf_sequence(pool: int, requests: int, s: float, rng: np.random.Generator) -> list[int]:
    """Indices into the pool, rank k drawn with probability proportional to k ** -s."""
    weights = np.arange(1, pool + 1, dtype=np.float64) ** -s
    return [int(i) for i in rng.choice(pool, size=requests, p=weights / weights.sum())]


@contextlib.contextmanager
def serving(bundle: Path, flags: list[str], replicas: int) -> Iterator[tuple[str, list[str]]]:
    """The URL to send the load to, and each process's own (for its /metrics): one `python -m
    service`, or `replicas` of them behind nginx."""
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(services(bundle, flags, replicas))
        url = servers[0].url
        if replicas > 1:
            url = stack.enter_context(nginx([server.port for server in servers])).url
        yield url, [server.url for server in servers]


async def _metrics(http: aiohttp.ClientSession, urls: Sequence[str]) -> list[str]:
    texts = []
    for url in urls:
        async with http.get(f"{url}/metrics") as response:
            texts.append(await response.text())
    return texts


async def _translate(http: aiohttp.ClientSession, url: str, text: str) -> int:
    """POST /translate of `text` (en -> de), its answer read whole -> its status."""
    body = {"text": text, "source": "en", "target": "de"}
    async with http.post(f"{url}/translate", json=body) as response:
        await response.read()
        return response.status


async def replay(
    url: str,
    bodies: Sequence[str],
    clients: int,
    probes: Sequence[str],
    replica_urls: Sequence[str] = (),
) -> Run:
    """The load sent to `url`; the cache's counts summed over `replica_urls`' /metrics
    (default: `url`'s)."""
    run = Run(mode="")
    latencies: list[float] = []
    replica_urls = replica_urls or [url]
    # aiohttp: the load shares the service's cores, and its client takes a quarter of httpx2's
    # CPU time a request (0.10-0.11 against 0.44 ms, 2,000 cached requests from 32 clients).
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        before = await _metrics(http, replica_urls)
        queue = iter(bodies)

        async def client() -> None:
            for text in queue:
                sent = time.perf_counter()
                if await _translate(http, url, text) == 200:
                    latencies.append(time.perf_counter() - sent)
                else:
                    run.failed += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        run.seconds = round(elapsed, 2)
        after = await _metrics(http, replica_urls)
        cached: list[float] = []
        for text in probes:
            sent = time.perf_counter()
            if (status := await _translate(http, url, text)) != 200:
                raise RuntimeError(f"a cached request answered {status}")
            cached.append(time.perf_counter() - sent)
    run.answered = len(latencies)
    run.requests_per_s = round(run.answered / elapsed, 1)  # not the rounded seconds
    run.p50_ms, run.p99_ms = percentile_ms(latencies, 50), percentile_ms(latencies, 99)
    run.cached_p50_ms = percentile_ms(cached, 50)
    for result in ("hit", "miss", "joined"):
        count = sum(metric(text, "mt_sentence_cache_total", result=result) for text in after) - sum(
            metric(text, "mt_sentence_cache_total", result=result) for text in before
        )
        setattr(run, {"hit": "hits", "miss": "misses", "joined": "joined"}[result], count)
    looked_up = run.hits + run.misses + run.joined
    run.hit_rate = round((run.hits + run.joined) / looked_up, 3) if looked_up else 0.0
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--texts", type=Path, default=MULTI30K / "test_2016_flickr.en.gz")
    parser.add_argument("--requests", type=int, default=250)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cached-probes", type=int, default=300)
    parser.add_argument(
        "--replicas", type=int, default=1, help="services behind nginx (1: one, no nginx)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of every mode, each on fresh servers"
    )
    parser.add_argument("--server-args", default="", help="more flags for python -m service")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: of {', '.join(MODES)}")
    rng = np.random.default_rng(args.seed)
    pool = paragraphs(read_texts(args.texts), rng)
    bodies = [pool[i] for i in zipf_sequence(len(pool), args.requests, args.zipf, rng)]
    sentences = [s for body in bodies for s in split(body, "en").inputs]
    load = {
        "pool": len(pool),
        "requests": len(bodies),
        "distinct_paragraphs": len(set(bodies)),
        "sentences": len(sentences),
        "distinct_sentences": len(set(sentences)),
        "best_hit_rate": round(1 - len(set(sentences)) / len(sentences), 3),
    }
    print(json.dumps(load), file=sys.stderr)
    seen = list(dict.fromkeys(bodies))
    probes = [seen[i % len(seen)] for i in range(args.cached_probes)]
    runs: list[Run] = []
    for number in range(args.repeat):
        for mode in modes:
            run = _run(mode, args, bodies, probes)
            run.round = number
            runs.append(run)
            print(json.dumps(asdict(run)), file=sys.stderr, flush=True)
    _table(runs)
    report = {"load": load, "args": {k: str(v) for k, v in vars(args).items()}}
    report["runs"] = [asdict(r) for r in runs]
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 1 if any(r.failed for r in runs) else 0


def _run(mode: str, args: argparse.Namespace, bodies: list[str], probes: list[str]) -> Run:
    """One run of the load in `mode`, on servers (and a Redis) of its own."""
    flags = args.server_args.split() + (["--no-cache"] if mode == "off" else ["--cache"])
    with tempfile.TemporaryDirectory(prefix="mt-redis-") as tmp:
        redis = None
        if mode.startswith("redis"):
            redis = RedisServer(Path(tmp))
            redis.start()
            flags += ["--redis-url", redis.url]
        if mode == "redis-remote":
            flags += ["--cache-bytes", "0"]
        try:
            with serving(args.bundle, flags, args.replicas) as (url, replicas):
                run = asyncio.run(replay(url, bodies, args.clients, probes, replicas))
        finally:
            if redis is not None:
                redis.stop()
    run.mode, run.replicas = mode, args.replicas
    return run


def _table(runs: Sequence[Run]) -> None:
    """Each run, "vs off" against the off run of its round; with several rounds, each mode's
    medians."""
    off = {r.round: r.requests_per_s for r in runs if r.mode == "off"}
    print("| cache | round | replicas | requests/s | vs off | p50 ms | p99 ms | hit rate "
          "| sentences decoded | joined | cached request p50 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        decoded = "all" if r.mode == "off" else f"{r.misses:.0f}"
        ratio = f"{r.requests_per_s / off[r.round]:.2f}x" if off.get(r.round) else "-"
        print(f"| {r.mode} | {r.round + 1} | {r.replicas} | {r.requests_per_s} | {ratio} | "
              f"{r.p50_ms} | {r.p99_ms} | {r.hit_rate} | {decoded} | {r.joined:.0f} | "
              f"{r.cached_p50_ms} |")  # fmt: skip
    if len(off) > 1:
        for mode in dict.fromkeys(r.mode for r in runs):
            own = [r for r in runs if r.mode == mode]
            ratios = [r.requests_per_s / off[r.round] for r in own if off.get(r.round)]
            print(f"{mode}: median of {len(own)} rounds: "
                  f"{statistics.median(r.requests_per_s for r in own):.1f} requests/s, "
                  f"{statistics.median(ratios):.2f}x off, cached request p50 "
                  f"{statistics.median(r.cached_p50_ms for r in own)} ms")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
