"""Replay benchmark of the sentence cache: statuses drawn with a Zipf law from a pool of
paragraphs, as when a popular post is translated by each of its readers, sent by many clients
to `python -m service` with the cache off, in process, and in Redis; with `--replicas N`, to N
of them behind nginx (deploy/nginx/transformer-mt.conf, benchmarks/servers.py), sharing one
Redis in the redis modes.

    python -m benchmarks.cache_replay --bundle /work/bundles/multi30k-en-de \\
        [--requests 250] [--clients 32] [--zipf 1.1] [--modes off,memory,redis,redis-remote] \\
        [--replicas 1] [--cached-probes 300] [--warm-up 96] [--repeat 1] [--json OUT]

The pool: Multi30k's test2016 English side in paragraphs of one to three consecutive sentences
(486); the load: a sequence of `--requests` of them drawn with P(rank k) proportional to
k ** -zipf, the same sequence (seeded) for every mode (250 requests: a best hit rate near
60 %). `redis` starts Debian's redis-server on a free loopback port (benchmarks/servers.py);
`redis-remote` too, with no in-process store in front of it (every hit read from Redis).

Each mode's fresh servers first get `--warm-up` paragraphs of Multi30k's val (no sentence in
common with the pool) from the same clients, not counted: the connections the load then uses
(client to nginx, nginx to the replicas, the replicas to Redis) are open, the engine has run, and
the load's hit rate is what it would be without them. For each mode: requests/s, p50/p99, the
CPU each process spent a request of the load (the replicas' event loops and their other threads,
nginx, Redis, the load generator; the scheduler's own accounting, /proc/PID/task/TID/schedstat,
and wrk's own clock),
the service's own counts of sentence-cache hits, misses
(sentences decoded) and single-flight joins, and, once the load is over, the p50 of a cached
request through HTTP (`--cached-probes` requests of paragraphs the load sent, one at a time on
one kept-alive connection); with replicas, the counts are summed over their /metrics and the
load and the probes go through nginx. The load's own figures: its sentences, distinct sentences (the
fewest a cache can decode) and so the best hit rate a cache can reach. `--repeat R` runs every
mode R times, each run on fresh servers (the runs of a mode vary by a tenth on a shared
machine), and ends with each mode's medians. The load runs on the service's cores, so it is sent
by wrk (Debian: apt-get install wrk; one thread, a connection per client, the bodies in order,
timed from its first request to its last answer: `REPLAY_LUA`), which spends 0.06 ms of CPU a
request (its start included) where aiohttp spent 0.21-0.25; the warm-up, /metrics and the
probes go through aiohttp. The last line is the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from benchmarks.paths import MULTI30K
from benchmarks.servers import (
    RedisServer,
    cpu_ns,
    metric,
    nginx,
    percentile_ms,
    read_texts,
    services,
    wrk_percentile_ms,
)
from service.text.segment import split

# redis-remote: Redis with no in-process store in front (--cache-bytes 0): every hit is read from
# Redis, as a replica reads what another decoded.
MODES = ("off", "memory", "redis", "redis-remote")
EN_DE = {"source": "en", "target": "de"}


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
    # CPU ms a request of the load, by process (CPU_PARTS)
    cpu_ms: dict[str, float] = field(default_factory=dict)


# Where the CPU of the load goes: the replicas' event loops (their main threads), their other
# threads (the engine's and ONNX Runtime's, tokenization), nginx (its workers), Redis, and the
# load generator itself (wrk, on the same cores).
CPU_PARTS = ("loops", "engines", "nginx", "redis", "load")

# wrk's script for the load, in one thread: the JSON bodies of the file BODIES POSTed to
# /translate in order, each once, by whichever connection is free. A connection with no body
# left sends a request head it never finishes: nginx (or the service) waits for the rest of it,
# does no work and sends no answer, so the connection falls quiet. When the last body is
# answered, the time since the first request (CLOCK_MONOTONIC, through LuaJIT's FFI: wrk's own
# figures cover its whole -d duration), the answers other than 200 and the CPU wrk has used so
# far (CLOCK_PROCESS_CPUTIME_ID: its threads, start included, not what it does once the load is
# over) are written to RESULT and the thread stops, which ends wrk. wrk 4.1 calls `request`
# once before the run to check the script (on the first thread's state): that request is never
# sent.
REPLAY_LUA = """
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } replay_timespec;
int clock_gettime(int clock, replay_timespec *now);
]]
local CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID = 1, 2
local clock = ffi.new("replay_timespec")
local function now(id)
  ffi.C.clock_gettime(id or CLOCK_MONOTONIC, clock)
  return tonumber(clock.tv_sec) + tonumber(clock.tv_nsec) * 1e-9
