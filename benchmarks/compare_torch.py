"""The serving engine against the torch reference, sentence by sentence, on a whole file.

    python -m benchmarks.compare_torch --checkpoint checkpoints/multi30k-en-de --bundle BUNDLE \\
        [--src ../shared/data/multi30k/val.en.gz] [--n N] [--beam-sizes 1 4] \\
        [--batch-size 32] [--threads 2]

For an fp32 bundle exported from the checkpoint, `Engine.generate` (ONNX Runtime + the numpy search
of service/inference/search.py) must give model.search.generate's tokens for every sentence and its
scores within 1e-4. The tests check this on a tiny random model; this is the same check on a real
one. Both sides get the same id sequences (the engine's tokenizer; lines over the model's input
limit are left out) and the same batches. Mismatches are listed with both texts; the last stdout
line is a JSON summary; the exit status is 1 when anything differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.paths import MULTI30K
from model.data import read_lines
from model.search import generate
from model.transformer import WEIGHTS_FILE, load_model
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import sha256_file
from service.inference.engine import Engine

SCORE_TOLERANCE = 1e-4
_MAX_EXAMPLES = 5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare_torch",
        description="Engine vs torch reference, token for token, on a file.",
    )
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--bundle", required=True, type=Path, help="an fp32 bundle of the checkpoint")
    p.add_argument("--src", type=Path, default=MULTI30K / "val.en.gz")
    p.add_argument("--n", type=int, default=None, help="first N lines (default: all)")
    p.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime threads")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    model = load_model(args.checkpoint)
    engine = Engine.load(
        args.bundle, device="cpu", intra_op_threads=args.threads, max_batch_size=args.batch_size
    )
    problems = []
    if engine.manifest.dtype != "fp32":
        problems.append(f"{args.bundle} is {engine.manifest.dtype}: only fp32 is token-exact")
    if sha256_file(args.checkpoint / WEIGHTS_FILE) != engine.manifest.provenance.checkpoint_sha256:
        problems.append(f"{args.bundle} was exported from other weights than {args.checkpoint}")

    lines = read_lines(args.src)[: args.n]
    sources = [s for s in engine.encode(lines) if s and len(s) <= engine.max_input_tokens]
    summary: dict[str, object] = {"src": str(args.src), "sentences": len(sources)}
    for beam in args.beam_sizes:
        expected = generate(model, sources, beam_size=beam, batch_size=args.batch_size)
        options = DecodingOptions(beam_size=beam, max_decoding_length=engine.max_input_tokens)
        ours = engine.generate(sources, options)
        differ = [
            i
            for i, (e, o) in enumerate(zip(expected, ours, strict=True))
            if (e[0].ids, e[0].finish_reason) != (o[0].ids, o[0].finish_reason)
        ]
        score_diff = max(
            (abs(e[0].score - o[0].score) for e, o in zip(expected, ours, strict=True)),
            default=0.0,
        )
        summary[f"beam{beam}"] = {"differ": len(differ), "max_score_diff": score_diff}
        print(f"beam {beam}: {len(sources) - len(differ)}/{len(sources)} equal, "
              f"max score difference {score_diff:.2e}")  # fmt: skip
        for i in differ[:_MAX_EXAMPLES]:
            print(f"  sentence {i}:\n    torch  {engine.decode(expected[i][0].ids)}\n"
                  f"    engine {engine.decode(ours[i][0].ids)}")  # fmt: skip
        if differ:
            problems.append(f"beam {beam}: {len(differ)} of {len(sources)} sentences differ")
        if not score_diff <= SCORE_TOLERANCE:
            problems.append(f"beam {beam}: scores differ by up to {score_diff:.2e}")
    summary["problems"] = problems
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
