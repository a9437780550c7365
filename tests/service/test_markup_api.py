"""format html/xml and return_alignments through both APIs, in process over the fake engine
(it upper-cases and aligns every character to itself, so each tag must come back around the
same words): what a request gets, and how bad markup and models that cannot align are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.http.app import create_app
from tests.service.helpers import FakeModel, fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}
LT = "/libretranslate"
# Mastodon's markup for a status: paragraphs, a mention, a link with its invisible parts, a
# hashtag, a line break and an entity.
MENTION = (
    '<span class="h-card" translate="no"><a href="https://mastodon.social/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>'
)
LINK = (
    '<a href="https://example.com/a/page" target="_blank" rel="nofollow noopener" '
    'translate="no"><span class="invisible">https://</span><span class="ellipsis">example.com'
    '/a/</span><span class="invisible">page</span></a>'
)
HASHTAG = (
    '<a href="https://mastodon.social/tags/dogs" class="mention hashtag" rel="tag">'
    "#<span>dogs</span></a>"
)
STATUS = (
    f"<p>Thanks {MENTION}, two dogs run &amp; play.<br />Read {LINK} now.</p>"
    f"<p>A <b>big</b> dog sleeps. {HASHTAG}</p>"
)


@pytest.fixture
async def markup_client() -> AsyncIterator[httpx.AsyncClient]:
    async with running(create_app(fast_settings(), models=[FakeModel()])) as client:
        yield client


@pytest.mark.parametrize(
    ("extra", "aligned"),
    [({}, False), ({"format": "html"}, True), ({"return_alignments": True}, True)],
)
async def test_only_markup_and_return_alignments_ask_the_engine_for_alignments(
    extra: dict[str, Any], aligned: bool
) -> None:
    """A step skips the aligner's nodes for plain text (DecodingOptions.alignments)."""
    fake = FakeModel()
    async with running(create_app(fast_settings(), models=[fake])) as client:
        body = {"text": "<p>A <b>dog</b> runs.</p>", **EN_DE, **extra}
        assert (await client.post("/translate", json=body)).status_code == 200
    assert fake.calls[-1][1].alignments is aligned


async def test_only_sentences_with_an_edge_or_a_kept_thing_inside_ask_for_alignments() -> None:
    """The engine aligns a sentence only where markup reads its alignment: an element's edge
    or a kept thing inside it. One that an element wraps whole, or that has nothing around
    it, is placed whole (its first and last words), and comes back the same."""
    fake = FakeModel()
    texts = [
        "<p>A cat sits. A <b>dog</b> runs. <i>Birds fly.</i> Fish swim.</p>",
        "Hello {name}, read this. Then %s that. Bye.",
    ]
    async with running(create_app(fast_settings(), models=[fake])) as client:
        html = await client.post("/translate", json={"text": texts[0], **EN_DE, "format": "html"})
        plain = await client.post("/translate", json={"text": texts[1], **EN_DE})
    # As with every sentence's alignment: an element's span is its words, not the full stop.
    assert html.json()["translations"][0]["text"] == (
        "<p>A CAT SITS. A <b>DOG</b> RUNS. <i>BIRDS FLY</i>. FISH SWIM.</p>"
    )
    assert plain.json()["translations"][0]["text"] == "HELLO {name}, READ THIS. THEN %s THAT. BYE."
    asked = {
        "".join(map(chr, source[:-1])): options.alignments
        for sources, options in fake.calls
        for source in sources
    }
    assert {k: asked[k] for k in ("A cat sits.", "A dog runs.", "Birds fly.", "Fish swim.")} == {
        "A cat sits.": False,
        "A dog runs.": True,
        "Birds fly.": False,
        "Fish swim.": False,
    }
    assert asked["Hello, read this."] is True  # the placeholders are out of the sentences
    assert asked["Then that."] is True
    assert asked["Bye."] is False


