"""Markdown files (service/documents/formats/markdown.py): inline content translated with its
emphasis and links as codes, everything else byte for byte; the output parses in markdown-it
to the same structure."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from service.documents.base import Limits
from service.documents.formats.markdown import MarkdownFormat
from service.inference.engine import Engine
from tests.service.document_helpers import identity, translate, unit_texts

MD = MarkdownFormat()
PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])

SOURCE = """---
title: A dog
tags: [a, b]
---
# Two *dogs* play ##

A man in a **blue** shirt rides a [red *bike*](http://x.com/a_b "The title") and `code_x`
with a [ref][r] and [r] and <http://auto.link> &amp; \\* star\u0020\u0020
hard break here.

> A quote *with* text
> that continues.

- item one <span>html</span>
- item ![alt](img.png) two
  continued

```python
print("keep me")
```

<div>
HTML block kept
</div>

| Name | Role |
|------|------|
| A *cat* | sits ~~down~~ |

[r]: http://ref.example "Ref"
"""


def shape(tokens: list[Token]) -> list[object]:
    """Every token's type, markup and attributes (links' targets), and the text of those
    that are not translated (code, HTML, fences), nested; soft line breaks are spaces (a
    translated paragraph is one line) and a run of text is one text."""
    out: list[object] = []
    for token in tokens:
        if token.type == "softbreak" or (token.type == "text" and out and out[-1][0] == "text"):
            continue
        kept = (
            token.content
            if token.type in ("code_inline", "fence", "html_block", "html_inline", "code_block")
            else None
        )
        out.append((token.type, token.markup, dict(token.attrs), kept))
        if token.children:
            out.append(shape(token.children))
    return out


def text_of(tokens: list[Token]) -> str:
    return "".join(
        " "
        if token.type == "softbreak"
        else token.content
        if token.type == "text"
        else text_of(token.children or [])
        for token in tokens
        if token.type in ("text", "inline", "softbreak")
    )


def test_inline_content_is_units_with_codes() -> None:
    units = unit_texts(MD, SOURCE.encode())
    assert units[0] == "<p>Two <c0>dogs</c0> play</p>"
    assert units[1].startswith(
        "<p>A man in a <c1>blue</c1> shirt rides a <c2>red <c3>bike</c3></c2> and <c4/> "
        "with a <c5>ref</c5> and <c6/> and <c7/> &amp; * star <c8/> hard break here.</p>"
    )
    assert re.fullmatch(r"<p>A <c(\d+)>cat</c\1></p>", units[-2])  # a table cell each
    assert re.fullmatch(r"<p>sits <c(\d+)>down</c\1></p>", units[-1])


def test_the_structure_stays_and_the_rest_comes_back_byte_for_byte() -> None:
    assert identity(MD, SOURCE.encode()) == SOURCE.encode()
    out = translate(MD, SOURCE.encode()).decode()
    front = "---\ntitle: A dog\ntags: [a, b]\n---\n"
    assert out.startswith(front)
    before, after = PARSER.parse(SOURCE[len(front) :]), PARSER.parse(out[len(front) :])
    # Same blocks and inline structure, link targets and titles, code, HTML (the inline
    # <span> and image are kept as written); the text in upper case but for the shortcut
    # link, whose text is its label, the autolink and the image's alt.
    assert shape(after) == shape(before)
    kept = {" R AND HTTP://AUTO.LINK": " r AND http://auto.link", "ALT": "alt"}
    expected = text_of(before).upper()
    for upper, source in kept.items():
        expected = expected.replace(upper, source)
    assert text_of(after) == expected
    for written in (
        '```python\nprint("keep me")\n```',
        "<div>\nHTML block kept\n</div>",
        '[r]: http://ref.example "Ref"',
    ):
        assert written in out
    assert 'A MAN IN A **BLUE** SHIRT RIDES A [RED *BIKE*](http://x.com/a_b "The title")' in out
    assert "\\* STAR  \nHARD BREAK HERE." in out  # the hard break stays one
    assert "> A QUOTE *WITH* TEXT THAT CONTINUES.\n" in out


def test_line_endings_and_encoding_stay() -> None:
    source = "# A *dog*\r\n\r\nIt runs.\r\n".encode("utf-16")
    assert translate(MD, source) == "# A *DOG*\r\n\r\nIT RUNS.\r\n".encode("utf-16")


def test_syntax_in_a_translation_is_escaped() -> None:
    extracted = MD.read(b"A dog.\n", Limits())
    assert extracted.write(["<p># 2 * 3 = [6] | &amp;copy; &amp; more</p>"]) == (
        b"\\# 2 \\* 3 = \\[6\\] \\| &amp;copy; & more\n"
    )


def test_the_real_model_puts_the_bold_on_the_translated_word(shipped_engine: Engine) -> None:
    source = b"A man in a **blue** shirt is riding a [bike](https://example.com/bike).\n"
    out = translate(MD, source, shipped_engine).decode()
    assert re.search(r"\*\*blau\w*\*\*", out), out
    assert re.search(r"\[Fahrrad\]\(https://example\.com/bike\)", out), out


# --- Any document: the identity writes it back byte for byte ----------------------------------

word = st.text("abcdefghijklmnopqrstuvwxyzäöü", min_size=1, max_size=7)
span = st.one_of(
    word,
    word.map("*{}*".format),
    word.map("**{}**".format),
    word.map("`{}`".format),
    st.builds("[{}](http://e.com/{})".format, word, word),
)
sentence = st.lists(span, min_size=1, max_size=6).map(" ".join).map(lambda s: s + ".")
block = st.one_of(
    sentence,
    sentence.map("# {}".format),
    st.lists(sentence, min_size=1, max_size=3).map(
        lambda items: "\n".join(f"- {i}" for i in items)
    ),
    sentence.map("> {}".format),
    word.map("```\n{}\n```".format),
    st.lists(sentence, min_size=2, max_size=2).map("{0[0]}\n{0[1]}".format),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(block, min_size=1, max_size=5), st.sampled_from(["\n", "\r\n"]))
def test_any_document_round_trips(blocks: list[str], newline: str) -> None:
    source = ("\n\n".join(blocks) + "\n").replace("\n", newline)
    assert identity(MD, source.encode()) == source.encode()
    out = translate(MD, source.encode()).decode()
    assert shape(PARSER.parse(out)) == shape(PARSER.parse(source))
    # (Spacing aside: the markup path may part a kept code from a lone "." by two spaces.)
    assert squeezed(text_of(PARSER.parse(out))) == squeezed(text_of(PARSER.parse(source)).upper())


def squeezed(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_placeholders_urls_and_addresses_are_codes_written_as_read() -> None:
    """Never escaped when written: `<0>` came back as `\\<0>`, `{user_name}` as
    `{user\\_name}` and a URL's or address's `_` as `\\_` (the markup stage kept them from the
    model, but the writer escaped them as text)."""
    sent = b"Hello {user_name}, see <0>the dogs</0> at https://x.org/a_b or mail a_b@x.org.\n"
    assert unit_texts(MD, sent) == [
        "<p>Hello <c0/>, see <c1/>the dogs<c2/> at <c3/> or mail <c4/>.</p>"
    ]
    assert translate(MD, sent) == (
        b"HELLO {user_name}, SEE <0>THE DOGS</0> AT https://x.org/a_b OR MAIL a_b@x.org.\n"
    )
