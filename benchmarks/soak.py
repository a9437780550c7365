"""Soak benchmark: N requests from C concurrent clients against `python -m service` on
127.0.0.1, directly or through nginx, and nothing may be lost.

    python -m benchmarks.soak --bundle bundles/multi30k-en-de [--requests 100000] [--clients 64] \\
        [--connections pooled|per-client] [--client httpx2|httpx] [--via direct|nginx] \\
        [--texts FILE[.gz]] \\
        [--max-seconds 3600] [--timeout 120] [--server-args "--keep-alive-timeout-s 5"] \\
        [--port P --proxy-url http://127.0.0.1:PORT] [--json OUT]

The requests mix three kinds, in a fixed order: `short` (one sentence, greedy; half of them),
`beam` (one sentence at beam 4; one in three) and `long` (five sentences in two paragraphs,
greedy; one in six). `pooled`: all clients share one HTTP client with a pool of C connections
(idle ones expire after the library's default 5 s); `per-client`: each client has its own
connection. The clients are httpx2's (`--client httpx2`, the default) or httpx's: the two have
one API, but httpx 0.28's shared pool walks every connection for every queued request and caps
a pooled soak at about 40 requests/s on two cores, so the load generator, not the service, would
set the pace (benchmarks/RESULTS.md, issue 17).
`--via nginx` starts nginx with deploy/nginx/transformer-mt.conf in front of the service;
`--proxy-url` sends to a proxy of yours instead, whose upstream is the service on `--port`.

Reports the requests answered (200), those lost by kind (a connection error or timeout by its
exception name, any other status by its code), the status counts, what the server itself
counted as answered (/metrics), p50/p99 latency of the answered requests overall and by kind,
and the server's RSS over time, sampled every `--rss-every` seconds once `--warmup` requests are
done: after warm-up and at the end (the medians of the first and last tenth of the samples), and
the growth in between. The last line is the report as JSON. Exits 1 when a request was lost, was
never sent (`--max-seconds` ran out) or the RSS grew more than `--max-rss-growth` percent; 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import httpx2

from benchmarks.servers import Running, metric, nginx, percentile_ms, read_texts, service

Connections = Literal["pooled", "per-client"]
Library = Literal["httpx2", "httpx"]
LIBRARIES = {"httpx2": httpx2, "httpx": httpx}  # one API: AsyncClient, Limits, HTTPError
AsyncClient = httpx.AsyncClient | httpx2.AsyncClient
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# One in three at beam 4, one in six five sentences long, the rest one sentence, greedy.
MIX = ("short", "beam", "short", "long", "beam", "short")
LONG_SENTENCES = 5
BEAM_SIZE = 4


@dataclass
class Report:
    requests: int
    clients: int
    connections: str
    via: str
    client: str = "httpx2"
    sent: int = 0
    done: int = 0
    answered: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    server_answered: int | None = None
    seconds: float = 0.0
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_warm_mib: float | None = None
    rss_end_mib: float | None = None
    rss_max_mib: float | None = None
    rss_growth_pct: float | None = None
    rss: list[tuple[float, int, float]] = field(default_factory=list)  # (s, requests done, MiB)

    @property
    def lost_total(self) -> int:
        return sum(self.lost.values())


def request_body(
    i: int, texts: Sequence[str], pair: tuple[str, str]
) -> tuple[str, dict[str, object]]:
    """Request `i` of the mix: its kind and JSON body (spread over the texts)."""
    kind = MIX[i % len(MIX)]
    first = (i * 7919) % len(texts)  # a prime stride: neighbours get unrelated sentences
    body: dict[str, object] = {"source": pair[0], "target": pair[1], "beam_size": 1}
    if kind == "long":
        sentences = [_ended(texts[(first + k) % len(texts)]) for k in range(LONG_SENTENCES)]
        body["text"] = " ".join(sentences[:3]) + "\n\n" + " ".join(sentences[3:])
    else:
        body["text"] = texts[first]
    if kind == "beam":
        body["beam_size"] = BEAM_SIZE
    return kind, body


def _ended(sentence: str) -> str:
    # Captions often lack a full stop; without one, joined sentences would read as one.
    return sentence if sentence[-1] in ".!?" else sentence + "."


def rss_mib(pid: int) -> float | None:
    """Resident set size of process `pid` in MiB (Linux /proc; None elsewhere or once gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def soak(
    url: str,
    *,
    requests: int,
    clients: int,
    connections: Connections,
    texts: Sequence[str],
    client: Library = "httpx2",
    via: str = "direct",
    server_url: str | None = None,
    server_pid: int | None = None,
    warmup: int = 1000,
    max_seconds: float = 3600.0,
    timeout: float = 120.0,
    rss_every: float = 10.0,
) -> Report:
    """Send `requests` requests of the mix to `url` from `clients` concurrent clients. The
    server (at `server_url`, default `url`) is asked for its own count of answers, and its
    process (`server_pid`) sampled for RSS every `rss_every` seconds once `warmup` requests
    are done."""
    report = Report(requests, clients, connections, via, client)
    http_error = LIBRARIES[client].HTTPError
    latencies: dict[str, list[float]] = {kind: [] for kind in MIX}
    lost: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    warm = asyncio.Event()
    start = end = 0.0  # set when the first request goes

    def sample_rss() -> None:
        mib = rss_mib(server_pid) if server_pid is not None else None
        if mib is not None:
            seconds = round(time.perf_counter() - start, 1)
            report.rss.append((seconds, report.done, round(mib, 1)))
            print(f"  {report.done:>7} done  {seconds:>7.1f} s  server RSS {mib:.1f} MiB",
                  file=sys.stderr, flush=True)  # fmt: skip

    async def sample_rss_periodically() -> None:
        await warm.wait()
        while True:
            sample_rss()
            await asyncio.sleep(rss_every)

    async with _clients(url, clients, connections, client, timeout) as pool:
        languages = (await pool[0].get("/languages")).raise_for_status().json()
        pair = (languages[0]["source"], languages[0]["target"])
        answered_before = await _server_answered(pool[0], server_url or url, http_error)

        async def simulated_client(http: AsyncClient) -> None:
            while report.sent < requests and time.perf_counter() < end:
                kind, body = request_body(report.sent, texts, pair)
                report.sent += 1
                sent = time.perf_counter()
                try:
                    response = await http.post("/translate", json=body)
                except http_error as e:  # connection errors and timeouts
                    lost[type(e).__name__] += 1
                else:
                    statuses[str(response.status_code)] += 1
                    if response.status_code == 200:
                        latencies[kind].append(time.perf_counter() - sent)
                    else:
                        lost[f"status {response.status_code}"] += 1
                report.done += 1
                if report.done >= warmup:
                    warm.set()

        sampler = asyncio.create_task(sample_rss_periodically())
        start = time.perf_counter()
        end = start + max_seconds
        await asyncio.gather(*(simulated_client(pool[i % len(pool)]) for i in range(clients)))
        report.seconds = round(time.perf_counter() - start, 1)
        sampler.cancel()
        if warm.is_set():
            sample_rss()
        answered_after = await _server_answered(pool[0], server_url or url, http_error)
    every = [v for values in latencies.values() for v in values]
    report.answered = len(every)
    report.lost = dict(sorted(lost.items()))
    report.statuses = dict(sorted(statuses.items()))
    if answered_before is not None and answered_after is not None:
        report.server_answered = round(answered_after - answered_before)
    report.requests_per_s = round(report.answered / report.seconds, 1) if report.seconds else 0.0
    report.p50_ms, report.p99_ms = percentile_ms(every, 50), percentile_ms(every, 99)
    report.by_kind = {
        kind: {"answered": len(values), "p50_ms": percentile_ms(values, 50),
               "p99_ms": percentile_ms(values, 99)}
        for kind, values in latencies.items()
    }  # fmt: skip
    rss_summary(report)
    return report


def rss_summary(report: Report) -> None:
    """RSS after warm-up and at the end: the medians of the first and of the last tenth of the
    samples (one sample moves by a few MiB as batches come and go), and the growth between."""
    if len(report.rss) < 2:
        return
    tenth = max(1, len(report.rss) // 10)
    mib = [sample[2] for sample in report.rss]
    warm, end = statistics.median(mib[:tenth]), statistics.median(mib[-tenth:])
    report.rss_warm_mib, report.rss_end_mib = round(warm, 1), round(end, 1)
    report.rss_max_mib = max(mib)
    report.rss_growth_pct = round(100 * (end - warm) / warm, 1)


@contextlib.asynccontextmanager
async def _clients(
    url: str, clients: int, connections: Connections, library: Library, timeout: float
) -> AsyncIterator[list[AsyncClient]]:
    """`pooled`: one client whose pool holds a connection per simulated client; `per-client`:
    one client with one connection each."""
    counts = [clients] if connections == "pooled" else [1] * clients
    http = LIBRARIES[library]
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                http.AsyncClient(
                    base_url=url,
                    timeout=timeout,
                    limits=http.Limits(max_connections=n, max_keepalive_connections=n),
                )
            )
            for n in counts
        ]


