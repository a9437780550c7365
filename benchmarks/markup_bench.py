"""What markup costs: a Mastodon-style status (5 sentences, a mention, a link, a hashtag, a few
inline tags) sent as `format: html` against the same text sent plain, over HTTP to one
`python -m service`, requests alternating one at a time; and what the alignment output costs
the decoder step (the same bundle with the alignment asked for and without).

    python -m benchmarks.markup_bench --bundle bundles/multi30k-en-de [--requests 300]
        [--threads 1] [--json OUT]

Prints the p50/p90 of both request kinds and their ratio (html pays for the alignment too:
plain text skips the aligner's nodes since bundle format 7; issue 29's goal of 1.10x predates that),
the time the markup work itself takes in process (parse, and render with the alignment map),
and the engine's batch-1 greedy and batch-32 beam-4 time with the alignment asked for and without.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from benchmarks.engine_bench import read_lines
from benchmarks.paths import MULTI30K
from benchmarks.servers import percentile_ms, service
from service.bundle.decoding import DecodingOptions
from service.inference.engine import Engine
from service.text import markup, pipeline

MENTION = (
    '<span class="h-card" translate="no"><a href="https://mastodon.social/@anna" '
    'class="u-url mention">@<span>anna</span></a></span>'
)
LINK = (
    '<a href="https://example.com/photos/beach" target="_blank" rel="nofollow noopener" '
    'translate="no"><span class="invisible">https://</span><span class="">example.com/photos/'
    'beach</span><span class="invisible"></span></a>'
)
HASHTAG = (
    '<a href="https://mastodon.social/tags/summer" class="mention hashtag" rel="tag">'
    "#<span>summer</span></a>"
)
STATUS = (
    f"<p>{MENTION} Two young children are playing in the <b>sand</b> on the beach. "
    "A woman with a <em>red hat</em> is sitting on a bench in the park.</p>"
    f"<p>A black dog runs through the snow. Several people are standing in front of a large "
    f"building.<br>A little girl climbs the stairs to her playhouse. {LINK} {HASHTAG}</p>"
)


def plain_text(document: markup.Document) -> str:
    """The status's text as a plain client would send it: its blocks, one per line."""
    return "\n".join(document.blocks)


def http_latency(bundle: Path, requests: int, threads: int) -> dict[str, Any]:
    """p50/p90 of the html request and of its plain text, alternating, one at a time."""
    document = markup.parse(STATUS, "html")
    bodies = {
        "html": {"text": STATUS, "source": "en", "target": "de", "format": "html"},
        "plain": {"text": plain_text(document), "source": "en", "target": "de"},
    }
    flags = ["--intra-op-threads", str(threads)]
    times: dict[str, list[float]] = {kind: [] for kind in bodies}
    with service(bundle, flags) as running, httpx.Client(base_url=running.url) as client:
        for _ in range(10):  # warm-up: sessions, caches, the first shapes
            for body in bodies.values():
                client.post("/translate", json=body, timeout=60).raise_for_status()
        for _ in range(requests):
            for kind, body in bodies.items():
                start = time.perf_counter()
                client.post("/translate", json=body, timeout=60).raise_for_status()
                times[kind].append(time.perf_counter() - start)
    result: dict[str, Any] = {
        kind: {"p50_ms": percentile_ms(values, 50), "p90_ms": percentile_ms(values, 90)}
        for kind, values in times.items()
    }
    result["ratio_p50"] = round(result["html"]["p50_ms"] / result["plain"]["p50_ms"], 3)
    return result


def _best_of(repeats: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def markup_work(bundle: Path) -> dict[str, float]:
    """The markup steps alone, in process, best of 200: parse, and assemble + render (the
    alignment map and the rebuilt document), against the model's own time for the status."""
    engine = Engine.load(bundle, device="cpu", intra_op_threads=1)
    prepared = pipeline.prepare(engine, [STATUS], None, max_segment_characters=4000, format="html")
    options = DecodingOptions(beam_size=4, alignments=True)
    nbest = engine.generate(prepared.sources, options)
    return {
        "parse_ms": 1000 * _best_of(200, lambda: markup.parse(STATUS, "html")),
        "assemble_and_render_ms": 1000
        * _best_of(200, lambda: pipeline.assemble(engine, prepared, nbest, 1)),
        "model_ms": 1000 * _best_of(5, lambda: engine.generate(prepared.sources, options)),
    }


def _decode_all(engine: Engine, batches: list[list[list[int]]], options: DecodingOptions) -> None:
    for batch in batches:
        engine.generate(batch, options)


def alignment_cost(bundle: Path, sentences: list[str], threads: int) -> dict[str, Any]:
    """Engine time (best of 3) with the alignment asked for and without (the step skips the
    aligner's nodes), batch 1 greedy over the first 100 sentences and batch 32 beam 4 over
    all."""
    engine = Engine.load(bundle, device="cpu", intra_op_threads=threads, max_batch_size=32)
    sources = engine.encode(sentences)
    result: dict[str, Any] = {}
    for label, batch, beam, part in (("b1_greedy", 1, 1, 100), ("b32_beam4", 32, 4, None)):
        chosen = sources[:part]
        batches = [chosen[i : i + batch] for i in range(0, len(chosen), batch)]
        seconds = {
            name: _best_of(
                3,
                partial(
                    _decode_all,
                    engine,
                    batches,
                    DecodingOptions(beam_size=beam, alignments=aligned),
                ),
            )
            for name, aligned in (("aligned", True), ("unaligned", False))
        }
        result[label] = {
            **{f"{n}_s": round(s, 3) for n, s in seconds.items()},
            "ratio": round(seconds["aligned"] / seconds["unaligned"], 3),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.markup_bench", description=__doc__)
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--requests", type=int, default=300, help="of each kind")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument(
        "--sentences",
        type=Path,
        default=MULTI30K / "test_2016_flickr.en.gz",
        help="for the alignment output's cost",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = {
        "http": http_latency(args.bundle, args.requests, args.threads),
        "markup": markup_work(args.bundle),
        "alignment_output": alignment_cost(args.bundle, read_lines(args.sentences), args.threads),
    }
    http = report["http"]
    print(
        f"HTTP, {args.requests} requests of each, one at a time: html p50 "
        f"{http['html']['p50_ms']} ms (p90 {http['html']['p90_ms']}), plain p50 "
        f"{http['plain']['p50_ms']} ms (p90 {http['plain']['p90_ms']}): html/plain "
        f"{http['ratio_p50']}x (with the alignment, which plain text skips)"
    )
    work = report["markup"]
    print(
        f"in process: parse {work['parse_ms']:.3f} ms, assemble + render "
        f"{work['assemble_and_render_ms']:.3f} ms, the model {work['model_ms']:.1f} ms"
    )
    for label, row in report["alignment_output"].items():
        print(
            f"engine {label}: aligned {row['aligned_s']} s, without the alignment "
            f"{row['unaligned_s']} s: {row['ratio']}x"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
