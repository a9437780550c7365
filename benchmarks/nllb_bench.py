"""An NLLB-200-600M-shaped model: this engine vs CTranslate2 on the same weights, in one run.

    python -m benchmarks.nllb_bench [--work DIR] [--n 32] [--length 32] [--threads 2]
        [--repeat 1] [--batch-sizes 1 32] [--beam-sizes 4] [--json FILE] [--shortlist]

1. Builds a random model of NLLB-200-distilled-600M's shape in transformers' format
   (benchmarks/m2m100_checkpoint.py): 12 + 12 layers, d_model 1024, 16 heads, d_ff 4096, ReLU,
   a vocabulary of 256,206 tokens (a BPE learnt from Multi30k, filler tokens, the 202 language
   codes), max positions 1024: 615M parameters, 2.5 GB in fp32.
2. Imports it (model/importers/m2m100.py) and exports fp32 and int8 bundles (python -m export).
3. Runs benchmarks/engine_bench.py on the first N Multi30k test_2016_flickr sentences (as
   eng_Latn), every system decoding exactly --length tokens per sentence: engine-fp32/int8 and
   ct2-fp32/int8 (CTranslate2's own TransformersConverter on the same weights), each in its own
   process; time is the median of --repeat passes, memory the process's peak RSS. With a 256k
   vocabulary the output projection is most of a step (1024 x 256,206 multiply-adds a row).
4. Prints engine_bench's table, then engine / CTranslate2 in every cell (fp32 vs fp32, int8 vs
   int8; goal >= 1.0).
5. With --shortlist (and --work), also bundles with a vocabulary shortlist counted on
   Multi30k's English-German training data (`python -m export --shortlist`, the default sizes
   of export/shortlist.py), and the engine systems again on those: their speed against
   CTranslate2 and against the engine without one. (The model is random, so its translations
   say nothing; the shortlist's effect on quality is measured on a trained model:
   benchmarks/RESULTS.md.)

--work keeps the model, bundles and CTranslate2 model (about 9 GB) for a second run; without it
they go to a temporary directory. The last stdout line is engine_bench's JSON summary with the
goal ratios added. Needs the bench extra (ctranslate2) and about 12 GB of memory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks import engine_bench
from benchmarks.m2m100_checkpoint import write_checkpoint
from benchmarks.marian_bench import bench_parser, goals, run_bench
from export.onnx_export import export_bundle
from model.data import read_lines
from model.importers import m2m100
from service.inference.models import stale_reason

DATA = engine_bench.REPO.parent / "shared" / "data" / "multi30k"
NLLB_600M = dict(d_model=1024, heads=16, d_ff=4096, layers=12, max_positions=1024)
VOCAB_SIZE = 256_206
SYSTEMS = ["engine-fp32", "engine-int8", "ct2-fp32", "ct2-int8"]
SHORTLIST_CORPUS = (DATA / "train.en.gz", DATA / "train.de.gz")


def prepare(
    work: Path, shape: dict[str, int], vocab_size: int, shortlist: bool = False
) -> tuple[Path, Path, Path, Path]:
    """(transformers dir, checkpoint, fp32 bundle, int8 bundle), built once into `work`; with
    `shortlist`, the bundles with a vocabulary shortlist."""
    hf, checkpoint = work / "hf-nllb", work / "nllb"
    suffix = "-shortlist" if shortlist else ""
    bundles = work / f"nllb-fp32{suffix}", work / f"nllb-int8{suffix}"
    if not (hf / "config.json").is_file():
        lines = [*read_lines(DATA / "train.en.gz"), *read_lines(DATA / "train.de.gz")]
        write_checkpoint(
            hf, lines, family="nllb", tokenizer_vocab_size=8000, vocab_size=vocab_size, **shape
        )
    if not (checkpoint / "config.json").is_file():
        m2m100.import_checkpoint(hf, checkpoint)
    for bundle, dtype in zip(bundles, ("fp32", "int8"), strict=True):
        if stale_reason(checkpoint, bundle):
            corpus = SHORTLIST_CORPUS if shortlist else None
            export_bundle(
                checkpoint, bundle, dtype=dtype, shortlist=corpus, shortlist_target="deu_Latn"
            )  # type: ignore[arg-type]
    return hf, checkpoint, *bundles


def shortlist_goals(summary: dict[str, Any], shortlisted: dict[str, Any]) -> dict[str, float]:
    """The shortlist's engine systems against CTranslate2 and against the engine without one."""
    speed, fast = engine_bench.tokens_per_s(summary), engine_bench.tokens_per_s(shortlisted)
    out = {}
    for (system, batch, beam), tokens_per_s in sorted(fast.items()):
        cell = f"(batch {batch}, beam {beam})"
        for rival in ("ct2-" + system.removeprefix("engine-"), system):
            if (rival, batch, beam) in speed:
                out[f"{system}+shortlist / {rival} {cell}"] = (
                    tokens_per_s / speed[rival, batch, beam]
                )
    return out


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("python -m benchmarks.nllb_bench", __doc__.split("\n")[0], SYSTEMS, [4])
    # A smaller model of the same kind, for a quick run or a test: "d_model,layers,vocab".
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument(
        "--shortlist", action="store_true", help="also the engine with a vocabulary shortlist"
    )
    args = p.parse_args(argv)
    if args.shortlist and not args.work:
        p.error("--shortlist needs --work (its run reuses the model of the first)")
    shape, vocab_size = dict(NLLB_600M), VOCAB_SIZE
    if args.shape:
        d_model, layers, vocab_size = map(int, args.shape.split(","))
        shape.update(d_model=d_model, d_ff=4 * d_model, heads=4, layers=layers)
    summary = run_bench(args, lambda work: prepare(work, shape, vocab_size), SYSTEMS)
    ratios = goals(summary)
    if args.shortlist:
        engines = [s for s in args.systems if s.startswith("engine-")]
        shortlisted = run_bench(
            argparse.Namespace(**{**vars(args), "systems": engines}),
            lambda work: prepare(work, shape, vocab_size, shortlist=True),
            engines,
        )
        summary["shortlist"] = shortlisted["results"]
        ratios.update(shortlist_goals(summary, shortlisted))
    print(f"\nmodel: NLLB-200-600M-shaped, {vocab_size} tokens, {args.length} tokens a sentence")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x ({'meets' if ratio >= 1.0 else 'misses'} >= 1x)")
    engine_bench.emit({**summary, "goals": ratios}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