async def test_html_comes_back_translated_with_its_tags_around_the_same_words(
    markup_client: httpx.AsyncClient,
) -> None:
    body = {"text": '<p>A <b>dog</b> runs &amp; <a href="/x" class="c">jumps</a>.</p>', **EN_DE}
    response = await markup_client.post("/translate", json={**body, "format": "html"})
    assert response.status_code == 200, response.text
    (translation,) = response.json()["translations"]
    assert translation["text"] == '<p>A <b>DOG</b> RUNS &amp; <a href="/x" class="c">JUMPS</a>.</p>'
    assert len(translation["segments"]) == 1
    # As plain text, the same request translates the markup's characters, tags and all.
    plain = await markup_client.post("/translate", json=body)
    assert plain.json()["translations"][0]["text"].startswith("<P>A <B>DOG</B>")


async def test_a_mastodon_status_keeps_its_mention_link_and_hashtag_byte_for_byte(
    markup_client: httpx.AsyncClient,
) -> None:
    response = await markup_client.post(
        f"{LT}/translate",
        json={
            "q": [STATUS, "<p>Two cats.</p>"],
            "source": "auto",
            "target": "de",
            "format": "html",
            "api_key": None,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    status, second = body["translatedText"]
    for kept in (MENTION, LINK, HASHTAG, "<br>"):
        assert kept in status
    assert "TWO DOGS RUN &amp; PLAY." in status and "<b>BIG</b>" in status
    assert second == "<p>TWO CATS.</p>"
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]
    single = await markup_client.post(
        f"{LT}/translate", json={"q": "<p>A dog.</p>", **EN_DE, "format": "html"}
    )
    assert single.json() == {"translatedText": "<p>A DOG.</p>"}


async def test_xml_keeps_its_structure_and_malformed_xml_names_the_text_and_position(
    markup_client: httpx.AsyncClient,
) -> None:
    xml = '<doc><title>A dog</title><p>A <em type="x">red</em> ball.</p></doc>'
    response = await markup_client.post("/translate", json={"text": xml, **EN_DE, "format": "xml"})
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["text"] == (
        '<doc><title>A DOG</title><p>A <em type="x">RED</em> BALL.</p></doc>'
    )
    response = await markup_client.post(
        "/translate", json={"text": [xml, "<doc><p>open</doc>"], **EN_DE, "format": "xml"}
    )
    assert response.status_code == 422  # the native API's invalid_request
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith("text 1: malformed XML at line 1, column ")


async def test_return_alignments_gives_each_sentences_tokens_and_links(
    markup_client: httpx.AsyncClient,
) -> None:
    response = await markup_client.post(
        "/translate", json={"text": "Go. Hi!", **EN_DE, "return_alignments": True}
    )
    assert response.status_code == 200, response.text
    (translation,) = response.json()["translations"]
    assert translation["text"] == "GO. HI!"
    first, second = translation["alignments"]
    assert (first["source"], first["target"]) == ("Go.", "GO.")
    assert first["source_tokens"] == [
        {"text": c, "start": i, "end": i + 1} for i, c in enumerate("Go.")
    ]
    assert first["pairs"] == [[0, 0], [1, 1], [2, 2]]
    # The attention behind the links, a row per target token: the fake's is the diagonal.
    assert first["weights"] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert second["target_tokens"][1] == {"text": "I", "start": 1, "end": 2}
    # Without the flag, no alignments field at all.
    response = await markup_client.post("/translate", json={"text": "Go.", **EN_DE})
    assert "alignments" not in response.json()["translations"][0]


async def test_a_hard_wrapped_sentence_is_translated_whole_and_keeps_its_line_breaks(
    markup_client: httpx.AsyncClient,
) -> None:
    text = "a dog runs\n  in the park. A cat\r\nsleeps."
    response = await markup_client.post(
        "/translate", json={"text": text, **EN_DE, "return_alignments": True}
    )
    assert response.status_code == 200, response.text
    (translation,) = response.json()["translations"]
    # Two sentences, each read by the model on one line; the line breaks come back.
    assert translation["text"] == "A DOG RUNS\n  IN THE PARK. A CAT\r\nSLEEPS."
    first, second = translation["alignments"]
    assert (first["source"], first["target"]) == (
        "a dog runs\n  in the park.",
        "A DOG RUNS\n  IN THE PARK.",
    )
    for sentence in (first, second):
        for side in ("source", "target"):
            for token in sentence[f"{side}_tokens"]:
                assert sentence[side][token["start"] : token["end"]] == token["text"]
    response = await markup_client.post(
        f"{LT}/translate", json={"q": text, "source": "en", "target": "de"}
    )
    assert response.json()["translatedText"] == translation["text"]


async def test_html_alignments_are_the_blocks_sentences(markup_client: httpx.AsyncClient) -> None:
    response = await markup_client.post(
        "/translate",
        json={
            "text": "<p>A <i>b</i>.</p><p>C.</p>",
            **EN_DE,
            "format": "html",
            "return_alignments": True,
        },
    )
    alignments = response.json()["translations"][0]["alignments"]
    assert [(a["source"], a["target"]) for a in alignments] == [("A b.", "A B."), ("C.", "C.")]


@pytest.mark.parametrize(
    ("format", "text", "read", "translation"),
    [
        # A line or block of format characters (a zero-width space) and a leading byte order
        # mark: not read (a real model invents a sentence for them), back as sent.
        (
            "text",
            "\ufeffA dog runs.\n\u200b\nA cat sleeps.",
            ["A dog runs.", "A cat sleeps."],
            "\ufeffA DOG RUNS.\n\u200b\nA CAT SLEEPS.",
        ),
        (
            "html",
            "\ufeff<p>A dog runs.</p><p>&#8203;</p>",
            ["A dog runs."],
            "\ufeff<p>A DOG RUNS.</p><p>\u200b</p>",
        ),
        # Nothing to translate (no letter): a sentence, a line, a cell or a paragraph of
        # emoji, digits or punctuation is not read (a real model invents a sentence for it).
        ("text", "Hello! 🙂\n123\n— 🙂 —", ["Hello!"], "HELLO! 🙂\n123\n— 🙂 —"),
        (
            "html",
            "<table><tr><td>2024</td><td>A dog.</td></tr></table><p>🙂 <b>5</b></p>",
            ["A dog."],
            "<table><tbody><tr><td>2024</td><td>A DOG.</td></tr></tbody></table><p>🙂 <b>5</b></p>",
        ),
        # In markup a sentence without a letter inside a paragraph with words is read: its
        # tags are placed by its alignment (kept, it lost its <b>'s content).
        (
            "html",
            "<p>Hello. <b>2024</b>. Bye.</p>",
            ["Hello.", "2024.", "Bye."],
            "<p>HELLO. <b>2024</b>. BYE.</p>",
        ),
        # A mention with a space inside its link is no space between words.
        (
            "html",
            '<p>Hello<a href="u"> @bob</a>, how are you?</p>',
            ["Hello, how are you?"],
            '<p>HELLO<a href="u"> @bob</a>, HOW ARE YOU?</p>',
        ),
        # The space an element holds parts the words on either side ("manrides" before).
        (
            "html",
            "<p>A man<span> </span>rides a bike.</p>",
            ["A man rides a bike."],
            "<p>A MAN<span> </span> RIDES A BIKE.</p>",
        ),
    ],
)
async def test_what_the_model_reads_of_invisible_characters_spaces_and_no_letters(
    format: str, text: str, read: list[str], translation: str
) -> None:
    fake = FakeModel()
    async with running(create_app(fast_settings(), models=[fake])) as client:
        fake.calls.clear()  # the warm-up's
        response = await client.post("/translate", json={"text": text, **EN_DE, "format": format})
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["text"] == translation
    sent = ["".join(map(chr, ids[:-1])) for sources, _ in fake.calls for ids in sources]
    assert sorted(sent) == sorted(read)  # a batch is sorted by length


@pytest.mark.parametrize(
    ("html", "translation"),
    [
        # An element's edge inside a whitespace word: the element takes its piece of the word
        # (a run of letters and digits), not the whole word ("HOME|ABOUT", "PARK.[1" before);
        # punctuation at the piece's edges stays outside, as around a word (<b>bike.</b>).
        (
            '<p><a href="/a">Home</a>|<a href="/b">About</a></p>',
            '<p><a href="/a">HOME</a>|<a href="/b">ABOUT</a></p>',
        ),
        (
            '<p>A dog runs.<sup><a href="#cite-1">[1]</a></sup> A cat sleeps.</p>',
            '<p>A DOG RUNS.[<sup><a href="#cite-1">1</a></sup>] A CAT SLEEPS.</p>',
        ),
        # A URL or mention taken out of its brackets comes back inside them.
        (
            "<p>See (https://example.com/docs) here.</p>",
            "<p>SEE (https://example.com/docs) HERE.</p>",
        ),
        ("<p>A man (@bob) rides.</p>", "<p>A MAN (@bob) RIDES.</p>"),
        # Inside a run of letters, the run is still read whole.
        ("<p>A <b>man</b><i>woman</i> rides.</p>", "<p>A <b>MANWOMAN</b><i></i> RIDES.</p>"),
    ],
)
async def test_an_element_inside_a_word_takes_its_piece_of_the_word(
    markup_client: httpx.AsyncClient, html: str, translation: str
) -> None:
    response = await markup_client.post(
        "/translate", json={"text": html, **EN_DE, "format": "html"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["text"] == translation


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"format": "html", "num_hypotheses": 2, "beam_size": 2}, "are for format text"),
        ({"format": "markdown"}, "format"),
    ],
)
async def test_what_markup_cannot_do_is_refused(
    markup_client: httpx.AsyncClient, extra: dict[str, Any], message: str
) -> None:
    response = await markup_client.post("/translate", json={"text": "<p>x</p>", **EN_DE, **extra})
    assert response.status_code in (400, 422)
    assert message in response.json()["error"]["message"]