async def _server_answered(
    http: AsyncClient, server_url: str, http_error: type[Exception]
) -> float | None:
    """How many /translate requests the server answered with 200 so far (its /metrics)."""
    try:
        text = (await http.get(f"{server_url}/metrics")).text
    except http_error:
        return None
    return metric(text, "mt_http_requests_total", route="/translate", status="200")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    texts = read_texts(args.texts)
    server_flags = shlex.split(args.server_args)
    with _target(args, server_flags) as (url, server):
        print(f"soak: {args.requests} requests, {args.clients} clients ({args.connections}, "
              f"{args.client}), {args.via} -> {url}", file=sys.stderr, flush=True)  # fmt: skip
        report = asyncio.run(
            soak(
                url,
                requests=args.requests,
                clients=args.clients,
                connections=args.connections,
                texts=texts,
                client=args.client,
                via=args.via,
                server_url=server.url,
                server_pid=server.process.pid,
                warmup=args.warmup,
                max_seconds=args.max_seconds,
                timeout=args.timeout,
                rss_every=args.rss_every,
            )
        )
    failures = _failures(report, args.max_rss_growth)
    _print(report, failures)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report)) + "\n")
    return 1 if failures else 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--clients", type=int, default=64, help="concurrent clients")
    p.add_argument("--connections", choices=["pooled", "per-client"], default="pooled")
    p.add_argument("--client", choices=["httpx2", "httpx"], default="httpx2",
                   help="HTTP client library (one API; httpx's shared pool is slow)")  # fmt: skip
    p.add_argument("--via", choices=["direct", "nginx"], default="direct")
    p.add_argument("--proxy-url", default=None, help="a loopback proxy in front of --port")
    p.add_argument("--port", type=int, default=None, help="the service's port (default: free)")
    p.add_argument("--texts", type=Path, default=None, help="one sentence per line (.gz too)")
    p.add_argument("--warmup", type=int, default=1000, help="requests before the first RSS")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop sending after this")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--max-rss-growth", type=float, default=10.0, help="percent, after warm-up")
    p.add_argument("--server-args", default="", help="more flags for python -m service")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    args = p.parse_args(argv)
    if args.requests < 1 or args.clients < 1 or args.warmup < 0:
        p.error("--requests and --clients must be at least 1, --warmup at least 0")
    if args.proxy_url is not None:
        if args.via != "direct":
            p.error("--proxy-url and --via nginx exclude each other")
        if args.port is None:
            p.error("--proxy-url needs --port: the port its upstream (the service) listens on")
        if httpx.URL(args.proxy_url).host not in LOOPBACK:
            p.error(f"--proxy-url must be on this machine ({', '.join(sorted(LOOPBACK))})")
        args.via = args.proxy_url
    return args


