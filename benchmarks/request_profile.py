"""Where an unloaded request's milliseconds go: the same sentences, one request at a time,
through each layer of the service in turn, so each layer's cost is the difference between two
rows.

    python -m benchmarks.request_profile --bundle bundles/multi30k-en-de [--src FILE] [--n 200]
        [--beam-size 4] [--intra-op-threads N] [--layers engine runtime app http] [--json FILE]

Layers, each answering the same first N lines of --src, one at a time after a warm-up:

  engine   Engine.encode and Engine.generate in this thread: tokenizing and the search
  runtime  Runtime.translate on a started runtime: + checks, splitting, the batcher's queue, the
           hop to the engine's thread and back, detokenizing and assembling
  app      POST /translate through the FastAPI app in this process (httpx's ASGI transport):
           + reading and validating JSON, the middlewares, routing, writing the response
  http     POST /translate to `python -m service` on 127.0.0.1 over one kept-alive connection:
           + uvicorn's HTTP parsing and writing, the socket, the client's own work

Inside `runtime` three parts are clocked: prepare (pipeline.prepare: splitting, tokenizing),
engine (the batcher's engine call, in its thread) and assemble (pipeline.assemble:
detokenizing); the rest of a runtime request is the queue and the hops between threads.
The service's settings are its defaults (MT_* variables apply) except --beam-size and
--intra-op-threads, passed to every layer. The last stdout line is a JSON object with every
measurement (--json also writes it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import httpx

from benchmarks.engine_bench import read_lines
from benchmarks.paths import MULTI30K
from benchmarks.servers import percentile_ms, service
from service.http.app import create_app
from service.inference.engine import Engine
from service.scheduling.batcher import Batcher
from service.scheduling.runtime import Runtime
from service.settings import Settings
from service.text import pipeline

DEFAULT_SRC = MULTI30K / "test_2016_flickr.en.gz"
LAYERS = ("engine", "runtime", "app", "http")
PARTS = ("prepare", "engine", "assemble")


class _Parts:
    """Wall-clock seconds inside pipeline.prepare, the batcher's engine call and
    pipeline.assemble."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def clocked(self, batcher: Batcher) -> Iterator[None]:
        targets: list[tuple[Any, str, str]] = [
            (pipeline, "prepare", "prepare"),
            (batcher, "_generate", "engine"),  # the engine's bound generate, held since start
            (pipeline, "assemble", "assemble"),
        ]
        originals = [getattr(owner, name) for owner, name, _ in targets]
        for (owner, name, part), original in zip(targets, originals, strict=True):
            setattr(owner, name, self._timed(original, part))
        try:
            yield
        finally:
            for (owner, name, _), original in zip(targets, originals, strict=True):
                setattr(owner, name, original)

    def _timed(self, function: Callable[..., Any], part: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        return timed


def _summary(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": percentile_ms(latencies, 50),
        "p90_ms": percentile_ms(latencies, 90),
        "mean_ms": 1000 * statistics.fmean(latencies),
    }


async def _timed_each(
    texts: Sequence[str], send: Callable[[str], Awaitable[Any]], *, warm_up: bool = True
) -> list[float]:
    """Each text's round trip through `send`, one after another, after a first one untimed
    (it pays for lazy imports and first allocations)."""
    if warm_up:
        await send(texts[0])
    latencies = []
    for text in texts:
        start = time.perf_counter()
        await send(text)
        latencies.append(time.perf_counter() - start)
    return latencies


async def _post_each(
    client: httpx.AsyncClient, texts: Sequence[str], source: str, target: str
) -> list[float]:
    """POST /translate of each text, as _timed_each times them: the app and http layers."""

    async def post(text: str) -> None:
        body = {"text": text, "source": source, "target": target}
        (await client.post("/translate", json=body)).raise_for_status()

    return await _timed_each(texts, post)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        bundle=[args.bundle],
        checkpoint=[],
        default_beam_size=args.beam_size,
        intra_op_threads=args.intra_op_threads,
        cache=False,  # the same sentences again and again: time the model, not the cache
    )


