"""benchmarks.tag_placement: the span arithmetic on hand-made alignments, the tagged output's
reading, the whole benchmark with stand-in translators (one that places every tag right, one
that places every tag a word late), and a short run of the real thing on the shipped model.
The aligner itself is tested in tests/model/test_word_aligner.py."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from benchmarks import tag_placement
from benchmarks.reference_alignment import read_words
from benchmarks.tag_placement import (
    covering_span,
    html_input,
    pick_span,
    read_tagged,
    span_scores,
)
from tests.conftest import REPO


def test_covering_span_is_the_smallest_span_around_the_aligned_words() -> None:
    alignment = {(0, 0), (1, 3), (1, 1), (3, 4), (4, 4)}
    assert covering_span(alignment, (1, 2)) == (1, 4)  # one word, two links, a gap between
    assert covering_span(alignment, (0, 2)) == (0, 4)
    assert covering_span(alignment, (3, 5)) == (4, 5)  # two words on one
    assert covering_span(alignment, (2, 3)) is None  # unaligned
    assert covering_span(alignment, (2, 4)) == (4, 5)  # an unaligned word adds nothing
    assert covering_span(set(), (0, 1)) is None


def test_span_scores_counts_exact_overlap_and_leaves_out_unreferenced_spans() -> None:
    source = [(0, 1), (2, 4), (1, 2), (0, 3), (5, 6)]
    predicted = [(0, 1), (3, 5), None, (0, 2), (1, 2)]
    reference = [(0, 1), (2, 4), (4, 5), (2, 3), None]
    scores = span_scores(source, predicted, reference)
    assert (scores["sentences"], scores["scored"], scores["no_reference"]) == (5, 4, 1)
    assert scores["no_prediction"] == 1
    assert (scores["exact"], scores["overlap"]) == (1, 2)  # (0,1) exact; (3,5) overlaps (2,4)
    assert scores["exact_pct"] == 25.0 and scores["overlap_pct"] == 50.0
    by_words = scores["by_source_words"]
    assert list(by_words) == ["1", "2", "3"]
    assert (by_words["1"]["sentences"], by_words["1"]["scored"]) == (3, 2)
    assert by_words["2"]["overlap"] == 1 and by_words["2"]["exact"] == 0
    assert by_words["3"]["exact_pct"] == 0.0  # (0,2) and (2,3) touch, share no word
    nothing = span_scores([(0, 1)], [(0, 1)], [None])
    assert nothing["exact_pct"] is None  # no reference: no rate, not 0 % or 100 %
    with pytest.raises(ValueError):
        span_scores([(0, 1)], [], [])


def test_read_tagged_finds_the_covered_words() -> None:
    assert read_tagged("Ein <b>Hund</b> läuft.") == ("Ein Hund läuft.", (1, 2), 1)
    assert read_tagged("<b>Ein großer</b> Hund").span == (0, 2)
    # Partly inside counts; punctuation glued to a word does not; a punctuation word does.
    assert read_tagged("des <b>Hund</b>es").span == (1, 2)
    assert read_tagged("etwas anstarrt<b>.</b>") == ("etwas anstarrt.", None, 0)
    assert read_tagged("Katzen <b>&amp;</b> Hunde") == ("Katzen & Hunde", (1, 2), 1)
    # A split tag: the span around all its words, and its runs counted.
    assert read_tagged("<b>ein</b> roter <b>Ball</b> rollt") == ("ein roter Ball rollt", (0, 3), 2)
    assert read_tagged("<b>a <i>b</i></b> c").span == (0, 2)  # other tags inside are text
    assert read_tagged("kein Tag <i>hier</i>") == ("kein Tag hier", None, 0)
    assert read_tagged("ein <b> </b>Hund") == ("ein  Hund", None, 0)  # around no word


def test_html_input_escapes_and_reads_back(multi30k: Path) -> None:
    assert html_input(["Tom", "&", "Jerry", "<3"], (1, 3)) == "Tom <b>&amp; Jerry</b> &lt;3"
    assert html_input(["one"], (0, 1)) == "<b>one</b>"
    rng = random.Random(0)
    for words in read_words(multi30k / "val.en.gz", 300):
        span = pick_span(len(words), rng)
        assert 1 <= span[1] - span[0] <= 3 and 0 <= span[0] < span[1] <= len(words)
        assert read_tagged(html_input(words, span)) == (" ".join(words), span, 1)


# --- The whole benchmark, with stand-in translators -----------------------------------------


def _gzip_lines(path: Path, lines: Sequence[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(f"{line}\n" for line in lines)


@pytest.fixture
def english_to_english(
    multi30k: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """A Multi30k directory whose "German" is the English, so that a translator that copies
    its input is a perfect one and eflomal's reference is the identity."""
    data = tmp_path / "multi30k"
    data.mkdir()
    test = [" ".join(w) for w in read_words(multi30k / "test_2016_flickr.en.gz", 30)]
    train = [" ".join(w) for w in read_words(multi30k / "train.en.gz", 1000)]
    _gzip_lines(data / "test_2016_flickr.en.gz", test)
    _gzip_lines(data / "train.en.gz", train)
    _gzip_lines(data / "train.de.gz", train)
    monkeypatch.setenv("MULTI30K_DIR", str(data))
    return test