async def test_a_model_without_alignments_serves_text_and_refuses_markup() -> None:
    model = FakeModel()
    model.aligns = False
    async with running(create_app(fast_settings(), models=[model])) as client:
        text = await client.post("/translate", json={"text": "A dog.", **EN_DE})
        assert text.json()["translations"][0]["text"] == "A DOG."
        for extra in ({"format": "html"}, {"return_alignments": True}):
            response = await client.post("/translate", json={"text": "A dog.", **EN_DE, **extra})
            assert response.status_code == 422
            assert "re-export it" in response.json()["error"]["message"]
        response = await client.post(f"{LT}/translate", json={"q": "x", **EN_DE, "format": "html"})
        assert response.status_code == 400 and "cannot align words" in response.json()["error"]


async def test_the_size_limit_counts_the_markup_as_sent() -> None:
    limit = 400
    async with running(
        create_app(fast_settings(max_characters=limit), models=[FakeModel()])
    ) as client:
        # Little text, much markup: over the limit as sent.
        html = "<p>" + '<span class="x">a</span>' * 20 + "</p>"
        assert len(html) > limit
        response = await client.post("/translate", json={"text": html, **EN_DE, "format": "html"})
        error = response.json()["error"]
        assert error["type"] == "input_too_long"
        assert error["message"].startswith(f"{len(html)} characters in one request")


_PIECES = [
    *"<>/=\"'&;#! abpiXY\n",
    *["<p>", "</p>", "<b>", "</b>", "<a href='x'>", "</a>", "<br>", "<!--", "-->", "<table>"],
    *["<td>", "<script>", "</script>", "&amp;", "&nbsp;", "&#0;", "<svg>", "@bob", "#tag"],
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_any_html_gets_a_translation_never_a_server_error(html: str) -> None:
    """Broken markup is repaired the way a browser repairs it; nothing reaches a 500."""

    async def check() -> None:
        async with running(create_app(fast_settings(), models=[FakeModel()])) as client:
            response = await client.post(
                "/translate", json={"text": html, **EN_DE, "format": "html"}
            )
            assert response.status_code == 200, (html, response.text)

    anyio.run(check)