async def measure_in_process(
    args: argparse.Namespace, texts: Sequence[str], layers: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The engine, runtime and app layers, on one app whose lifespan loads the bundle once,
    with the options the service gives a request that names none."""
    app = create_app(_settings(args))
    results: dict[str, dict[str, float]] = {}
    async with app.router.lifespan_context(app):
        runtime: Runtime = app.state.runtime
        [(pair, model)] = runtime.models.items()
        source, target = pair
        options = runtime.decoding_options(pair, {})
        if "engine" in layers:
            engine = cast(Engine, model)

            async def generate(text: str) -> Any:
                return engine.generate(engine.encode([text]), options)

            results["engine"] = _summary(await _timed_each(texts, generate))
        if "runtime" in layers:
            parts = _Parts()

            async def translate(text: str) -> Any:
                return await runtime.translate([text], pair, options, deadline=math.inf)

            await translate(texts[0])  # warmed up outside the clocks: they count n requests
            with parts.clocked(runtime.batchers[model.name]):
                latencies = await _timed_each(texts, translate, warm_up=False)
            total = sum(latencies)
            results["runtime"] = {
                **_summary(latencies),
                **{f"{part}_ms": 1000 * s / len(texts) for part, s in parts.seconds.items()},
                "rest_ms": 1000 * (total - sum(parts.seconds.values())) / len(texts),
            }
        if "app" in layers:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                results["app"] = _summary(await _post_each(client, texts, source, target))
    return results


async def measure_http(args: argparse.Namespace, texts: Sequence[str]) -> dict[str, float]:
    """The http layer, with the client of the app layer, so that the two differ by the server."""
    flags = ["--default-beam-size", str(args.beam_size)]
    if args.intra_op_threads is not None:
        flags += ["--intra-op-threads", str(args.intra_op_threads)]
    with service(args.bundle, flags) as running:
        url = f"http://127.0.0.1:{running.port}"
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            [pair] = (await client.get("/languages")).json()
            return _summary(await _post_each(client, texts, pair["source"], pair["target"]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.request_profile", description=__doc__)
    p.add_argument("--bundle", type=Path, required=True, help="a bundle of one language pair")
    p.add_argument("--src", type=Path, default=DEFAULT_SRC, help="plain or .gz, one per line")
    p.add_argument("--n", type=int, default=200, help="first N lines (default 200)")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument(
        "--intra-op-threads", type=int, help="default: the service's (service/inference/cpus.py)"
    )
    p.add_argument("--layers", nargs="+", choices=LAYERS, default=list(LAYERS))
    p.add_argument("--json", type=Path, help="also write the JSON summary here")
    args = p.parse_args(argv)
    texts = read_lines(args.src)[: args.n]
    results: dict[str, dict[str, float]] = {}
    if {"engine", "runtime", "app"} & set(args.layers):
        results.update(asyncio.run(measure_in_process(args, texts, args.layers)))
    if "http" in args.layers:
        results["http"] = asyncio.run(measure_http(args, texts))
    print(
        f"{len(texts)} requests of one sentence from {args.src}, one at a time, beam "
        f"{args.beam_size}, intra-op threads {args.intra_op_threads or 'the service default'}"
    )
    print("| layer | p50 ms | p90 ms | mean ms | mean ms over the layer before |")
    print("|---|---|---|---|---|")
    before = None
    for layer in LAYERS:
        if layer not in results:
            continue
        r = results[layer]
        added = "" if before is None else f"{r['mean_ms'] - before:+.2f}"
        print(f"| {layer} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['mean_ms']:.2f} | {added} |")
        before = r["mean_ms"]
    if "runtime" in results:
        r = results["runtime"]
        parts = ", ".join(f"{part} {r[f'{part}_ms']:.2f}" for part in (*PARTS, "rest"))
        print(f"\ninside runtime, mean ms a request: {parts}")
    line = json.dumps({"src": str(args.src), "requests": len(texts), "results": results})
    if args.json:
        args.json.write_text(line + "\n", encoding="utf-8")
    print(line)


if __name__ == "__main__":
    main()
