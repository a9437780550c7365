"""The decoder-step graph alone: one intra-op thread against several, by rows, and what its
parts cost at one row; the measurements behind step_state.NARROW_STEP_MACS.

    python -m benchmarks.step_threads --bundle bundles/multi30k-en-de [--threads 2]
        [--intra-op-spinning] [--rows 1 8 16 32 64 128 256] [--beam-size 4]
        [--positions 32] [--source 12] [--runs 3000] [--json FILE]

Method: two ONNX Runtime sessions of the bundle's decoder_step.onnx, with the engine's session
options, one on one intra-op thread and one on --threads (sleeping between kernels, or spinning
with --intra-op-spinning, as the service's step threads do in a process of one model), run on
the same made-up inputs (every id 5, a cache of --positions random positions, --source source
positions, top 1 candidate) for
each row count: greedy rows (one per sentence) up to 32 rows, --beam-size rows per sentence
above. Wall clock of `InferenceSession.run` (the engine binds its buffers instead; the same
kernels), median of five blocks of runs after a warm-up; steps of plain text (the alignment
not asked for: `alignment_wanted` false). Then, at one row on one thread, the step with its
alignment, without it, and with the output projection cut to 64 ids as well (the embedding's
first 64 columns): what is left is the layers' share. The last stdout line is a
JSON object with every measurement (--json also writes it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from service.bundle.manifest import (
    ALIGNMENT_WANTED,
    CACHE_INDIRECTION,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    SELF_ATTENTION_MASK,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    load_bundle,
)
from service.inference import engine as engine_module

OUTPUTS = [TOP_LOG_PROBS, TOP_IDS]


def feeds(model: onnx.ModelProto, sentences: int, beams: int, positions: int, source: int,
          heads: int, d_head: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Inputs for one step of `sentences` x `beams` rows at position `positions` - 1."""
    rng = np.random.default_rng(0)
    rows, t = sentences * beams, positions - 1
    made: dict[str, np.ndarray] = {
        INPUT_IDS: np.full((sentences, beams), 5, np.int64),
        POSITION: np.full(rows, t, np.int64),
        ENCODER_ATTENTION_MASK: np.ones((sentences, source), np.int32),
        SELF_ATTENTION_MASK: np.ones((rows, t + 1), np.int32),
        PAST_SEQUENCE_LENGTH: np.array([t], np.int32),
        CACHE_INDIRECTION: np.zeros((sentences, beams, positions), np.int32),
        TOP_K: np.array([1], np.int64),
    }
    for graph_input in model.graph.input:
        name = graph_input.name
        if name in made:
            continue
        if name == ALIGNMENT_WANTED:
            made[name] = np.array([False])  # a plain-text step's
            continue
        if name.startswith("past_"):
            made[name] = rng.random((rows, heads, positions, d_head), np.float32)
        elif name.startswith("cross_"):
            made[name] = rng.random((sentences, heads, source, d_head), np.float32)
        else:
            raise SystemExit(f"{name}: an input this benchmark cannot make (a shortlist bundle?)")
    return made


def timed(session: ort.InferenceSession, inputs: dict[str, np.ndarray], runs: int) -> float:
    """Microseconds a run: the median of five blocks of runs / 5, after runs / 10 warm-up."""
    for _ in range(max(1, runs // 10)):
        session.run(OUTPUTS, inputs)
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(max(1, runs // 5)):
            session.run(OUTPUTS, inputs)
        blocks.append((time.perf_counter() - start) / max(1, runs // 5) * 1e6)
    return statistics.median(blocks)


def session(
    model: onnx.ModelProto | Path, threads: int, spinning: bool = False
) -> ort.InferenceSession:
    options = engine_module._session_options(threads, spinning)
    options.log_severity_level = 3  # a cut graph's log_probs is narrower than it declares
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=[engine_module.CPU_PROVIDER])


def parts(model: onnx.ModelProto, inputs: dict[str, np.ndarray], runs: int) -> dict[str, float]:
    """One row on one thread: the whole step (its alignment asked for), without its alignment
    nodes (a plain-text step: `alignment_wanted` false), and with the output projection cut to
    64 ids as well."""
    one = session(model, 1)
    result = {"whole": timed(one, {**inputs, ALIGNMENT_WANTED: np.array([True])}, runs)}
    if ALIGNMENT_WANTED in inputs:
        result["without alignment"] = timed(one, inputs, runs)
    for index, initializer in enumerate(model.graph.initializer):
        if initializer.name == "embedding_t":  # (d_model, V): the projection's
            cut = numpy_helper.to_array(initializer)[:, :64].copy()
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(cut, "embedding_t"))
            result["and projection to 64 ids"] = timed(session(model, 1), inputs, runs)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_threads", description=__doc__)
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2, help="the wide session's (default 2)")
    p.add_argument("--intra-op-spinning", action="store_true", help="the wide session's spin")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256])
    p.add_argument("--beam-size", type=int, default=4, help="rows per sentence past 32 rows")
    p.add_argument("--positions", type=int, default=32, help="cached positions (default 32)")
    p.add_argument("--source", type=int, default=12, help="source positions (default 12)")
    p.add_argument("--runs", type=int, default=3000, help="runs at one row (fewer at more)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    manifest = load_bundle(args.bundle).manifest
    dims = manifest.model
    path = args.bundle / manifest.decoder_step.file
    model = onnx.load(str(path))
    one, wide = session(path, 1), session(path, args.threads, args.intra_op_spinning)
    spins = ", spinning" if args.intra_op_spinning else ""
    print(f"{path}, threads 1 against {args.threads}{spins}, microseconds a step")
    print(f"| rows | 1 thread | {args.threads} threads | 1 thread's speed-up |")
    print("|---|---|---|---|")
    by_rows: dict[int, dict[str, float]] = {}
    for rows in args.rows:
        beams = 1 if rows <= 32 else args.beam_size
        inputs = feeds(model, max(1, rows // beams), beams, args.positions, args.source,
                       dims.heads, dims.d_head)  # fmt: skip
        runs = max(50, args.runs // rows)
        single, several = timed(one, inputs, runs), timed(wide, inputs, runs)
        by_rows[rows] = {"one": single, "wide": several}
        print(f"| {rows} | {single:,.1f} | {several:,.1f} | {several / single:.2f}x |")
    inputs = feeds(model, 1, 1, args.positions, args.source, dims.heads, dims.d_head)
    at_one_row = parts(model, inputs, args.runs)
    print("\none row, one thread: " + ", ".join(f"{k} {v:,.1f}" for k, v in at_one_row.items()))
    summary: dict[str, Any] = {
        "threads": args.threads,
        "spinning": args.intra_op_spinning,
        "rows": by_rows,
        "parts": at_one_row,
    }
    line = json.dumps(summary)
    print(line)
    if args.json:
        args.json.write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