@contextlib.contextmanager
def _target(args: argparse.Namespace, server_flags: list[str]) -> Iterator[tuple[str, Running]]:
    """The service, and the URL the clients send to (the service's, or a proxy's)."""
    with service(args.bundle, server_flags, port=args.port) as server:
        if args.via == "nginx":
            with nginx(server.port) as proxy:
                yield proxy.url, server
        elif args.proxy_url is not None:
            yield args.proxy_url.rstrip("/"), server
        else:
            yield server.url, server


def _failures(report: Report, max_rss_growth: float) -> list[str]:
    failures = []
    if report.lost_total:
        failures.append(f"{report.lost_total} requests lost")
    if report.sent < report.requests:
        failures.append(f"{report.requests - report.sent} requests never sent (--max-seconds)")
    if report.rss_growth_pct is not None and report.rss_growth_pct > max_rss_growth:
        failures.append(f"RSS grew {report.rss_growth_pct} % (limit {max_rss_growth} %)")
    return failures


def _print(r: Report, failures: list[str]) -> None:
    lost = ", ".join(f"{k}: {v}" for k, v in sorted(r.lost.items())) or "none"
    statuses = ", ".join(f"{k}: {v}" for k, v in r.statuses.items())
    print(f"{r.requests} requests, {r.clients} clients ({r.connections}, {r.client}), via {r.via}: "
          f"{r.seconds} s, {r.requests_per_s} answered/s")  # fmt: skip
    print(f"  answered {r.answered}, lost {r.lost_total} ({lost}); statuses {statuses}; "
          f"the server counted {r.server_answered} answered")  # fmt: skip
    print(f"  latency p50 {r.p50_ms} ms, p99 {r.p99_ms} ms; "
          + ", ".join(f"{k} p50 {v['p50_ms']} / p99 {v['p99_ms']} ms"
                      for k, v in r.by_kind.items()))  # fmt: skip
    if r.rss:
        print(f"  server RSS {r.rss_warm_mib} MiB after warm-up -> {r.rss_end_mib} MiB at the "
              f"end ({r.rss_growth_pct:+} %), max {r.rss_max_mib} MiB")  # fmt: skip
    print("  " + ("FAILED: " + "; ".join(failures) if failures else "OK: nothing lost"))
    print(json.dumps(asdict(r)))


if __name__ == "__main__":
    sys.exit(main())
