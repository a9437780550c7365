"""Translate a test set with a trained checkpoint in torch and score it.

    python -m model.evaluate --checkpoint DIR --src F --ref F [--beam-size 5]
        [--length-penalty A] [--batch-size N] [--hyp-out FILE] [--decoder cached|uncached]

The last stdout line is one JSON object: bleu (sacreBLEU, cased, 13a, detokenized), bleu_lc_tok
(lowercased and Moses-tokenized on both sides, then BLEU with tokenize=none: the convention of
the Multi30k literature), chrf, n_sentences, seconds, and the decoding settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from sacremoses import MosesTokenizer
from tokenizers import Tokenizer

from model.data import DataError, read_parallel
from model.search import generate
from model.tokenizer import load_tokenizer
from model.transformer import CONFIG_FILE, EOS_ID, Transformer, load_model
from service.bundle.decoding import Hypothesis


def lc_tok(lines: Sequence[str], language: str) -> list[str]:
    tokenizer = MosesTokenizer(lang=language or "en")
    return [tokenizer.tokenize(line.lower(), return_str=True, escape=False) for line in lines]


def score_translations(hyps: Sequence[str], refs: Sequence[str], language: str) -> dict[str, float]:
    """BLEU (cased, 13a), BLEU on lowercased Moses-tokenized text, and chrF."""
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)])
    bleu_lc_tok = sacrebleu.corpus_bleu(
        lc_tok(hyps, language), [lc_tok(refs, language)], tokenize="none", force=True
    )
    chrf = sacrebleu.corpus_chrf(list(hyps), [list(refs)])
    return {"bleu": bleu.score, "bleu_lc_tok": bleu_lc_tok.score, "chrf": chrf.score}


def translate(
    model: Transformer, tokenizer: Tokenizer, lines: Sequence[str], **options: Any
) -> tuple[list[str], list[list[Hypothesis]]]:
    """Translate text lines with `generate` (options as its keywords); texts and n-best lists.

    Every line is checked against the model's limit first: too long is an error naming the line,
    never a silent truncation.
    """
    sources = [[*e.ids, EOS_ID] if e.ids else [] for e in tokenizer.encode_batch(list(lines))]
    limit = model.config.max_positions
    for number, source in enumerate(sources, start=1):
        if len(source) > limit:
            raise ValueError(
                f"line {number} has {len(source)} tokens; the model's limit is {limit}"
            )
    nbest = generate(model, sources, **options)
    return tokenizer.decode_batch([h[0].ids for h in nbest]), nbest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.evaluate", description=__doc__.split("\n")[1])
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--max-decoding-length", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hyp-out", type=Path)
    p.add_argument("--decoder", choices=["cached", "uncached"], default="cached")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.beam_size < 1 or args.batch_size < 1:
        print("error: --beam-size and --batch-size must be >= 1", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = load_model(args.checkpoint, args.device)
        tokenizer = load_tokenizer(args.checkpoint)
        src, ref = read_parallel(args.src, args.ref)
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    language = json.loads((args.checkpoint / CONFIG_FILE).read_text()).get("target_language", "")

    start = time.perf_counter()
    try:
        hyps, nbest = translate(
            model,
            tokenizer,
            src,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            max_decoding_length=args.max_decoding_length,
            batch_size=args.batch_size,
            decoder=args.decoder,
        )
    except ValueError as e:
        print(f"error: {args.src}: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    if args.hyp_out:
        args.hyp_out.write_text("".join(h + "\n" for h in hyps))
    result = {
        **score_translations(hyps, ref, language),
        "n_sentences": len(src),
        "seconds": round(seconds, 3),
        "target_tokens": sum(len(h[0].ids) + 1 for h in nbest),
        "beam_size": args.beam_size,
        "length_penalty": args.length_penalty,
        "decoder": args.decoder,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
