"""One decoder step of a bundle, timed for several layouts of the same rows.

    python -m benchmarks.step_bench --bundle BUNDLE [--rows 128] [--groups 4 1] [--past 10]
        [--source 14] [--threads 2] [--repeat 30] [--runs 10]

A layout is G rows per sentence: rows / G sentences, each with one row of cross keys/values and
encoder mask, which its G rows (its beams) attend over. G = 1 is how beam search ran before
bundle format 3, with a copy of the sentence's cross keys/values per beam; G = beam size is how
the engine runs it now. Every layout gets the same rows (tokens, past) and, per row, the same
cross keys/values and mask (layouts with a smaller G repeat each sentence's), so the step's
outputs must agree; that is checked before anything is timed. Each G must divide the largest G,
which must divide --rows.

The session is opened with the engine's options (`service.engine.session_options`). The
layouts take turns, --runs steps each per turn, --repeat turns, so the machine's drift falls on
all of them alike; each layout's time per step is the median over its turns, and its ratio is
to the first layout's median. The last stdout line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.bundle import (
    CACHE_INDEX,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    BundleError,
    Manifest,
    cross_names,
    load_bundle,
    past_names,
    present_names,
)
from service.engine import session_options

TOLERANCE = 1e-5  # max abs difference of any timed output between two layouts
_TOP_K = 8  # candidates per row, as beam search at beam 4 asks for


def _feeds(manifest: Manifest, rows: int, groups: list[int], past: int, source: int) -> list[Any]:
    """Feeds per layout: the same rows, the cross keys/values of rows / max(groups) sentences
    repeated to each layout's sentence count."""
    dims, n = manifest.model, manifest.model.decoder_layers
    rng = np.random.default_rng(0)
    dtype = np.dtype(manifest.decoder_step.tensor(past_names(n)[0]).dtype)
    common = {
        INPUT_IDS: rng.integers(4, dims.vocab_size, (rows, 1)),  # (B, 1)
        CACHE_INDEX: np.arange(rows, dtype=np.int64),
        TOP_K: np.array([_TOP_K], dtype=np.int64),
        **{
            name: rng.normal(size=(rows, dims.heads, past, dims.d_head)).astype(dtype)
            for name in past_names(n)
        },
    }
    base = rows // max(groups)
    mask = np.ones((base, source), dtype=np.int64)  # (N, S)
    mask[-1, source // 2 :] = 0  # one padded sentence
    cross = {
        name: rng.normal(size=(base, dims.heads, source, dims.d_head)).astype(dtype)
        for name in cross_names(n)
    }
    per_sentence = {ENCODER_ATTENTION_MASK: mask, **cross}
    return [
        {
            **common,
            **{
                name: np.repeat(t, max(groups) // group, axis=0) for name, t in per_sentence.items()
            },
        }
        for group in groups
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.step_bench",
        description="Time one decoder step for several rows-per-sentence layouts.",
    )
    p.add_argument("--bundle", required=True, type=Path)
    p.add_argument("--rows", type=int, default=128, help="rows per step (default 128)")
    p.add_argument(
        "--groups", type=int, nargs="+", default=[4, 1], help="rows per sentence (default 4 1)"
    )
    p.add_argument("--past", type=int, default=10, help="cached positions (default 10)")
    p.add_argument("--source", type=int, default=14, help="source length (default 14)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=30, help="turns per layout (default 30)")
    p.add_argument("--runs", type=int, default=10, help="steps per turn (default 10)")
    args = p.parse_args(argv)
    largest = max(args.groups)
    if min(args.groups) < 1 or any(largest % g for g in args.groups) or args.rows % largest:
        print(
            f"error: every group must divide {largest} (the largest), which must divide "
            f"--rows {args.rows}; got --groups {' '.join(map(str, args.groups))}",
            file=sys.stderr,
        )
        return 2
    try:
        bundle = load_bundle(args.bundle)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    manifest = bundle.manifest
    session = ort.InferenceSession(
        str(bundle.path(manifest.decoder_step.file)),
        session_options(args.threads, spinning=False),
        providers=["CPUExecutionProvider"],
    )
    outputs = [TOP_LOG_PROBS, TOP_IDS, *present_names(manifest.model.decoder_layers)]
    layouts = _feeds(manifest, args.rows, args.groups, args.past, args.source)

    results = [session.run(outputs, feeds) for feeds in layouts]
    max_diff = max(
        (
            float(np.abs(a.astype(np.float64) - b).max())
            for other in results[1:]
            for a, b in zip(results[0], other, strict=True)
        ),
        default=0.0,
    )
    if not max_diff <= TOLERANCE:
        print(f"error: the layouts' outputs differ by {max_diff:.3g}", file=sys.stderr)
        return 1

    times: list[list[float]] = [[] for _ in layouts]
    for _ in range(args.repeat):
        for feeds, per_step in zip(layouts, times, strict=True):
            start = time.perf_counter()
            for _ in range(args.runs):
                session.run(outputs, feeds)
            per_step.append((time.perf_counter() - start) / args.runs * 1e3)
    medians = [statistics.median(t) for t in times]
    print(
        f"{args.rows} rows, past {args.past}, source {args.source}, {args.threads} threads, "
        f"{manifest.dtype}; outputs agree within {max_diff:.2g}"
    )
    print("| rows per sentence | sentences | ms per step (median) | min | × first |")
    print("|---|---|---|---|---|")
    report = []
    for group, median, per_step in zip(args.groups, medians, times, strict=True):
        ratio = median / medians[0]
        print(
            f"| {group} | {args.rows // group} | {median:.3f} | {min(per_step):.3f} | {ratio:.2f} |"
        )
        report.append(
            {"group": group, "median_ms": median, "min_ms": min(per_step), "ratio": ratio}
        )
    print(
        json.dumps({"rows": args.rows, "past": args.past, "max_diff": max_diff, "layouts": report})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