def _copying_translator(shift: int) -> Callable[..., list[str]]:
    """Copies its input; in HTML, moves the tag `shift` words to the right (to the left where
    that would go past the last word)."""

    def translate(
        bundle: Path, lines: Sequence[str], *, beam_size: int, flags: Sequence[str],
        html_format: bool,
    ) -> list[str]:  # fmt: skip
        if not html_format:
            return list(lines)
        out = []
        for line in lines:
            tagged = read_tagged(line)
            words = tagged.text.split()
            assert tagged.span is not None
            start, end = tagged.span
            move = shift if end + shift <= len(words) else -shift
            out.append(html_input(words, (start + move, end + move)))
        return out

    return translate


@pytest.mark.parametrize("shift", [0, 1])
def test_benchmark_scores_a_stand_in_translator(
    english_to_english: list[str], shift: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(tag_placement, "translate", _copying_translator(shift))
    out = tmp_path / "report.json"
    argv = ["--bundle", "unused", "--limit", "20", "--json", str(out)]
    assert tag_placement.main(argv) == 0
    report = json.loads(out.read_text())
    scores = report["scores"]
    assert report["sentences"] == scores["sentences"] == 20
    assert report["extra_pairs"] == 1000
    assert report["stripped_identical_pct"] == 100.0
    assert report["tag_lost"] == report["tag_split"] == 0
    assert scores["scored"] >= 18  # en-en: nearly every word aligns to itself
    if shift == 0:
        assert scores["exact_pct"] >= 90.0 and scores["overlap_pct"] >= 95.0
    else:
        assert scores["exact_pct"] <= 10.0
        assert scores["by_source_words"]["1"]["overlap_pct"] == 0.0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2].startswith("| 20 |")  # the markdown row, above the goals line


# --- The real thing ----------------------------------------------------------------------------


def test_benchmark_on_the_shipped_bundle(
    shipped_bundle: Path, multi30k: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    argv = [
        sys.executable, "-m", "benchmarks.tag_placement", "--bundle", str(shipped_bundle),
        "--limit", "20", "--extra-limit", "2000", "--beam-size", "2", "--json", str(out),
    ]  # fmt: skip
    subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=300)
    report = json.loads(out.read_text())
    assert report["sentences"] == report["scores"]["sentences"] == 20
    assert report["scores"]["scored"] + report["scores"]["no_reference"] == 20
    # Goals are the benchmark's to print; asserted is that every tag is read back and the
    # markup changes no word.
    assert report["tag_lost"] == 0
    assert report["stripped_identical_pct"] == 100.0
