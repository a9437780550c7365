"""A transformer-base-size Marian model: this engine vs CTranslate2 vs transformers' generate vs
the uncached loop, on the same weights, in one run.

    python -m benchmarks.marian_bench [--work DIR] [--n 32] [--length 32] [--threads 2]
        [--intra-op-spinning] [--repeat 1] [--batch-sizes 1 32] [--beam-sizes 1 4] [--json FILE]

1. Builds a random Marian model of transformer-base size in transformers' format
   (benchmarks/marian_checkpoint.py): 6 + 6 layers, d_model 512, 8 heads, d_ff 2048, swish, a
   joint vocabulary of 32,000 tokens (SentencePiece models trained on Multi30k en and de,
   padded with filler tokens), max positions 512: an OPUS-MT model's shape, 74M parameters.
2. Imports it (model/importers/marian.py) and exports fp32 and int8 bundles (python -m export).
3. Runs benchmarks/engine_bench.py on the first N Multi30k test_2016_flickr sentences, every
   system decoding exactly --length tokens per sentence (min = max: random weights stop
   anywhere, so a free length would measure different work per system): engine-fp32/int8,
   ct2-fp32/int8 (CTranslate2's own TransformersConverter on the same weights), transformers
   (generate) and torch-uncached (model/search.py re-running the decoder on the whole prefix at
   every step, the loop this project started from). Each system runs in its own process; time
   is the median of --repeat passes (one by default: the uncached loop alone takes 3 minutes a
   pass on 2 idle cores, half an hour on loaded ones), memory the process's peak RSS.
4. Prints engine_bench's table, then the goals: engine / CTranslate2 in every cell (fp32 vs
   fp32, int8 vs int8; goal >= 1.0) and engine-fp32 / torch-uncached at beam 4 (goal >= 8).

--work keeps the model, bundles and CTranslate2 model (several hundred MB) for a second run;
without it they go to a temporary directory. The last stdout line is engine_bench's JSON
summary with the goal ratios added.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import engine_bench
from benchmarks.marian_checkpoint import BASE_VOCAB_SIZE, write_base
from export.onnx_export import export_bundle
from model.data import read_lines
from model.importers import marian
from service.inference.models import stale_reason

DATA = engine_bench.REPO.parent / "shared" / "data" / "multi30k"
SYSTEMS = ["engine-fp32", "engine-int8", "ct2-fp32", "ct2-int8", "transformers", "torch-uncached"]


def prepare(work: Path) -> tuple[Path, Path, Path, Path]:
    """(transformers dir, checkpoint, fp32 bundle, int8 bundle), built once into `work`."""
    hf, checkpoint = work / "hf-opus-mt-base", work / "opus-mt-base"
    bundles = work / "opus-mt-base-fp32", work / "opus-mt-base-int8"
    if not (hf / "config.json").is_file():
        write_base(hf, read_lines(DATA / "train.en.gz"), read_lines(DATA / "train.de.gz"))
    if not (checkpoint / "config.json").is_file():
        marian.import_checkpoint(hf, checkpoint)
    for bundle, dtype in zip(bundles, ("fp32", "int8"), strict=True):
        # Missing, of an older bundle format, or from other weights (the checkpoint exists
        # here, so stale_reason names each of these): exported (again).
        if stale_reason(checkpoint, bundle):
            export_bundle(checkpoint, bundle, dtype=dtype)  # type: ignore[arg-type]
    return hf, checkpoint, *bundles


def goals(summary: dict[str, Any]) -> dict[str, float]:
    """The issue's goal ratios from engine_bench's summary (tokens/s ratios)."""
    speed = engine_bench.tokens_per_s(summary)
    out = {}
    for (system, batch, beam), tokens_per_s in sorted(speed.items()):
        if system.startswith("engine-"):
            rival = speed.get(("ct2-" + system.removeprefix("engine-"), batch, beam))
            if rival:
                out[f"{system} / ct2 (batch {batch}, beam {beam})"] = tokens_per_s / rival
        if system == "engine-fp32" and beam > 1:
            uncached = speed.get(("torch-uncached", batch, beam))
            if uncached:
                out[f"engine-fp32 / uncached (batch {batch}, beam {beam})"] = (
                    tokens_per_s / uncached
                )
    return out


def bench_parser(
    prog: str, description: str, systems: list[str], beam_sizes: list[int]
) -> argparse.ArgumentParser:
    """The flags of a benchmark that builds a model and runs engine_bench on it (this one and
    benchmarks/nllb_bench.py)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--work", type=Path, help="keep the models here (default: a temp dir)")
    p.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.en.gz")
    p.add_argument("--n", type=int, default=32, help="sentences (default 32)")
    p.add_argument("--length", type=int, default=32, help="tokens per sentence (default 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--intra-op-spinning", action="store_true", help="the engine's step threads spin"
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--beam-sizes", type=int, nargs="+", default=beam_sizes)
    p.add_argument("--systems", nargs="+", choices=systems, default=systems)
    p.add_argument("--json", type=Path, help="also write the JSON summary here")
    return p


def run_bench(
    args: argparse.Namespace,
    prepare: Callable[[Path], tuple[Path, Path, Path, Path]],
    systems: list[str],
) -> dict[str, Any]:
    """Build the model into --work (or a temporary directory) with `prepare`, run engine_bench
    on it as `args` say, and return its summary (without the outputs)."""
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"building the model in {work} ...", file=sys.stderr, flush=True)
        hf, checkpoint, fp32, int8 = prepare(work)
        bench_args = engine_bench.parser("engine_bench", "", systems).parse_args(
            [
                "--checkpoint", str(checkpoint), "--hf-dir", str(hf),
                "--bundle-fp32", str(fp32), "--bundle-int8", str(int8),
                "--ct2-dir", str(work / "ct2"), "--src", str(args.src), "--n", str(args.n),
                "--length", str(args.length), "--threads", str(args.threads),
                "--repeat", str(args.repeat),
                "--batch-sizes", *map(str, args.batch_sizes),
                "--beam-sizes", *map(str, args.beam_sizes),
                "--systems", *args.systems,
                *(["--intra-op-spinning"] if args.intra_op_spinning else []),
            ]
        )  # fmt: skip
        return engine_bench.without_outputs(engine_bench.run(bench_args))


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("python -m benchmarks.marian_bench", __doc__.split("\n")[0], SYSTEMS, [1, 4])
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    summary = run_bench(args, prepare, SYSTEMS)
    ratios = goals(summary)
    print(
        f"\nmodel: transformer-base Marian, {BASE_VOCAB_SIZE} tokens, "
        f"{args.length} tokens a sentence"
    )
    for name, ratio in ratios.items():
        goal = 8.0 if "uncached" in name else 1.0
        print(f"{name}: {ratio:.2f}x ({'meets' if ratio >= goal else 'misses'} >= {goal:g}x)")
    engine_bench.emit({**summary, "goals": ratios}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
