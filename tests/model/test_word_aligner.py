"""model/alignment.py: eflomal's word pieces, the symmetrisation, pairs a reader can check, and
the Pharaoh files guided alignment trains on."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from benchmarks.reference_alignment import read_words
from model.alignment import (
    _grow_diag_final_and,
    _pieces,
    align,
    format_links,
    main,
    parse_links,
)


def test_punctuation_glued_to_a_word_is_aligned_but_does_not_count_for_it() -> None:
    pieces, owners = _pieces(["sitting.", "-", "don't", "Wasser,"])
    assert pieces == ["sitting", ".", "-", "don", "'", "t", "Wasser", ","]
    assert owners == [0, None, 1, 2, None, 2, 3, None]


def test_grow_diag_final_and() -> None:
    forward = {(0, 0), (1, 1), (2, 1), (3, 3)}
    reverse = {(0, 0), (1, 1), (1, 2), (4, 3)}
    # Intersection (0,0) (1,1); grown by the neighbours (2,1) and (1,2), each of which aligns
    # a word not yet aligned; (3,3) and (4,3) touch no link: final-and takes (3,3) (both words
    # unaligned), and then not (4,3), whose target word (3,3) just aligned.
    assert _grow_diag_final_and(forward, reverse, 5, 4) == {(0, 0), (1, 1), (2, 1), (1, 2), (3, 3)}
    assert _grow_diag_final_and(set(), set(), 0, 0) == set()


def test_eflomal_aligns_checkable_pairs(multi30k: Path) -> None:
    """Hand-checkable pairs among 200 training pairs, with 3,000 more as statistics."""
    train_en = read_words(multi30k / "train.en.gz", 3200)
    train_de = read_words(multi30k / "train.de.gz", 3200)
    hand = [
        ("a dog runs", "ein Hund läuft", {(1, 1)}),
        ("A dog runs.", "Ein Hund rennt.", {(0, 0), (1, 1)}),
        ("A man and a woman are sitting.", "Ein Mann und eine Frau sitzen.", {(1, 1), (4, 4)}),
        ("Two children play in the water.", "Zwei Kinder spielen im Wasser.", {(1, 1), (5, 4)}),
    ]
    sources = [s.split() for s, _, _ in hand] + train_en[:200]
    targets = [t.split() for _, t, _ in hand] + train_de[:200]
    alignments = align(sources, targets, extra=(train_en[200:], train_de[200:]))
    assert len(alignments) == len(sources)
    for (source, target, expected), alignment in zip(hand, alignments, strict=False):
        assert expected <= alignment, (source, target, sorted(alignment))
    for alignment, s, t in zip(alignments, sources, targets, strict=True):
        assert all(0 <= i < len(s) and 0 <= j < len(t) for i, j in alignment)
    with pytest.raises(ValueError):
        align([["a"]], [])


def test_links_round_trip_through_the_pharaoh_format() -> None:
    links = {(2, 0), (0, 1), (10, 3)}
    assert format_links(links) == "0-1 2-0 10-3"
    assert parse_links(format_links(links)) == links
    assert parse_links("") == set()
    with pytest.raises(ValueError, match="'1:2' is not an i-j link"):
        parse_links("0-0 1:2")


def test_the_cli_writes_one_line_of_links_per_pair(multi30k: Path, tmp_path: Path) -> None:
    en, de = tmp_path / "train.en", tmp_path / "train.de.gz"
    sources = read_words(multi30k / "train.en.gz", 500)
    en.write_text("".join(" ".join(words) + "\n" for words in sources))
    with gzip.open(de, "wt", encoding="utf-8") as f:
        f.writelines(" ".join(w) + "\n" for w in read_words(multi30k / "train.de.gz", 500))
    out = tmp_path / "links.gz"
    assert main(["--src", str(en), "--tgt", str(de), "--out", str(out)]) == 0
    with gzip.open(out, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == len(sources) == 500
    links = parse_links(lines[0])
    assert links and all(i < len(sources[0]) for i, _ in links)
    (tmp_path / "short.de").write_text("one line\n")
    assert main(["--src", str(en), "--tgt", str(tmp_path / "short.de"), "--out", str(out)]) == 2
