"""Scheduling benchmark: short requests among long ones, whole-batch scheduling against
step-level scheduling (service/inference/running.py), each in its own server in the same run.

    python -m benchmarks.scheduling_bench --bundle bundles/multi30k-en-de \\
        [--duration 30] [--rates 0.5,1] [--long-clients 4] [--paragraph 30] [--json OUT]

Two classes of request: short (one sentence, greedy) and long (a paragraph of --paragraph
sentences, beam 5), sentences from Multi30k val (../shared/data), each request's own. For each
scheduler (`--scheduler batch`, `--scheduler step`):
1. unloaded: short requests one at a time, alone (their p50 is the yardstick);
2. mixed, closed loop (the issue's measurement): one client sends short requests one at a time
   while --long-clients clients each send paragraphs back to back;
3. long only, closed loop: the same long clients without the short one: the scheduler's
   capacity for paragraphs (under the mixed load each scheduler also serves the short client,
   at its own pace: whole batches hold it behind every paragraph, step-level does not);
4. open loop: Poisson arrivals for --duration seconds at each rate in --rates (long requests
   per second; short ones arrive ten times as often), every request sent at its time whether
   or not earlier ones were answered.
Per class: requests answered, p50/p99 latency (ms), and throughput (requests/s; for long ones
also sentences/s). The last table divides step by batch. No timed assertion anywhere: numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.paths import MULTI30K
from benchmarks.servers import percentile_ms, read_texts, service

SHORT_PER_LONG = 10  # open loop: short arrivals per long one


@dataclass
class Class:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    sentences: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # of the errors: status or exception

    def row(self, seconds: float) -> dict[str, Any]:
        """Its figures over `seconds`; {} for a class the scenario sent nothing of."""
        n = len(self.latencies)
        if not n and not self.errors:
            return {}
        return {
            "answered": n,
            "errors": self.errors,
            "p50_ms": percentile_ms(self.latencies, 50),
            "p99_ms": percentile_ms(self.latencies, 99),
            "requests_per_s": round(n / seconds, 2),
            "sentences_per_s": round(self.sentences / seconds, 1),
            "error_statuses": dict(self.statuses),
        }

    def error(self, status: str) -> None:
        self.errors += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1


@dataclass(frozen=True)
class Result:
    scheduler: str
    scenario: str
    seconds: float
    short: dict[str, Any]
    long: dict[str, Any]


class Load:
    def __init__(self, url: str, texts: list[str], paragraph: int, seed: int) -> None:
        self.url = url
        self.texts = texts
        self.paragraph = paragraph
        self.rng = random.Random(seed)
        self.short, self.long = Class(), Class()

    def body(self, long: bool) -> dict[str, object]:
        if long:
            start = self.rng.randrange(len(self.texts) - self.paragraph)
            text = " ".join(self.texts[start : start + self.paragraph])
            return {"source": "en", "target": "de", "text": text, "beam_size": 5}
        text = self.rng.choice(self.texts)
        return {"source": "en", "target": "de", "text": text, "beam_size": 1}

    async def send(self, client: httpx.AsyncClient, long: bool) -> None:
        kind = self.long if long else self.short
        start = time.perf_counter()
        try:
            response = await client.post(f"{self.url}/translate", json=self.body(long))
        except httpx.HTTPError as e:
            kind.error(type(e).__name__)
            return
        if response.status_code != 200:
            kind.error(str(response.status_code))
            return
        kind.latencies.append(time.perf_counter() - start)
        kind.sentences += self.paragraph if long else 1


async def unloaded(load: Load, requests: int) -> float:
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(3):
            await client.post(f"{load.url}/translate", json=load.body(False))
        start = time.perf_counter()
        for _ in range(requests):
            await load.send(client, False)
    return time.perf_counter() - start


async def closed_mixed(
    load: Load, long_clients: int, duration: float, short_client: bool = True
) -> float:
    end = time.perf_counter() + duration

    async def loop(long: bool) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            while time.perf_counter() < end:
                await load.send(client, long)

    start = time.perf_counter()
    shorts = [loop(False)] if short_client else []
    await asyncio.gather(*shorts, *(loop(True) for _ in range(long_clients)))
    return time.perf_counter() - start


async def open_loop(load: Load, long_rate: float, duration: float) -> float:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        arrivals = []
        for long, rate in ((True, long_rate), (False, long_rate * SHORT_PER_LONG)):
            t = load.rng.expovariate(rate)
            while t < duration:
                arrivals.append((t, long))
                t += load.rng.expovariate(rate)
        for at, long in sorted(arrivals):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            tasks.append(asyncio.create_task(load.send(client, long)))
        await asyncio.gather(*tasks)
        return time.perf_counter() - start


def run(args: argparse.Namespace, scheduler: str, texts: list[str]) -> list[Result]:
    results = []
    flags = ["--scheduler", scheduler, "--intra-op-threads", str(args.intra_op_threads)]
    with service(args.bundle, flags) as server:

        def measure(scenario: str, drive: Callable[[Load], Coroutine[Any, Any, float]]) -> None:
            load = Load(server.url, texts, args.paragraph, args.seed)
            seconds = asyncio.run(drive(load))
            short, long = load.short.row(seconds), load.long.row(seconds)
            results.append(Result(scheduler, scenario, seconds, short, long))
            _print(results[-1])

        clients = args.long_clients
        measure("unloaded", lambda load: unloaded(load, args.unloaded))
        measure(
            f"closed: 1 short + {clients} long clients",
            lambda load: closed_mixed(load, clients, args.duration),
        )
        measure(
            f"closed: {clients} long clients only",
            lambda load: closed_mixed(load, clients, args.duration, short_client=False),
        )
        for rate in args.rates:
            measure(
                f"open: {rate:g} long/s + {rate * SHORT_PER_LONG:g} short/s",
                lambda load, rate=rate: open_loop(load, rate, args.duration),
            )
    return results


def _print(r: Result) -> None:
    def cell(row: dict[str, Any], sentences: bool = False) -> str:
        if not row:
            return "-"
        rate = f"{row['sentences_per_s']:g} sent/s" if sentences else f"{row['requests_per_s']:g}/s"
        errors = f", errors {row['error_statuses']}" if row["errors"] else ""
        return f"{row['p50_ms']:g} / {row['p99_ms']:g} ms, {rate}{errors}"

    print(f"| {r.scheduler} | {r.scenario} | {cell(r.short)} | {cell(r.long, True)} |", flush=True)


def _ratios(results: list[Result]) -> None:
    print("\nstep / batch (latency: lower is better; throughput: higher)")
    print("| scenario | short p50 | short p99 | long p50 | long sentences/s |")
    print("|---|---|---|---|---|")
    by = {(r.scheduler, r.scenario): r for r in results}
    for r in results:
        if r.scheduler != "step" or ("batch", r.scenario) not in by:
            continue
        old = by[("batch", r.scenario)]

        def ratio(new: dict[str, Any], was: dict[str, Any], key: str) -> str:
            return f"{new[key] / was[key]:.2f}x" if new and was and was[key] else "-"

        print(
            f"| {r.scenario} | {ratio(r.short, old.short, 'p50_ms')} | "
            f"{ratio(r.short, old.short, 'p99_ms')} | {ratio(r.long, old.long, 'p50_ms')} | "
            f"{ratio(r.long, old.long, 'sentences_per_s')} |"
        )
    for scheduler in ("batch", "step"):
        base = by.get((scheduler, "unloaded"))
        if base is None:
            continue
        for r in results:
            if r.scheduler == scheduler and r.scenario != "unloaded" and r.short:
                p50 = r.short["p50_ms"] / base.short["p50_ms"]
                p99 = r.short["p99_ms"] / base.short["p50_ms"]
                print(
                    f"{scheduler}, {r.scenario}: short p50 {p50:.1f}x, p99 {p99:.1f}x "
                    "the unloaded p50"
                )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument(
        "--texts", type=Path, default=MULTI30K / "val.en.gz",
        help="one sentence per line",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=30.0, help="seconds per loaded scenario")
    p.add_argument("--unloaded", type=int, default=100, help="short requests alone")
    p.add_argument("--rates", default="0.5,1", help="open loop: long requests per second")
    p.add_argument("--long-clients", type=int, default=4)
    p.add_argument("--paragraph", type=int, default=30, help="sentences per long request")
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--schedulers", default="batch,step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r]
    texts = read_texts(args.texts)
    print("| scheduler | scenario | short: p50 / p99, rate | long: p50 / p99, sentences/s |")
    print("|---|---|---|---|")
    results = [r for s in args.schedulers.split(",") for r in run(args, s, texts)]
    _ratios(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
