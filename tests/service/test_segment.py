"""service/segment.py: sentences and lines out, the exact layout back in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.segment import split


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        ("", []),
        ("   \n\t ", []),
        ("A dog runs.", ["A dog runs."]),
        ("A dog runs. A cat sleeps!", ["A dog runs.", "A cat sleeps!"]),
        ("Why? Because.", ["Why?", "Because."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("Wait... what?", ["Wait... what?"]),  # a lower-case word does not start a sentence
        ("e.g. this one", ["e.g. this one"]),
        ("Pi is 3.14 today.", ["Pi is 3.14 today."]),
        ("line one\nline two", ["line one", "line two"]),
        ("  indented\r\n\r\n  para two.  ", ["indented", "para two."]),
        ("中文。 English.", ["中文。", "English."]),
    ],
)
def test_split_examples(text: str, segments: list[str]) -> None:
    assert list(split(text).segments) == segments


def test_join_keeps_lines_paragraphs_and_indentation() -> None:
    text = "  First line. Second sentence!\n\n\tNew paragraph\r\nlast  "
    layout = split(text)
    assert layout.segments == ("First line.", "Second sentence!", "New paragraph", "last")
    assert layout.separators == ("  ", " ", "\n\n\t", "\r\n", "  ")
    assert layout.join(["A", "B", "C", "D"]) == "  A B\n\n\tC\r\nD  "


def test_join_needs_one_translation_per_segment() -> None:
    with pytest.raises(ValueError, match="2 translations for 1 segments"):
        split("One.").join(["a", "b"])


@given(st.text())
def test_split_join_round_trips_any_text(text: str) -> None:
    layout = split(text)
    assert layout.join(list(layout.segments)) == text
    assert len(layout.separators) == len(layout.segments) + 1
    for s in layout.segments:
        assert s and not s[0].isspace() and not s[-1].isspace()
        assert len(s.splitlines()) == 1


@given(st.lists(st.sampled_from(["Dog.", "cat", " ", "\n", "?", "Run!", "\t", "«Hi.»"])))
def test_split_join_round_trips_sentence_like_text(parts: list[str]) -> None:
    text = "".join(parts)
    layout = split(text)
    assert layout.join(list(layout.segments)) == text
