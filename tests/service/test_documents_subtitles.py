"""SubRip and WebVTT files (service/documents/formats/subtitles.py): what is not cue text comes
back byte for byte, cue text is translated a sentence at a time across cues and cut back over
the same cues, inline tags follow their words; the output parses in srt and webvtt-py."""

from __future__ import annotations

import html
import io
import re
import string
import time

import pytest
import srt
import webvtt
from hypothesis import given, settings
from hypothesis import strategies as st

from service.documents.base import Limits
from service.documents.formats.subtitles import SrtFormat, VttFormat
from service.documents.safe import DocumentError
from service.inference.engine import Engine
from tests.service.document_helpers import identity, translate, unit_texts

SRT, VTT = SrtFormat(), VttFormat()

ACROSS = (
    "1\r\n00:00:01,000 --> 00:00:02,500 X1:100 X2:200 Y1:10 Y2:20\r\n"
    "A man in a blue shirt\r\n\r\n"
    "7\r\n00:00:03,000 --> 00:00:04,000\r\nis riding a <i>red</i> bike.\r\n\r\n"
    "8\r\n00:00:05,000 --> 00:00:06,000\r\n♪\r\n"
)

SPEAKERS = (
    "WEBVTT - a title\nKind: captions\n\n"
    "NOTE two dogs\nin a note\n\n"
    "STYLE\n::cue(.loud) { color: red }\n\n"
    "intro\n00:01.000 --> 00:02.500 align:start position:10%\n"
    "<v Bob>Two dogs <c.loud>play</c> &amp; run\n\n"
    "00:03.000 --> 00:04.000\n<v.loud Ann>in the snow &lt;outside&gt;.</v>\n"
)


def srt_cues(data: bytes) -> list[srt.Subtitle]:
    return list(srt.parse(data.decode("utf-8")))


def vtt_captions(data: bytes) -> list[webvtt.Caption]:
    return list(webvtt.from_buffer(io.StringIO(data.decode("utf-8"))).captions)


def test_a_sentence_across_cues_is_one_unit_with_the_boundary_a_code() -> None:
    (unit,) = unit_texts(SRT, ACROSS.encode())  # the music cue has no words: no unit
    assert unit == "<p>A man in a blue shirt <c0/> is riding a <c2>red</c2> bike.</p>"


def test_everything_but_cue_text_stays_and_the_text_is_translated() -> None:
    out = translate(SRT, ACROSS.encode())
    assert out.decode() == (
        ACROSS.replace("A man in a blue shirt", "A MAN IN A BLUE SHIRT").replace(
            "is riding a <i>red</i> bike.", "IS RIDING A <i>RED</i> BIKE."
        )
    )
    before, after = srt_cues(ACROSS.encode()), srt_cues(out)
    assert [(c.index, c.start, c.end, c.proprietary) for c in after] == [
        (c.index, c.start, c.end, c.proprietary) for c in before
    ]


def test_webvtt_keeps_header_notes_styles_identifiers_settings_and_tags() -> None:
    out = translate(VTT, SPEAKERS.encode()).decode()
    assert out == SPEAKERS.replace(
        "<v Bob>Two dogs <c.loud>play</c> &amp; run", "<v Bob>TWO DOGS <c.loud>PLAY</c> &amp; RUN"
    ).replace("in the snow &lt;outside&gt;.</v>", "IN THE SNOW &lt;OUTSIDE&gt;.</v>")
    before, after = vtt_captions(SPEAKERS.encode()), vtt_captions(out.encode())
    assert [(c.identifier, c.start, c.end, c.settings) for c in after] == [
        (c.identifier, c.start, c.end, c.settings) for c in before
    ]
    assert [html.unescape(c.text) for c in after] == [html.unescape(c.text).upper() for c in before]


def test_a_line_break_inside_a_cue_stays_a_line_break() -> None:
    source = "1\n00:00:01,000 --> 00:00:02,000\n- Where are you?\n- <b>Here</b>.\n"
    assert translate(SRT, source.encode()).decode() == source.replace(
        "- Where are you?\n- <b>Here</b>.", "- WHERE ARE YOU?\n- <b>HERE</b>."
    )


def test_a_cue_left_without_words_takes_one_from_its_neighbour() -> None:
    source = "".join(
        f"{n}\n00:00:0{n},000 --> 00:00:0{n},900\n{text}\n\n"
        for n, text in enumerate(["A man", "is riding", "a bike."], 1)
    )
    extracted = SRT.read(source.encode(), Limits())
    # Both boundaries placed at one point: the middle cue would be empty.
    out = extracted.write(["<p>Ein Mann fährt <c0/> <c0/> Fahrrad.</p>"]).decode()
    assert [c.content for c in srt_cues(out.encode())] == ["Ein Mann", "fährt", "Fahrrad."]


def test_cues_all_in_italics_are_one_sentence_each_cue_in_italics_again() -> None:
    source = (
        "1\n00:00:01,000 --> 00:00:02,000\n<i>A man in a blue shirt</i>\n\n"
        "2\n00:00:03,000 --> 00:00:04,000\n<i>rides a bike.</i>\n"
    )
    # Each cue its own italic code, the unit would be read as two runs: two sentences.
    assert unit_texts(SRT, source.encode()) == ["<p>A man in a blue shirt <c0/> rides a bike.</p>"]
    assert translate(SRT, source.encode()).decode() == source.upper().replace("<I>", "<i>").replace(
        "</I>", "</i>"
    )


