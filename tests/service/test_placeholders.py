"""Placeholders and protected spans in plain text (service/text/placeholders.py,
markup.protect): found whole, kept out of the model's sentence, back byte for byte and as many
times as sent, where the alignment puts them."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path

import docx
import httpx
import polib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.bundle.decoding import DecodingOptions
from service.documents.formats.localization import PoFormat
from service.documents.formats.markdown import MarkdownFormat
from service.documents.formats.ooxml import DOCX
from service.documents.formats.subtitles import SrtFormat
from service.errors import ServiceError
from service.http.app import create_app
from service.inference.engine import Engine
from service.text import markup, pipeline
from service.text.placeholders import Protection
from tests.service import document_helpers
from tests.service.helpers import FakeModel, GarblingModel, fast_settings, running

pytestmark = pytest.mark.anyio
PROTECTION = Protection()
PO, MARKDOWN, SRT = PoFormat(), MarkdownFormat(), SrtFormat()


def found(text: str, protection: Protection = PROTECTION) -> list[str]:
    return [text[s.start : s.end] for s in protection.find(text, markup._SPECIAL)]


def test_each_kind_is_found_whole_and_prose_is_not() -> None:
    text = (
        "%s %1$s %(name)s %05.2f {0} {name} {{user}} ${var} <0>x</0> <1/> `ls -la` "
        "{count, plural, one {# dog} other {# dogs}} a@b.com https://x.org/a"
    )
    assert found(text) == [
        "%s", "%1$s", "%(name)s", "%05.2f", "{0}", "{name}", "{{user}}", "${var}", "<0>",
        "</0>", "<1/>", "`ls -la`", "{count, plural, one {# dog} other {# dogs}}", "a@b.com",
        "https://x.org/a",
    ]  # fmt: skip
    kinds = [(s.kind, s.name) for s in PROTECTION.find("<0>a</0><1/>", markup._SPECIAL)]
    assert kinds == [("open", "0"), ("close", "0"), ("item", "")]
    assert found("50 % off, 50% of them, an { unbalanced brace, a < 3 and a lone ` tick") == []


def test_a_requests_patterns_are_kept_too_and_bad_ones_are_refused() -> None:
    assert found("Order ACME-1234 now", Protection([r"ACME-\d+"])) == ["ACME-1234"]
    with pytest.raises(ServiceError, match="placeholder pattern 0"):
        Protection(["(unclosed"])
    with pytest.raises(ServiceError, match="took more than"):
        Protection([r"(a|aa)+$"]).find("a" * 5000 + "!", markup._SPECIAL)
    with pytest.raises(ServiceError, match="17 placeholder patterns"):
        Protection(["x"] * 17)


def translate(
    model: FakeModel | Engine,
    texts: Sequence[str],
    format: pipeline.Format = "text",
    **options: int,
) -> list[str]:
    """The pipeline as the runtime runs it (placeholders on), through `model`."""
    prepared = pipeline.prepare(
        model, texts, None, max_segment_characters=10_000, protection=PROTECTION, format=format
    )
    chosen = prepared.decoding(DecodingOptions(**options))
    nbest = model.generate(prepared.sources, chosen)
    n = chosen.num_hypotheses
    return [t for r in pipeline.assemble(model, prepared, nbest, n) for t in r.texts]


PLACEHOLDERS = st.sampled_from(
    ["%s", "%1$s", "%(name)s", "{0}", "{name}", "{{user}}", "${var}", "<0>", "</0>", "<1/>",
     "`a b`", "{n, plural, one {# x} other {# y}}", " https://x.org/p ", " a@b.com "]
)  # fmt: skip
WORDS = st.sampled_from(["dogs", "run", "in", "the", "snow", ".", ",", "!"])
# Placeholders and words in any order, glued or apart. (A URL or e-mail address has spaces
# around it: glued to a word it is none, and what follows it glued would be read as part of it.)
SENTENCES = st.lists(
    st.tuples(st.one_of(PLACEHOLDERS, WORDS), st.sampled_from([" ", "", "  "]))
).map(lambda parts: "".join(part + gap for part, gap in parts))
# GarblingModel: every character the model reads comes back changed, digits and brackets too;
# each aligned to itself. Tokens are characters: a long sentence is within its limit.
GARBLING = GarblingModel(max_input_tokens=5000)


@settings(max_examples=150, deadline=None)
@given(SENTENCES)
def test_any_placeholders_anywhere_come_back_byte_for_byte_as_many_times(text: str) -> None:
    """Every placeholder comes back as sent, in its order, and nothing else of it reached the
    model (which would have garbled it)."""
    (out,) = translate(GARBLING, [text])
    assert_translated(text, out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(PLACEHOLDERS, WORDS), st.sampled_from([" ", "", "  "]))))
def test_placeholders_in_html_text_come_back_too(parts: list[tuple[str, str]]) -> None:
    """In an HTML paragraph with an inline element, as in plain text (numbered tags aside:
    in HTML they are text the parser escapes, and elements are the tags)."""
    text = "".join(part + gap for part, gap in parts if part not in ("<0>", "</0>", "<1/>"))
    (out,) = translate(GARBLING, [f"<p>{text} <b>dogs</b></p>"], "html")
    assert out.startswith("<p>") and out.endswith("<b>DOGS</b></p>")
    assert_kept(text, html.unescape(out))


def assert_kept(text: str, out: str) -> None:
    """Each protected span of `text` is in `out`, byte for byte, in the same order, and as
    many times. (Not `found(out)`: a URL that the model's punctuation now follows with no
    space reads longer, though its bytes are all there.)"""
    spans = found(text)
    at = 0
    for span in spans:
        at = out.find(span, at)
        assert at >= 0, (span, out)
        at += len(span)
    for span in set(spans):
        assert out.count(span) == text.count(span), (span, out)


def _words(text: str) -> str:
    """`text` without its protected spans and whitespace."""
    spans = PROTECTION.find(text, markup._SPECIAL)
    kept, done = [], 0
    for span in spans:
        kept.append(text[done : span.start])
        done = span.end
    kept.append(text[done:])
    return "".join("".join(kept).split())


# --- Through documents: each format's own reading and writing around the same pipeline ----------


def assert_translated(text: str, out: str) -> None:
    """`out` holds `text`'s placeholders as assert_kept says, and its words as the model gave
    them."""
    assert_kept(text, out)
    assert _words(out) == _words(text).upper(), out


@settings(max_examples=25, deadline=None)
@given(SENTENCES)
def test_placeholders_in_a_docx_paragraph_come_back_too(text: str) -> None:
    """In the text of a docx paragraph's run, with a bold run after it."""
    document = docx.Document()
    document.add_paragraph(text).add_run(" dogs").bold = True
    sent = io.BytesIO()
    document.save(sent)
    out = document_helpers.translate(DOCX, sent.getvalue(), GARBLING)
    (paragraph,) = docx.Document(io.BytesIO(out)).paragraphs
    assert_translated(text + " dogs", paragraph.text)
    # The bold words (a sentence's last punctuation is outside a run that ends it, as it is
    # outside an HTML element: "<c0>run.</c0> dogs" is "<c0>RUN</c0>. DOGS").
    bold = "".join(run.text for run in paragraph.runs if run.bold)
    assert bold.strip(" .,!") == "DOGS", bold


