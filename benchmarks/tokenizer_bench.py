"""Marian tokenization: the `sentencepiece` package (what the service runs) against a `tokenizers`
file converted from the same .spm model, both held to transformers' MarianTokenizer: equality,
then speed. The evidence behind service/bundle/tokenizer.py's choice.

    python -m benchmarks.tokenizer_bench [--dir MARIAN_DIR] [--random-texts 20000]

MARIAN_DIR is a Marian checkpoint in transformers' format (e.g. a downloaded opus-mt-en-de);
without it, one is built with SentencePiece models trained on Multi30k en and de
(benchmarks/marian_checkpoint.py). Source ids are compared as whole lists, </s> included:
- every line of the Multi30k en, de and fr files (train, val, test_2016_flickr);
- every Unicode code point c (surrogates excepted) alone and in "a c", "ac" and "cca x";
- --random-texts texts of random length mixing ASCII words, whitespace and control characters
  and random code points (fixed seed).
Texts that spell a special token or start with a language code (">>fr<<") are left out:
MarianTokenizer turns those into tokens, which the service deliberately does not
(service/bundle/tokenizer.py). The conversion is transformers' own SpmConverter (Unigram model,
Precompiled normaliser, Metaspace); its pieces map to ids through vocab.json as MarianTokenizer
maps SentencePiece's. MarianTokenizer is run on the texts where the two differ and on a sample.

Speed: sentences per second encoding the Multi30k English training file (29,000 lines) to ids,
one thread, best of 3: MarianTokenizer, the service's SentencePieceTokenizer, and the converted
file (one encode_batch call; one call per line).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.marian_checkpoint import write_checkpoint
from benchmarks.paths import MULTI30K
from model.data import read_lines
from service.bundle.manifest import SentencePieceFiles, SpecialIds
from service.bundle.tokenizer import SentencePieceTokenizer

SPECIAL = ("</s>", "<unk>", "<pad>")
Encode = Callable[[Sequence[str]], list[list[int]]]


def _tokenizers(directory: Path) -> tuple[Encode, Encode, Encode, Encode]:
    """(MarianTokenizer, the service's tokenizer, the converted file batched, one per call)."""
    from tokenizers import Tokenizer
    from transformers import MarianTokenizer
    from transformers.convert_slow_tokenizer import SpmConverter

    marian = MarianTokenizer.from_pretrained(directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    unk, eos = vocab["<unk>"], vocab["</s>"]
    files = SentencePieceFiles(
        source_model="source.spm",
        target_model="target.spm",
        source_vocab="vocab.json",
        target_vocab="vocab.json",
        special_tokens=list(SPECIAL),
    )
    service = SentencePieceTokenizer(
        directory,
        files,
        SpecialIds(pad=vocab["<pad>"], bos=vocab["<pad>"], eos=eos, unk=unk),
        (len(vocab), len(vocab)),
    )

    class _Original:  # what SpmConverter reads of a slow tokenizer
        vocab_file = str(directory / "source.spm")

    converted: Tokenizer = SpmConverter(_Original()).converted()
    converted.encode_special_tokens = True

    def ids(tokens: Sequence[str]) -> list[int]:
        return [*(vocab.get(t, unk) for t in tokens), eos] if tokens else []

    def marian_ids(texts: Sequence[str]) -> list[list[int]]:
        return [i if len(i) > 1 else [] for i in marian(list(texts))["input_ids"]]

    def batched(texts: Sequence[str]) -> list[list[int]]:
        encodings = converted.encode_batch(list(texts), add_special_tokens=False)
        return [ids(e.tokens) for e in encodings]

    def one_by_one(texts: Sequence[str]) -> list[list[int]]:
        return [ids(converted.encode(t, add_special_tokens=False).tokens) for t in texts]

    return marian_ids, service.encode, batched, one_by_one


def _code_point_texts() -> list[str]:
    points = [chr(i) for i in range(0x110000) if not 0xD800 <= i <= 0xDFFF]
    return [text for c in points for text in (c, f"a {c}", f"a{c}", f"{c}{c}a x")]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    odd = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u200b", "\x85", "\u2028", "\x00", "\x7f"]
    words = ["A", "man", "in", "a", "blue", "shirt", ".", ",", "Straße", "ﬁne", "①", "É"]

    def piece() -> str:
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(words)
        if kind < 0.7:
            return rng.choice(odd)
        return chr(rng.choice([rng.randrange(0x20, 0x3000), rng.randrange(0xE000, 0x110000)]))

    return ["".join(piece() for _ in range(rng.randrange(0, 12))) for _ in range(n)]


def _kept(texts: Sequence[str]) -> list[str]:
    return [t for t in texts if not any(s in t for s in SPECIAL) and not t.startswith(">>")]


def _speed(encode: Encode, lines: Sequence[str]) -> float:
    best = min(_timed(encode, lines) for _ in range(3))
    return len(lines) / best


def _timed(encode: Encode, lines: Sequence[str]) -> float:
    start = time.perf_counter()
    encode(lines)
    return time.perf_counter() - start


def run(directory: Path, random_texts: int) -> dict[str, Any]:
    marian, service, converted, one_by_one = _tokenizers(directory)
    equality: dict[str, dict[str, int]] = {}
    corpora = {
        "multi30k": [
            line
            for language in ("en", "de", "fr")
            for split in ("train", "val", "test_2016_flickr")
            for line in read_lines(MULTI30K / f"{split}.{language}.gz")
        ],
        "code points": _code_point_texts(),
        "random texts": _random_texts(random_texts),
    }
    examples: dict[str, list[str]] = {}
    for name, texts in corpora.items():
        texts = _kept(texts)
        ours, theirs = service(texts), converted(texts)
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
        # MarianTokenizer on every Multi30k line, else on the differences and a sample.
        rng = random.Random(1)
        checked = (
            list(range(len(texts)))
            if name == "multi30k"
            else sorted({*differ, *rng.sample(range(len(texts)), min(20000, len(texts)))})
        )
        reference = dict(zip(checked, marian([texts[i] for i in checked]), strict=True))
        equality[name] = {
            "texts": len(texts),
            "service != converted": len(differ),
            "MarianTokenizer run on": len(checked),
            "service != MarianTokenizer": sum(ours[i] != r for i, r in reference.items()),
            "converted != MarianTokenizer": sum(theirs[i] != r for i, r in reference.items()),
        }
        examples[name] = [repr(texts[i]) for i in differ[:5]]
    lines = read_lines(MULTI30K / "train.en.gz")
    speed = {
        "MarianTokenizer": _speed(marian, lines),
        "service (sentencepiece)": _speed(service, lines),
        "converted tokenizers, encode_batch": _speed(converted, lines),
        "converted tokenizers, one call a line": _speed(one_by_one, lines),
    }
    return {"equality": equality, "differences": examples, "sentences_per_second": speed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tokenizer_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dir", type=Path, help="a Marian checkpoint (default: build one)")
    p.add_argument("--random-texts", type=int, default=20000)
    args = p.parse_args(argv)
    # One thread for tokenizers' encode_batch too (read when its pool starts): the service
    # tokenizes a request on one thread.
    os.environ["RAYON_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="tokenizer_bench_") as tmp:
        directory = args.dir or write_checkpoint(
            Path(tmp) / "marian",
            read_lines(MULTI30K / "train.en.gz")[:3000],
            read_lines(MULTI30K / "train.de.gz")[:3000],
        )
        result = run(directory, args.random_texts)
    for name, counts in result["equality"].items():
        print(f"{name}: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
        if result["differences"][name]:
            print(f"  e.g. {', '.join(result['differences'][name])}")
    for name, value in result["sentences_per_second"].items():
        print(f"{name}: {value:,.0f} sentences/s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