end
local bodies = {}
for line in io.lines(BODIES) do bodies[#bodies + 1] = line end
local headers = {["Content-Type"] = "application/json"}
local unfinished = "POST /translate HTTP/1.1\\r\\nHost: replay\\r\\n"
local checked, sent, answered, failed, started = false, 0, 0, 0, nil
function request()
  if not checked then
    checked = true
    return wrk.format("POST", "/translate", headers, bodies[1])
  end
  started = started or now()
  sent = sent + 1
  if sent > #bodies then return unfinished end
  return wrk.format("POST", "/translate", headers, bodies[sent])
end
function response(status)
  answered = answered + 1
  if status ~= 200 then failed = failed + 1 end
  if answered == #bodies then
    local out = io.open(RESULT, "w")
    local cpu = now(CLOCK_PROCESS_CPUTIME_ID)
    out:write(string.format("%.6f %d %.6f\\n", now() - started, failed, cpu))
    out:close()
    wrk.thread:stop()
  end
end
"""


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
def serving(
    bundle: Path, flags: list[str], replicas: int
) -> Iterator[tuple[str, list[str], dict[str, list[int]]]]:
    """The URL to send the load to, each process's own (for its /metrics), and the pids of the
    replicas and nginx (for their CPU): one `python -m service`, or `replicas` of them behind
    nginx."""
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(services(bundle, flags, replicas))
        url = servers[0].url
        pids = {"replicas": [server.process.pid for server in servers], "nginx": [], "redis": []}
        if replicas > 1:
            proxy = stack.enter_context(nginx([server.port for server in servers]))
            url, pids["nginx"] = proxy.url, [proxy.process.pid]
        yield url, [server.url for server in servers], pids


def _cpu(pids: dict[str, list[int]]) -> dict[str, int]:
    """CPU ns so far of each of CPU_PARTS but the load."""
    replicas = [cpu_ns(pid) for pid in pids["replicas"]]
    return {
        "loops": sum(main for main, _ in replicas),
        "engines": sum(other for _, other in replicas),
        "nginx": sum(sum(cpu_ns(pid)) for pid in pids["nginx"]),
        "redis": sum(sum(cpu_ns(pid)) for pid in pids["redis"]),
    }


@dataclass
class Load:
    """What wrk measured of the load: seconds from its first request to its last answer,
    answers other than 200, p50 and p99 latency in ms, its own CPU ns until its last answer."""

    seconds: float
    failed: int
    p50_ms: float
    p99_ms: float
    cpu_ns: int


def send_load(url: str, bodies: Sequence[str], clients: int, timeout_s: float = 600) -> Load:
    """`bodies` POSTed to `url`/translate (en -> de) in order, each once, by wrk over `clients`
    connections (REPLAY_LUA)."""
    if shutil.which("wrk") is None:
        raise FileNotFoundError("wrk not found (Debian: apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="mt-replay-") as tmp:
        bodies_file, result = Path(tmp) / "bodies.jsonl", Path(tmp) / "result"
        bodies_file.write_text(
            "".join(json.dumps({"text": b, **EN_DE}) + "\n" for b in bodies), encoding="utf-8"
        )
        script = Path(tmp) / "replay.lua"
        constants = {"BODIES": str(bodies_file), "RESULT": str(result)}
        names = "".join(f"local {k} = {json.dumps(v)}\n" for k, v in constants.items())
        script.write_text(names + REPLAY_LUA, encoding="utf-8")
        command = ["wrk", "-t1", f"-c{clients}", "-d1h", "--latency", "-s", str(script), url]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout_s
        while not (line := _read(result)):
            if process.poll() is not None or time.monotonic() > deadline:
                line = _read(result)  # written just before it ended, or not at all
                break
            time.sleep(0.01)
        if process.poll() is None:  # still running (ending, or past the deadline)
            process.send_signal(signal.SIGINT)  # wrk prints its figures and exits
        out, _ = process.communicate(timeout=30)
    if not line:
        raise RuntimeError(f"wrk ended or timed out before the load's last answer:\n{out}")
    seconds, failed, cpu_s = line.split()
    p50, p99 = wrk_percentile_ms(out, 50), wrk_percentile_ms(out, 99)
    if p50 is None or p99 is None:
        raise RuntimeError(f"wrk printed no latency distribution:\n{out}")
    return Load(float(seconds), int(failed), p50, p99, round(float(cpu_s) * 1e9))


def _read(path: Path) -> str:
    """A file's whole line, or "" while it is not written yet."""
    text = path.read_text() if path.exists() else ""
    return text if text.endswith("\n") else ""


async def _metrics(http: aiohttp.ClientSession, urls: Sequence[str]) -> list[str]:
    texts = []
    for url in urls:
        async with http.get(f"{url}/metrics") as response:
            texts.append(await response.text())
    return texts


async def _translate(http: aiohttp.ClientSession, url: str, text: str) -> int:
    """POST /translate of `text` (en -> de), its answer read whole -> its status."""
    body = {"text": text, **EN_DE}
    async with http.post(f"{url}/translate", json=body) as response:
        await response.read()
        return response.status


async def replay(
    url: str,
    bodies: Sequence[str],
    clients: int,
    probes: Sequence[str],
    replica_urls: Sequence[str] = (),
    warm_up: Sequence[str] = (),
    pids: dict[str, list[int]] | None = None,
) -> Run:
    """The load sent to `url` by wrk (`send_load`), after `warm_up` (sent from aiohttp by as
    many clients, not counted); the cache's counts summed over `replica_urls`' /metrics
    (default: `url`'s); with `pids` (as `serving` gives them, and "redis"), the CPU of each of
    CPU_PARTS during the load."""
    run = Run(mode="")
    replica_urls = replica_urls or [url]
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def client(queue: Iterator[str]) -> None:
            for text in queue:
                if (status := await _translate(http, url, text)) != 200:
                    raise RuntimeError(f"a warm-up request answered {status}")

        warm_queue = iter(warm_up)
        await asyncio.gather(*(client(warm_queue) for _ in range(clients)))
        before = await _metrics(http, replica_urls)
        cpu = None if pids is None else _cpu(pids)
        load = await asyncio.to_thread(send_load, url, bodies, clients)
        if pids is not None and cpu is not None:
            spent = _cpu(pids)
            used = {k: spent[k] - cpu[k] for k in spent} | {"load": load.cpu_ns}  # wrk's all
            run.cpu_ms = {k: round(ns / 1e6 / len(bodies), 2) for k, ns in used.items()}
        after = await _metrics(http, replica_urls)
        cached: list[float] = []
        for text in probes:
            sent = time.perf_counter()
            if (status := await _translate(http, url, text)) != 200:
                raise RuntimeError(f"a cached request answered {status}")
            cached.append(time.perf_counter() - sent)
    run.seconds = round(load.seconds, 2)
    run.failed = load.failed
    run.answered = len(bodies) - load.failed
    run.requests_per_s = round(run.answered / load.seconds, 1)  # not the rounded seconds
    run.p50_ms, run.p99_ms = load.p50_ms, load.p99_ms
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
        "--warm-up",
        type=int,
        default=96,
        help="paragraphs of Multi30k's val sent first to each mode's fresh servers, not counted",
    )
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
    # Other sentences than the pool's (val and test2016 share none): they open the
    # connections (client, nginx, Redis) and warm the engine, and leave the load's hit rate as
    # it was.
    warm_up = paragraphs(read_texts(args.texts.with_name("val.en.gz")), rng)[: args.warm_up]
    runs: list[Run] = []
    for number in range(args.repeat):
        for mode in modes:
            run = _run(mode, args, bodies, probes, warm_up)
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