@settings(max_examples=25, deadline=None)
@given(SENTENCES)
def test_placeholders_in_a_markdown_paragraph_come_back_too(text: str) -> None:
    sent = f"# Dogs\n\n{text} *dogs*\n"
    out = document_helpers.translate(MARKDOWN, sent.encode(), GARBLING).decode()
    heading, paragraph = out.split("\n\n")
    assert heading == "# DOGS" and paragraph.endswith("*DOGS*\n")
    assert_translated(text, paragraph.removesuffix("*DOGS*\n"))


PO_HEADER = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'


@settings(max_examples=25, deadline=None)
@given(SENTENCES.filter(str.strip))
def test_placeholders_in_a_po_entry_come_back_too(text: str) -> None:
    """In a msgid's translation (an entry with nothing but placeholders and punctuation is
    left untranslated: its msgstr stays empty)."""
    sent = f'{PO_HEADER}msgid "{text}"\nmsgstr ""\n'
    out = document_helpers.translate(PO, sent.encode(), GARBLING).decode()
    (entry,) = polib.pofile(out)
    if entry.msgstr or any(c.isalpha() for c in _words(text)):
        assert_translated(text, entry.msgstr)


@settings(max_examples=25, deadline=None)
@given(SENTENCES.filter(str.strip))
def test_placeholders_in_a_subtitle_come_back_too(text: str) -> None:
    sent = f"1\n00:00:01,000 --> 00:00:02,000\n{text}\n\n"
    out = document_helpers.translate(SRT, sent.encode(), GARBLING).decode()
    number, timing, cue = out.split("\n", 2)
    assert (number, timing) == ("1", "00:00:01,000 --> 00:00:02,000")
    assert_translated(text, cue)


