"""Training on a corpus larger than memory: generate a parallel corpus of `--lines` pairs
(Multi30k's training pairs drawn at random, each with a random number in it, so no two lines
repeat), then train on it with `--stream-buffer` for `--updates` updates in a subprocess and
report its peak RSS and the training tokens/s from its metrics.

    python -m benchmarks.stream_bench [--lines 5000000] [--updates 200] [--stream-buffer 20000]
        [--in-memory] [--json OUT]

`--in-memory` also trains without streaming, for the comparison (it reads the whole corpus).
The goal: peak RSS <= 1.5 GiB streamed at 5 million lines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.paths import MULTI30K, REPO


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stream_bench", description=__doc__)
    p.add_argument("--lines", type=int, default=5_000_000)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--stream-buffer", type=int, default=20_000)
    p.add_argument("--in-memory", action="store_true", help="also train reading it whole")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    results: dict[str, Any] = {"lines": args.lines, "updates": args.updates}
    with tempfile.TemporaryDirectory(prefix="mt-stream-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        src, tgt = generate(root, args.lines)
        results["generate_s"] = round(time.perf_counter() - start, 1)
        runs = [("streamed", ["--stream-buffer", str(args.stream_buffer)])]
        if args.in_memory:
            runs.append(("in memory", []))
        for name, flags in runs:
            results[name] = train(root / name.replace(" ", "_"), src, tgt, args.updates, flags)
            run = results[name]
            print(
                f"{name}: peak RSS {run['peak_rss_mib']:.0f} MiB, {run['tokens_per_s']:.0f} "
                f"target tokens/s, {run['seconds']:.0f} s in all ({args.lines:,} lines)"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def generate(root: Path, lines: int) -> tuple[Path, Path]:
    """`lines` pairs drawn from Multi30k's training pairs, each with its own number, and
    200 validation pairs (validation is not what is measured)."""
    english, german = (_read(MULTI30K / f"train.{lang}.gz") for lang in ("en", "de"))
    for lang in ("en", "de"):
        valid = _read(MULTI30K / f"val.{lang}.gz")[:200]
        (root / f"valid.{lang}").write_text("".join(line + "\n" for line in valid))
    rng = random.Random(0)
    src, tgt = root / "train.en.gz", root / "train.de.gz"
    with (
        gzip.open(src, "wt", encoding="utf-8", compresslevel=1) as s,
        gzip.open(tgt, "wt", encoding="utf-8", compresslevel=1) as t,
    ):
        for _ in range(lines):
            i, n = rng.randrange(len(english)), rng.randrange(1000)
            s.write(f"{english[i]} {n}\n")
            t.write(f"{german[i]} {n}\n")
    return src, tgt


def _read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def train(out: Path, src: Path, tgt: Path, updates: int, flags: list[str]) -> dict[str, float]:
    """`python -m model.train` on the corpus (tiny preset, 2 threads); its peak RSS (this
    process's children's maximum: run one at a time) and its mean training tokens/s."""
    command = [
        sys.executable, "-m", "model.train", "--src-train", str(src), "--tgt-train", str(tgt),
        "--src-valid", str(src.parent / "valid.en"), "--tgt-valid", str(src.parent / "valid.de"),
        "--out", str(out), "--max-updates", str(updates), "--valid-every", str(updates),
        "--save-every", str(updates), "--log-every", "50", "--valid-bleu-sentences", "20",
        "--threads", "2", *flags,
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speeds = [row["tokens_per_s"] for row in rows if row["split"] == "train"]
    return {
        "peak_rss_mib": peak_kib / 1024,
        "tokens_per_s": sum(speeds) / len(speeds),
        "seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