def _run(
    mode: str, args: argparse.Namespace, bodies: list[str], probes: list[str], warm_up: list[str]
) -> Run:
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
            with serving(args.bundle, flags, args.replicas) as (url, replicas, pids):
                if redis is not None and redis.process is not None:
                    pids["redis"].append(redis.process.pid)
                run = asyncio.run(
                    replay(url, bodies, args.clients, probes, replicas, warm_up, pids)
                )
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
          "| sentences decoded | joined | cached request p50 ms | CPU ms a request: "
          + " / ".join(CPU_PARTS) + " |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        decoded = "all" if r.mode == "off" else f"{r.misses:.0f}"
        ratio = f"{r.requests_per_s / off[r.round]:.2f}x" if off.get(r.round) else "-"
        cpu = " / ".join(f"{r.cpu_ms.get(part, 0):.2f}" for part in CPU_PARTS)
        print(f"| {r.mode} | {r.round + 1} | {r.replicas} | {r.requests_per_s} | {ratio} | "
              f"{r.p50_ms} | {r.p99_ms} | {r.hit_rate} | {decoded} | {r.joined:.0f} | "
              f"{r.cached_p50_ms} | {cpu} |")  # fmt: skip
    if len(off) > 1:
        for mode in dict.fromkeys(r.mode for r in runs):
            own = [r for r in runs if r.mode == mode]
            ratios = [r.requests_per_s / off[r.round] for r in own if off.get(r.round)]
            print(f"{mode}: median of {len(own)} rounds: "
                  f"{statistics.median(r.requests_per_s for r in own):.1f} requests/s, "
                  f"{statistics.median(ratios):.2f}x off, cached request p50 "
                  f"{statistics.median(r.cached_p50_ms for r in own)} ms, CPU ms a request "
                  + " / ".join(f"{statistics.median(r.cpu_ms.get(p, 0) for r in own):.2f}"
                               for p in CPU_PARTS))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
