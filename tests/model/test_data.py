import gzip

import pytest

from model.data import (
    Batch,
    DataError,
    Example,
    encode_pairs,
    epoch_batches,
    read_lines,
    read_parallel,
    token_budget_batches,
)
from model.tokenizer import train_tokenizer
from model.transformer import BOS_ID, EOS_ID, PAD_ID
from service.bundle.tokenizer import token_words


def test_reads_plain_and_gzip_alike(tmp_path) -> None:
    lines = ["Ein Hund läuft.", "", "Zwei Männer."]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\r\n".join(lines) + "\r\n")
    assert read_lines(tmp_path / "a.txt") == lines
    assert read_lines(tmp_path / "a.txt.gz") == lines


def test_mismatched_line_counts_name_both_files(tmp_path) -> None:
    (tmp_path / "x.en").write_text("a\nb\nc\n")
    (tmp_path / "x.de").write_text("a\nb\n")
    with pytest.raises(DataError) as e:
        read_parallel(tmp_path / "x.en", tmp_path / "x.de")
    assert "x.en has 3 lines" in str(e.value) and "x.de has 2" in str(e.value)


def test_missing_and_empty_files_are_clear_errors(tmp_path) -> None:
    with pytest.raises(DataError, match=r"no such file: .*nope\.en"):
        read_parallel(tmp_path / "nope.en", tmp_path / "nope.de")
    (tmp_path / "e.en").write_text("")
    (tmp_path / "e.de").write_text("")
    with pytest.raises(DataError, match="empty corpus"):
        read_parallel(tmp_path / "e.en", tmp_path / "e.de")


def test_encode_pairs_drops_empty_and_overlong() -> None:
    tok = train_tokenizer(["a b c d e f g h", "x y z"] * 5, vocab_size=300)
    src = ["a b", "", "a b c d e f g h a b c d e f g h", "x"]
    tgt = ["x y", "x", "x", ""]
    examples = encode_pairs(tok, src, tgt, max_len=8)
    assert len(examples) == 1
    assert examples[0].src[-1] == EOS_ID and examples[0].tgt[-1] == EOS_ID


def _examples(lengths: list[tuple[int, int]]) -> list[Example]:
    return [Example([5] * s + [EOS_ID], [6] * t + [EOS_ID]) for s, t in lengths]


def test_token_budget_batches_respect_budget_and_cover_everything() -> None:
    import random

    rng = random.Random(0)
    examples = _examples([(rng.randint(1, 30), rng.randint(1, 30)) for _ in range(500)])
    batches = token_budget_batches(examples, max_tokens=200)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        longest = max(max(len(examples[i].src), len(examples[i].tgt)) for i in b)
        assert longest * len(b) <= 200
    with pytest.raises(DataError, match="does not fit"):
        token_budget_batches(_examples([(300, 3)]), max_tokens=200)


def test_epoch_shuffle_is_seeded() -> None:
    batches = [[i] for i in range(50)]
    a = list(epoch_batches(batches, seed=1, epoch=0))
    assert a == list(epoch_batches(batches, seed=1, epoch=0))
    assert a != list(epoch_batches(batches, seed=1, epoch=1))
    assert a != list(epoch_batches(batches, seed=2, epoch=0))
    assert sorted(a) == batches


def test_batch_shifts_target_and_pads() -> None:
    batch = Batch.from_examples(_examples([(2, 3), (1, 1)]))
    assert batch.tgt_in.tolist() == [[BOS_ID, 6, 6, 6], [BOS_ID, 6, PAD_ID, PAD_ID]]
    assert batch.tgt_out.tolist() == [[6, 6, 6, EOS_ID], [6, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.src.tolist() == [[5, 5, EOS_ID], [5, EOS_ID, PAD_ID]]
    assert batch.n_tgt_tokens == 6


def test_encode_pairs_turns_word_links_into_token_links() -> None:
    tok = train_tokenizer(["a bb ccc dddd", "x yy zzz"] * 5, vocab_size=260)
    src, tgt = "a bb ccc", "x yy zzz"
    words = {(0, 2), (2, 0), (2, 1)}  # "a" -> "zzz", "ccc" -> "x" and "yy"
    (example,) = encode_pairs(tok, [src], [tgt], max_len=64, alignments=[words])
    src_words = token_words(src, tok.encode(src).offsets)
    tgt_words = token_words(tgt, tok.encode(tgt).offsets)
    # Every token of a linked word to every token of the word it is linked to, and no other.
    expected = {
        (t, s)
        for s, sw in enumerate(src_words)
        for t, tw in enumerate(tgt_words)
        if (sw, tw) in words
    }
    assert set(example.links) == expected and len(example.links) == len(expected)
    assert {(src_words[s], tgt_words[t]) for t, s in example.links} == words
    with pytest.raises(DataError, match="2 alignments for 1 sentence pairs"):
        encode_pairs(tok, ["a"], ["x"], max_len=8, alignments=[set(), set()])
