"""Real clients against `python -m service` serving the shipped model: Mastodon's LibreTranslate
requests exactly as its client sends them (app/lib/translation_service/libre_translate.rb: a JSON
body with q a list of status HTML, or a string in Mastodon before 4.2, source a language or
"auto", format "html", api_key null), and libretranslatepy."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.service.helpers import ServerProcess, server_process

MENTION = (
    '<span class="h-card" translate="no"><a href="https://mastodon.social/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>'
)
HASHTAG = (
    '<a href="https://mastodon.social/tags/dogs" class="mention hashtag" rel="tag">'
    "#<span>dogs</span></a>"
)
LINK = (
    '<a href="https://example.com/photos/12" target="_blank" rel="nofollow noopener" '
    'translate="no"><span class="invisible">https://</span><span class="">example.com/photos/12'
    '</span><span class="invisible"></span></a>'
)
STATUSES = [
    f"<p>{MENTION} A man in a <b>blue</b> shirt is playing the guitar.</p>"
    f"<p>Two dogs run through the snow &amp; play. {HASHTAG}</p>",
    f"<p>A woman sits on a bench.<br>Photos: {LINK}</p>",
]


@pytest.fixture(scope="module")
def server(shipped_bundle: Path) -> Iterator[ServerProcess]:
    args = ["--bundle", str(shipped_bundle), "--intra-op-threads", "1"]
    with server_process(args) as running:
        yield running


def mastodon_translate(url: str, q: str | list[str], source: str) -> dict[str, Any]:
    """Mastodon's request: Oj.dump of its fields, Content-Type application/json."""
    body = json.dumps({"q": q, "source": source, "target": "de", "format": "html", "api_key": None})
    response = httpx.post(
        f"{url}/libretranslate/translate",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


class _Text(HTMLParser):
    """The text content of our own (well-formed) output."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_of(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join("".join(parser.parts).split())


@pytest.mark.parametrize("source", ["en", "auto"])
def test_mastodon_statuses_come_back_translated_with_their_links_intact(
    server: ServerProcess, source: str
) -> None:
    data = mastodon_translate(server.url, STATUSES, source)
    first, second = data["translatedText"]
    for kept in (MENTION, HASHTAG):
        assert first.count(kept) == 1, first
    assert second.count(LINK) == 1 and "<br>" in second, second
    assert first.count("<p>") == 2 and first.count("<b>") == 1 and first.count("</b>") == 1
    assert "&amp;" in first or "&" not in text_of(first)  # an entity stays valid
    assert "Mann" in text_of(first) and "Hunde" in text_of(first)
    # What Mastodon reads: per status, detectedLanguage[i].language, or its own source.
    if source == "auto":
        assert [d["language"] for d in data["detectedLanguage"]] == ["en", "en"]
    else:
        assert "detectedLanguage" not in data


def test_mastodon_before_4_2_sends_one_status_as_a_string(server: ServerProcess) -> None:
    data = mastodon_translate(server.url, STATUSES[1], "en")
    assert isinstance(data["translatedText"], str) and LINK in data["translatedText"]


def test_the_html_text_is_the_plain_translation_of_its_sentences(server: ServerProcess) -> None:
    """Markup changes where the tags go, never the words: the text outside the tags is what the
    sentence gets as plain text."""
    html = "<p>A little girl in a <b>pink dress</b> climbs into a wooden playhouse.</p>"
    translated = mastodon_translate(server.url, [html], "en")["translatedText"][0]
    plain = httpx.post(
        f"{server.url}/translate",
        json={"text": text_of(html), "source": "en", "target": "de"},
        timeout=60,
    ).json()["translations"][0]["text"]
    assert text_of(translated) == plain
    assert translated.startswith("<p>") and translated.count("<b>") == 1


def test_libretranslatepy_translates_and_its_form_body_takes_format_html(
    server: ServerProcess,
) -> None:
    client = LibreTranslateAPI(f"{server.url}/libretranslate/")
    assert "Hund" in client.translate("A dog runs.", "en", "de")
    # libretranslatepy 2.1 has no format argument: its own form-encoded request, with format.
    form = urllib.parse.urlencode(
        {"q": "<p>A <i>dog</i> runs.</p>", "source": "en", "target": "de", "format": "html"}
    )
    request = urllib.request.Request(f"{server.url}/libretranslate/translate", data=form.encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        translated = json.loads(response.read())["translatedText"]
    assert translated.startswith("<p>") and translated.count("<i>") == 1
    assert "Hund" in text_of(translated)
