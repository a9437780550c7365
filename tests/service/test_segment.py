"""service/text/segment.py: sentences and lines out, the exact layout back in."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.text import markup, pipeline, segment
from service.text.segment import split

REPO = Path(__file__).resolve().parents[2]


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
        # Acronyms with inner periods, in any language (val line 705 of Multi30k).
        ("People attending a J.P. Morgan race.", ["People attending a J.P. Morgan race."]),
        ("The U.S. Army came. It left.", ["The U.S. Army came.", "It left."]),
        ("It was in the U.S. Then it left.", ["It was in the U.S. Then it left."]),  # as Moses
        ("Go to www.example.Com. Then stop.", ["Go to www.example.Com.", "Then stop."]),
        ("Line one\nLine two", ["Line one", "Line two"]),  # short lines, a capital: two
        ("the cat sat\non the mat.", ["the cat sat\non the mat."]),  # lower case goes on
        ("  indented\r\n\r\n  para two.  ", ["indented", "para two."]),
        ("中文。 English.", ["中文。", "English."]),
        # Full-width marks need no space after them; a quote followed by kana goes on.
        ("今天很好。我们走吧！好吗？", ["今天很好。", "我们走吧！", "好吗？"]),
        ("他说：“我很好。”然后离开了。", ["他说：“我很好。”", "然后离开了。"]),
        ("「晴れです。」と言った。雨です。", ["「晴れです。」と言った。", "雨です。"]),
        ("これはペンです｡あれは本です｡", ["これはペンです｡", "あれは本です｡"]),
        ("价格是3.5元。", ["价格是3.5元。"]),
        ("终于！！！ 好。", ["终于！！！", "好。"]),
        ("「はい。」そして帰った。", ["「はい。」", "そして帰った。"]),  # not a quotative
        ('好。"你呢？"', ["好。", '"你呢？"']),  # a straight quote opens the next one
        ("我喜欢。 iPad 也好。", ["我喜欢。", "iPad 也好。"]),  # lower case after 。 too
        # Format characters (Cf) alone are nothing to translate, at a line's edges not read;
        # inside a sentence (a soft hyphen, an emoji's joiner) they stay.
        ("\u200b\u2060 \ufeff\u200c\u200d", []),
        ("A dog runs.\n\u200b\nA cat sleeps.", ["A dog runs.", "A cat sleeps."]),
        ("\ufeffA dog runs.\u200b ", ["A dog runs."]),
        # After a full-width mark the next sentence starts at once: not with what shows nothing.
        ("他很好。\u200b她也好。", ["他很好。", "她也好。"]),
        (
            "A co\u00adop \U0001f468\u200d\U0001f467 runs.",
            ["A co\u00adop \U0001f468\u200d\U0001f467 runs."],
        ),
    ],
)
def test_split_examples(text: str, segments: list[str]) -> None:
    assert list(split(text).segments) == segments


@pytest.mark.parametrize(
    ("language", "text", "segments"),
    [
        ("en", "Dr. Smith arrived. He sat.", ["Dr. Smith arrived.", "He sat."]),
        ("en", "J. R. R. Tolkien wrote it.", ["J. R. R. Tolkien wrote it."]),
        ("en", '("Mr. Brown") left. Go.', ['("Mr. Brown") left.', "Go."]),
        ("en", "See No. 5 here. Then stop.", ["See No. 5 here.", "Then stop."]),
        ("en", "I said no. Then I left.", ["I said no.", "Then I left."]),  # no number after
        ("en", "It ended in a draw. Dr. Who won.", ["It ended in a draw.", "Dr. Who won."]),
        ("en", "Plan A. Plan B.", ["Plan A. Plan B."]),  # a capital before "." reads as an initial
        ("en", "Taller than I. The rest laughed.", ["Taller than I.", "The rest laughed."]),
        ("fr", "Il mesure 3 m. Ensuite il part.", ["Il mesure 3 m.", "Ensuite il part."]),
        ("fr", "M. Dupont part.", ["M. Dupont part."]),
        ("en", "Call Dr.\nSmith", ["Call Dr.", "Smith"]),  # never across lines
        ("de", "Hr. Müller kommt. Er sitzt.", ["Hr. Müller kommt.", "Er sitzt."]),
        ("de", "Siehe Nr. 4. Das ist alles.", ["Siehe Nr. 4.", "Das ist alles."]),
        ("fr", "Mme. Curie est là. Elle lit.", ["Mme. Curie est là.", "Elle lit."]),
        ("de", "Dr. Smith arrived.", ["Dr. Smith arrived."]),  # titles shared by the languages
        ("xx", "Mr. Brown left.", ["Mr.", "Brown left."]),  # unknown language: initials only
        ("xx", "J. Brown left.", ["J. Brown left."]),
    ],
)
def test_abbreviations_of_the_source_language_do_not_end_a_sentence(
    language: str, text: str, segments: list[str]
) -> None:
    assert list(split(text, language).segments) == segments


def test_join_keeps_lines_paragraphs_and_indentation() -> None:
    text = "  First line. Second sentence!\n\n\tNew paragraph\r\nLast  "
    layout = split(text)
    assert layout.segments == ("First line.", "Second sentence!", "New paragraph", "Last")
    assert layout.separators == ("  ", " ", "\n\n\t", "\r\n", "  ")
    assert layout.join(["A", "B", "C", "D"]) == "  A B\n\n\tC\r\nD  "


_WRAPPED = (  # an e-mail hard-wrapped at 72 columns
    "I wanted to let you know that the meeting on Tuesday has been moved to\n"
    "Thursday afternoon, because John is travelling. Please tell the others\n"
    "and bring the report.\n"
    "\n"
    "Thanks,\n"
    "Anna"
)


def test_a_hard_wrapped_paragraph_is_split_into_its_sentences_across_lines() -> None:
    assert split(_WRAPPED, "en").segments == (
        "I wanted to let you know that the meeting on Tuesday has been moved to\n"
        "Thursday afternoon, because John is travelling.",
        "Please tell the others\nand bring the report.",
        "Thanks,",  # a short line followed by a capital: its own line, as written
        "Anna",
    )


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        # A line that ends a sentence or announces what follows, a list item, a quote.
        ("It is done.\nnext we go", ["It is done.", "next we go"]),
        ("You need these:\nflour and eggs", ["You need these:", "flour and eggs"]),
        ("Buy\n- milk\n- eggs", ["Buy", "- milk", "- eggs"]),
        ("Steps\n1. open it\n2. close it", ["Steps", "1. open it", "2. close it"]),
        ("he wrote\n> and then some", ["he wrote", "> and then some"]),
        # Short lines each starting with a capital: an address, kept line by line.
        (
            "John Smith\n12 Main Street\nSpringfield",
            ["John Smith", "12 Main Street", "Springfield"],
        ),
        # A blank line ends the paragraph, and CRLF wraps like LF.
        ("the cat\n\nsat down", ["the cat", "sat down"]),
        ("one long\r\n  line", ["one long\r\n  line"]),
        # Chinese wraps anywhere.
        (
            "这是一个很长的句子，它被硬换行\n分成了两行。第二句。",
            ["这是一个很长的句子，它被硬换行\n分成了两行。", "第二句。"],
        ),
    ],
)
def test_which_line_breaks_a_sentence_goes_on_across(text: str, segments: list[str]) -> None:
    assert list(split(text, "en").segments) == segments


def test_unpunctuated_lines_are_not_read_as_one_endless_sentence() -> None:
    words = [f"word{i} and more" for i in range(300)]  # lower case, no end mark
    layout = split("\n".join(words), "en")
    assert layout.join(list(layout.segments)) == "\n".join(words)
    assert len(layout.segments) > 1
    assert all(len(s) <= segment._LONGEST_WRAPPED for s in layout.segments)
    # An end mark starts the count again: a long wrapped paragraph of short sentences is one unit.
    sentences = "\n".join(
        ["The dog runs across the big green field. And it jumps over the old wall"] * 100
    )
    assert len(split(sentences, "en").segments) == 101


def test_the_model_reads_a_wrapped_sentence_on_one_line() -> None:
    layout = split("A sentence wrapped \r\n  across lines.")
    assert layout.segments == ("A sentence wrapped \r\n  across lines.",)
    assert layout.inputs == ["A sentence wrapped" + " " * 5 + "across lines."]


def test_line_breaks_go_back_into_the_translation_at_the_same_fraction() -> None:
    layout = split(_WRAPPED, "en")
    translations = [
        "Ich wollte dir mitteilen, dass das Treffen vom Dienstag auf Donnerstagnachmittag "
        "verschoben wurde, weil John verreist ist.",
        "Bitte sag es den anderen und bring den Bericht mit.",
        "Danke,",
        "Anna",
    ]
    rewrapped = layout.rewrap(translations)
    assert layout.join([r.text for r in rewrapped]) == (
        "Ich wollte dir mitteilen, dass das Treffen vom Dienstag auf Donnerstagnachmittag\n"
        "verschoben wurde, weil John verreist ist. Bitte sag es den anderen\n"
        "und bring den Bericht mit.\n"
        "\n"
        "Danke,\n"
        "Anna"
    )
    # Offsets of the translation map to the same characters of the rewrapped text.
    for r, translation in zip(rewrapped, translations, strict=True):
        for i, character in enumerate(translation):
            if not character.isspace():
                assert r.text[r.position(i)] == character


def test_each_line_break_gets_its_own_place_with_indentation_and_crlf_kept() -> None:
    (rewrapped,) = split("one two three\r\n  four five six\nseven eight nine").rewrap(
        ["eins zwei drei vier fünf sechs sieben acht neun"]
    )
    assert rewrapped.text == "eins zwei drei\r\n  vier fünf sechs\nsieben acht neun"
    assert rewrapped.position(len("eins zwei drei vier")) == len("eins zwei drei\r\n  vier")
    # Fewer spaces between words than breaks: the rest go at the end, none is lost.
    (short,) = split("one two three\nfour five six\nseven").rewrap(["eins"])
    assert short.text == "eins\n\n"  # not inside the word
    # A translation without spaces (Chinese) takes the break at the same fraction.
    (chinese,) = split("a long sentence\nwrapped once").rewrap(["一个长句子换行了一次"])
    assert chinese.text == "一个长句子\n换行了一次"
    # Two breaks at one point, a lone CR and then a LF, stay two (not one CRLF).
    (crlf,) = split("one\rtwo\nthree").rewrap(["xy"])
    assert crlf.text == "xy\r \n"


@given(st.text(alphabet="ab .\n\r-:一", max_size=60), st.text(alphabet="xy 。", max_size=30))
def test_rewrapping_keeps_every_line_break_and_every_character(text: str, translation: str) -> None:
    layout = split(text, "en")
    for source, r in zip(
        layout.segments, layout.rewrap([translation] * len(layout.segments)), strict=True
    ):
        breaks = len(segment._WRAP.findall(source))
        assert len(segment._BREAK.findall(r.text)) == breaks + len(
            segment._BREAK.findall(translation)
        )
        assert r.text.replace("\r", "").replace("\n", "").replace(" ", "") == translation.replace(
            " ", ""
        )


def test_join_needs_one_translation_per_segment() -> None:
    with pytest.raises(ValueError, match="2 translations for 1 segments"):
        split("One.").join(["a", "b"])


@given(st.text(), st.sampled_from(["", "en", "de", "fr"]))
def test_split_join_round_trips_any_text(text: str, language: str) -> None:
    layout = split(text, language)
    assert layout.join(list(layout.segments)) == text
    # The model's inputs put back where they were, line breaks included, are the text again.
    assert layout.join([r.text for r in layout.rewrap(layout.inputs)]) == text
    assert len(layout.separators) == len(layout.segments) + 1
    for s, model_input in zip(layout.segments, layout.inputs, strict=True):
        assert segment.VISIBLE.match(s[0]) and segment.VISIBLE.match(s[-1])
        assert len(s.splitlines()) == len(segment._WRAP.findall(s)) + 1  # only wraps inside
        assert len(model_input.splitlines()) == 1 and len(model_input) == len(s)


@given(
    st.lists(st.sampled_from(["Dog.", "cat", " ", "\n", "?", "Run!", "\t", "«Hi.»", "Dr.", "J."]))
)
def test_split_join_round_trips_sentence_like_text(parts: list[str]) -> None:
    text = "".join(parts)
    layout = split(text, "en")
    assert layout.join(list(layout.segments)) == text


# Long runs of sentence marks with no space after them: a search that restarts inside the run
# is quadratic (200,000 dots took minutes). Each text is split and rejoined in a subprocess so
# that a regression shows as a timeout (hang detection, not a timing assertion).
_ADVERSARIAL = {  # and how many sentences each is
    "dots": ("'.' * 200_000", 1),
    "mixed": ("('.' * 999 + '\"' * 999 + '!?…。' * 50 + 'x') * 450", 451),  # 。 needs no space
    "marks and quotes": ("('.\"' * 5 + '?' * 40 + ')') * 20_000", 1),
    "full-width marks": ("('。' * 999 + '」' * 999 + '.' * 999) * 70", 71),
}


@pytest.mark.parametrize(("expression", "sentences"), _ADVERSARIAL.values(), ids=list(_ADVERSARIAL))
def test_long_runs_of_sentence_marks_split_in_linear_time(expression: str, sentences: int) -> None:
    program = (
        "from service.text.segment import split\n"
        f"text = {expression}\n"
        "assert len(text) >= 200_000\n"
        "layout = split(text)\n"
        "assert layout.join(list(layout.segments)) == text\n"
        "print(len(layout.segments))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sentences)


_QUADRATIC_SENTENCE_END = re.compile(
    r"[.!?…]*[。！？｡][.!?…。！？｡]*(?:[”’»)\]」』）】〉》]|[\"'](?=\s|$))*\s*"
    r"|[.!?…。！？｡]+[\"'”’»)\]]*\s+"
)


@given(st.text(alphabet='.!?…。｡」”" »)aA \t'))
def test_sentence_ends_are_found_where_the_unanchored_pattern_found_them(text: str) -> None:
    """The lookbehind only skips starts inside a run of marks, where no match can differ."""
    old = [m.span() for m in _QUADRATIC_SENTENCE_END.finditer(text)]
    new = [m.span() for m in segment._SENTENCE_END.finditer(text)]
    assert new == old


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        (
            "วันนี้อากาศดีมาก ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อน",
            ["วันนี้อากาศดีมาก", "ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อน"],
        ),
        # Spaces around a number or an English word, after ๆ or ฯ, between list items: not ends.
        ("ร้านนี้ขายกาแฟราคา 45 บาท ขนมปังราคา 30 บาท", ["ร้านนี้ขายกาแฟราคา 45 บาท", "ขนมปังราคา 30 บาท"]),
        ("ผมใช้ iPhone 15 ทุกวัน แบตเตอรี่ใช้ได้นานมาก", ["ผมใช้ iPhone 15 ทุกวัน", "แบตเตอรี่ใช้ได้นานมาก"]),
        ("เด็กๆ เล่นกันอยู่ในสนาม แม่เรียกให้กลับบ้าน", ["เด็กๆ เล่นกันอยู่ในสนาม", "แม่เรียกให้กลับบ้าน"]),
        ("ฉันอยู่ที่กรุงเทพฯ มาสิบปีแล้ว ตอนนี้ย้ายไปเชียงใหม่", ["ฉันอยู่ที่กรุงเทพฯ มาสิบปีแล้ว", "ตอนนี้ย้ายไปเชียงใหม่"]),
        # End marks first, then Thai; English around Thai keeps its own rules.
        ("Hello there. ขอบคุณครับ แล้วพบกันใหม่", ["Hello there.", "ขอบคุณครับ", "แล้วพบกันใหม่"]),
    ],
)
def test_thai_is_split_into_sentences_at_the_spaces_that_end_them(
    text: str, segments: list[str]
) -> None:
    assert list(split(text).segments) == segments


@given(st.text(alphabet="กขคนมาิ่ ๆฯ1a.\n", max_size=80))
def test_split_join_round_trips_thai(text: str) -> None:
    layout = split(text)
    assert layout.join(list(layout.segments)) == text
    assert all(s and not s[0].isspace() and not s[-1].isspace() for s in layout.segments)


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        # A line shorter than a wrapping tool's width is not full, even the paragraph's longest.
        (
            "Thank you for your message about the new project\nBest regards\nJohn",
            ["Thank you for your message about the new project", "Best regards", "John"],
        ),
        (
            "Meeting notes from the planning session on Monday\nAttendees\nAlice, Bob",
            ["Meeting notes from the planning session on Monday", "Attendees", "Alice, Bob"],
        ),
        # Thai lines stay lines, however long (no case, no end marks to tell a wrap by).
        (
            "ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อนตอนเย็นและเราเห็นนกหลายตัวบินอยู่เหนือทะเลสาบ\n"
            "พรุ่งนี้ฉันจะไปทำงานแต่เช้าเพราะมีประชุมสำคัญกับลูกค้าจากต่างประเทศหลายคน\n"
            "แม่เรียกให้กลับบ้าน",
            [
                "ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อนตอนเย็นและเราเห็นนกหลายตัวบินอยู่เหนือทะเลสาบ",
                "พรุ่งนี้ฉันจะไปทำงานแต่เช้าเพราะมีประชุมสำคัญกับลูกค้าจากต่างประเทศหลายคน",
                "แม่เรียกให้กลับบ้าน",
            ],
        ),
    ],
)
def test_short_lines_and_thai_lines_are_not_taken_for_wraps(text: str, segments: list[str]) -> None:
    assert list(split(text, "en").segments) == segments


def test_a_long_hard_wrapped_chinese_text_is_cut_only_between_its_sentences() -> None:
    """Full-width marks end a sentence with no space after them: the count of a sentence going
    on across lines starts again at each, so no wrapped sentence is cut at a line break."""
    sentence = "今天天气很好，我们一起去公园散步，孩子们在草地上玩得很开心，大家都很高兴。"
    text = sentence * 60
    wrapped = "\n".join(text[i : i + 31] for i in range(0, len(text), 31))
    layout = split(wrapped, "zh")
    assert [s.replace("\n", "") for s in layout.segments] == [sentence] * 60


def test_a_token_starting_at_an_inserted_break_comes_after_it() -> None:
    (rewrapped,) = split("hello\nworld").rewrap(["你好世界"])
    assert rewrapped.text == "你好\n世界"
    assert rewrapped.position(2, starts=True) == 3  # 世 starts after the break
    assert rewrapped.position(2) == 2  # 好 ends before it


def test_a_short_block_seen_again_is_not_split_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traffic repeats its paragraphs: a short block's layout is remembered, the same as
    splitting it again, for its language, format, splitting and wrapping alone; a long one
    (a document's) is split each time."""
    split_calls: list[str] = []

    def counted(text: str, *args: object, **kwargs: object) -> segment.Layout:
        split_calls.append(text)
        return split(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "split", counted)
    pipeline._remembered.cache_clear()
    text = "A dog runs. A cat sleeps.\n\n12"
    first = pipeline._layout(text, "en", "text", "lines")
    assert pipeline._layout(text, "en", "text", "lines") == first and split_calls == [text]
    assert first == split(text, "en").keeping(markup.translatable)  # "12" left as it is
    pipeline._layout(text, "de", "text", "lines")
    pipeline._layout(text, "en", "html", "lines")
    pipeline._layout(text, "en", "text", "none")
    pipeline._layout(text, "en", "text", "lines", wraps=False)
    assert len(split_calls) == 5
    long = "A sentence. " * (pipeline.LAYOUT_MEMO_CHARACTERS // 12 + 1)
    assert pipeline._layout(long, "en", "text", "lines") == pipeline._layout(
        long, "en", "text", "lines"
    )
    assert split_calls[5:] == [long, long]