def test_numbered_tags_wrap_the_words_and_alternatives_keep_them_too() -> None:
    out = translate(FakeModel(), ["a <0>big</0> dog, <1>two <2>cats</2></1> %s."])
    assert out == ["A <0>BIG</0> DOG, <1>TWO <2>CATS</2></1> %s."]
    # An end tag without its start, and a start without its end: units, as sent.
    assert translate(FakeModel(), ["a </3> dog <4> runs"]) == ["A </3> DOG <4> RUNS"]
    # Each alternative is placed through its own alignment (the fake's k-th adds k tildes).
    alternatives = translate(FakeModel(), ["{n} dogs"], "text", beam_size=2, num_hypotheses=2)
    assert alternatives == ["{n} DOGS", "{n} DOGS~"]


def test_lines_and_whitespace_stay_as_sent() -> None:
    """Line breaks, a line's edges and whitespace between words are kept; a placeholder has
    one space where it had whitespace."""
    text = "  {a} dogs\n\nrun %s fast\tnow\r\n"
    assert translate(FakeModel(), [text]) == ["  {a} DOGS\n\nRUN %s FAST\tNOW\r\n"]


@pytest.fixture(scope="module")
def engine(shipped_bundle: Path) -> Engine:
    return Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)


def test_the_shipped_model_keeps_the_issues_placeholders(engine: Engine) -> None:
    texts = [
        "{count} dogs play in the snow.",
        "A man with %s is riding a bike.",
        "Hello {{name}}, two dogs play in the snow.",
        "A <0>man</0> is riding a bike.",
        "A man types `make test` in the park.",
    ]
    out = translate(engine, texts, "text", beam_size=4)
    assert out[0] == "{count} Hunde spielen im Schnee."
    assert out[1].count("%s") == 1 and out[1].startswith("Ein Mann")
    assert out[2].count("{{name}}") == 1 and "Hunde" in out[2]
    assert out[3].startswith("Ein <0>Mann</0> ")
    assert out[4].count("`make test`") == 1
    # A placeholder at a sentence's start stays there, after the sentence before's period.
    two = "A dog runs through the grass. {x}A cat sleeps."
    assert translate(engine, [two]) == ["Ein Hund rennt durch das Gras. {x}Eine Katze schläft."]


async def test_the_api_switch_and_a_requests_own_patterns() -> None:
    async with running(create_app(fast_settings(), models=[FakeModel()])) as client:

        async def text(**fields: object) -> httpx.Response:
            body = {"text": "hi {name} acme-1", "source": "en", "target": "de", **fields}
            return await client.post("/translate", json=body)

        assert (await text()).json()["translations"][0]["text"] == "HI {name} ACME-1"
        off = await text(placeholders=False)
        assert off.json()["translations"][0]["text"] == "HI {NAME} ACME-1"
        own = await text(placeholder_patterns=["acme-\\d"])
        assert own.json()["translations"][0]["text"] == "HI {name} acme-1"
        bad = await text(placeholder_patterns=["("])
        assert bad.status_code == 422 and "placeholder pattern 0" in bad.text
        libre = await client.post(
            "/libretranslate/translate",
            data={"q": "hi {name}", "source": "en", "target": "de", "placeholders": "false"},
        )
        assert libre.json()["translatedText"] == "HI {NAME}"