def test_an_unclosed_voice_stays_unclosed_and_a_stray_end_tag_stays() -> None:
    source = "WEBVTT\n\n00:01.000 --> 00:02.000\n<v Bob>Hello</i> there\n"
    assert translate(VTT, source.encode()).decode() == source.replace(
        "Hello</i> there", "HELLO</i> THERE"
    )


@pytest.mark.parametrize("hostile", ["<a" * 20_000, "{\\" * 20_000, "a." + " " * 200_000 + "b"])
def test_hostile_cue_text_is_read_in_linear_time(hostile: str) -> None:
    # Each took minutes with a pattern that backtracked over the rest of the cue.
    source = f"1\n00:00:01,000 --> 00:00:02,000\nword {hostile}\n".encode()
    started = time.perf_counter()
    assert identity(SRT, source) == source
    assert time.perf_counter() - started < 5


def test_a_legacy_encoding_is_kept() -> None:
    source = "1\n00:00:01,000 --> 00:00:02,000\nÇa coûte très cher, à Noël.\n"
    out = translate(SRT, source.encode("cp1252"))
    expected = source.replace("Ça coûte très cher, à Noël.", "ÇA COÛTE TRÈS CHER, À NOËL.")
    assert out == expected.encode("cp1252")


@pytest.mark.parametrize(
    ("format", "data", "message"),
    [
        (VTT, b"1\n00:01.000 --> 00:02.000\nHi\n", "does not start with WEBVTT"),
        (SRT, b"just a line of text\n", "no cue"),
        (SRT, b"1\n00:00:01,000 --> 00:00:02,000\n\x00\x01\n", "NUL"),
    ],
)
def test_what_is_no_subtitle_file_is_refused(format: object, data: bytes, message: str) -> None:
    with pytest.raises(DocumentError, match=message):
        format.read(data, Limits())  # type: ignore[attr-defined]


def test_the_real_model_splits_a_sentence_back_over_its_cues(shipped_engine: Engine) -> None:
    out = translate(SRT, ACROSS.encode(), shipped_engine).decode("utf-8")
    first, second, music = srt_cues(out.encode())
    # One sentence, translated whole, cut where the source was: the shirt in the first cue,
    # the riding and the bike in the second, the tag on the colour's translation.
    assert "Hemd" in first.content and "Fahrrad" not in first.content
    assert "Fahrrad" in second.content and "Hemd" not in second.content
    assert "<i>rot" in second.content
    assert music.content == "♪"
    assert out.startswith("1\r\n00:00:01,000 --> 00:00:02,500 X1:100 X2:200 Y1:10 Y2:20\r\n")


# --- Any file: the identity writes it back byte for byte ---------------------------------------

words = st.text(string.ascii_letters + "äöü", min_size=1, max_size=8)
tags = st.sampled_from(["<i>{}</i>", "<b>{}</b>", '<font color="#fff">{}</font>', "{}"])
line = st.lists(
    st.builds(lambda tag, word: tag.format(word), tags, words), min_size=1, max_size=5
).map(" ".join)
ending = st.sampled_from(["", ".", ",", "?", "!"])
cue_text = st.lists(st.builds(str.__add__, line, ending), min_size=1, max_size=3)
newline = st.sampled_from(["\n", "\r\n"])


@st.composite
def subtitle_files(draw: st.DrawFn, vtt: bool) -> str:
    end = draw(newline)
    cues = draw(st.lists(cue_text, min_size=1, max_size=6))
    separator = "." if vtt else ","
    blocks = [
        end.join([str(n), f"00:00:{n:02}{separator}000 --> 00:00:{n:02}{separator}900", *lines])
        for n, lines in enumerate(cues, 1)
    ]
    header = [f"WEBVTT{end}"] if vtt else []
    return (end * 2).join(header + blocks) + draw(st.sampled_from(["", end]))


@settings(max_examples=40, deadline=None)
@given(subtitle_files(vtt=False))
def test_any_srt_file_comes_back_byte_for_byte(source: str) -> None:
    assert identity(SRT, source.encode()) == source.encode()
    out = translate(SRT, source.encode())
    assert [(c.index, c.start, c.end, c.content) for c in srt_cues(out)] == [
        (c.index, c.start, c.end, upper_text(c.content)) for c in srt_cues(source.encode())
    ]


@settings(max_examples=20, deadline=None)
@given(subtitle_files(vtt=True))
def test_any_vtt_file_comes_back_byte_for_byte(source: str) -> None:
    assert identity(VTT, source.encode()) == source.encode()
    out = translate(VTT, source.encode())
    assert [(c.identifier, c.start, c.end, c.raw_text) for c in vtt_captions(out)] == [
        (c.identifier, c.start, c.end, upper_text(c.raw_text))
        for c in vtt_captions(source.encode())
    ]


def upper_text(markup: str) -> str:
    """The text between tags in upper case, the tags as they are."""
    return re.sub(r"(<[^>]*>)|[^<]+", lambda m: m.group(1) or m.group(0).upper(), markup)
