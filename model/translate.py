"""Translate stdin to stdout, one line per line, with a checkpoint and the torch decoder.

    python -m model.translate --checkpoint DIR [--beam-size 5] [--length-penalty A] < in > out

The reference path for trying a checkpoint; the production path is the ONNX service.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.evaluate import translate
from model.tokenizer import load_tokenizer
from model.transformer import load_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m model.translate", description=__doc__.split("\n")[1]
    )
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    try:
        model, tokenizer = load_model(args.checkpoint), load_tokenizer(args.checkpoint)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = sys.stdin.read()
    # Lines end at "\n" only, as in service.translate: one output line per input line.
    lines = text.removesuffix("\n").split("\n") if text else []
    try:
        texts, _ = translate(
            model,
            tokenizer,
            lines,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            batch_size=args.batch_size,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(t + "\n" for t in texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
