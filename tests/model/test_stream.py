"""Training on a corpus streamed from its files (--stream-buffer): every usable pair once per
epoch in batches within the token budget, no more than a buffer's worth read ahead, the order
fixed by (seed, epoch), and a streamed run that stops and resumes ends where it would have."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from model.data import DataError, encode_pairs, read_lines, stream_batches, stream_pairs
from model.tokenizer import train_tokenizer
from tests.conftest import REPO, TINY_TEST_CONFIG


def write(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


@pytest.fixture(scope="module")
def corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("stream_corpus")
    src, tgt = (
        read_lines(multi30k / "train.en.gz")[:2500],
        read_lines(multi30k / "train.de.gz")[:2500],
    )
    src[7] = ""  # an empty pair: dropped, as from a corpus in memory
    return write(root / "train.en.gz", src), write(root / "train.de.gz", tgt)


def test_every_usable_pair_comes_once_per_epoch_within_the_budget(
    corpus: tuple[Path, Path],
) -> None:
    src, tgt = (read_lines(p) for p in corpus)
    tokenizer = train_tokenizer(src + tgt, vocab_size=400)
    expected = encode_pairs(tokenizer, src, tgt, max_len=64)
    epochs = [
        list(stream_batches(stream_pairs(*corpus), tokenizer, 64, 600, 1000, 3, epoch))
        for epoch in (0, 1, 0)
    ]
    for batches in epochs:
        assert all(max(len(e.src), len(e.tgt)) * len(b) <= 600 for b in batches for e in b)
        seen = sorted((e.src, e.tgt) for b in batches for e in b)
        assert seen == sorted((e.src, e.tgt) for e in expected)  # each once
    assert epochs[0] == epochs[2] and epochs[0] != epochs[1]  # fixed by (seed, epoch)


def test_a_buffer_is_all_that_is_read_ahead(corpus: tuple[Path, Path]) -> None:
    """With the corpus's 2,500 lines in chunks of 10,000 the whole corpus is one chunk; a
    stream that never ends shows the bound instead: one chunk per buffer filled."""
    src, tgt = (read_lines(p) for p in corpus)
    tokenizer = train_tokenizer(src + tgt, vocab_size=400)
    read = 0

    def endless() -> Iterator[tuple[str, str]]:
        nonlocal read
        while True:
            read += 1
            yield src[read % 100], tgt[read % 100]

    batches = stream_batches(endless(), tokenizer, 64, 600, 15_000, seed=1, epoch=0)
    next(batches)
    assert read == 20_000  # two chunks to fill a buffer of 15,000: nothing more


def test_files_of_different_lengths_are_refused(tmp_path: Path) -> None:
    src = write(tmp_path / "a.en.gz", ["one", "two", "three"])
    tgt = write(tmp_path / "a.de.gz", ["eins", "zwei"])
    with pytest.raises(DataError, match="line counts differ"):
        list(stream_pairs(src, tgt))


def test_a_streamed_run_resumes_where_it_stopped(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    config = {
        "model": {**TINY_TEST_CONFIG, "max_positions": 128},
        "training": {
            "max_updates": 4, "max_tokens": 400, "warmup_updates": 2, "vocab_size": 300,
            "save_every": 2, "valid_every": 4, "log_every": 1, "valid_bleu_sentences": 4,
            "average_last": 1, "stream_buffer": 500,
        },
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    valid = [
        write(tmp_path / f"valid.{lang}.gz", read_lines(path)[:8])
        for lang, path in zip(("en", "de"), corpus, strict=True)
    ]
    args = [
        sys.executable, "-m", "model.train", "--src-train", str(corpus[0]),
        "--tgt-train", str(corpus[1]), "--src-valid", str(valid[0]), "--tgt-valid", str(valid[1]),
        "--config", str(tmp_path / "config.json"), "--threads", "1",
    ]  # fmt: skip

    def train(*extra: str) -> None:
        done = subprocess.run(
            [*args, *extra], cwd=REPO, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]

    train("--out", str(tmp_path / "whole"))
    train("--max-updates", "2", "--out", str(tmp_path / "stopped"))
    train("--resume", "--out", str(tmp_path / "stopped"))
    last = Path("checkpoints") / "update_000004.safetensors"
    whole, resumed = load_file(tmp_path / "whole" / last), load_file(tmp_path / "stopped" / last)
    assert all((whole[k] == resumed[k]).all() for k in whole)
    meta = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert meta["data"]["src_train"]["lines"] == 2500 and meta["train_pairs_used"] is None
