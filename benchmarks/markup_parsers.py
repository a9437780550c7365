"""Which HTML parser service/text/markup.py uses: speed and HTML5 correctness of selectolax
(Lexbor), lxml.html (libxml2) and html5lib, and what the markup stage costs end to end.

    python -m benchmarks.markup_parsers [--rounds 7] [--page PATH]

Speed: parse + serialise, µs per document (median of `--rounds` rounds), of a 600-byte Mastodon
status (a fragment) and of a ~50 KB web page (a whole document: generated here, deterministic,
or `--page`). Correctness: broken HTML whose repair the HTML5 tree-construction algorithm fixes
(what browsers build), each parser's tree against the spec's, compared as a canonical
serialisation of <body>'s content written here. Then this project's `parse` + `render` on the
same inputs (and an XML one) with the identity translation and an upper-casing one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

MASTODON = (
    '<p>Hello <span class="h-card" translate="no"><a href="https://mastodon.social/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>! The new release is out &amp; it '
    'fixes the <strong>search</strong> bug: <a href="https://example.com/releases/4.2" '
    'rel="nofollow noopener" target="_blank"><span class="invisible">https://</span>'
    '<span class="ellipsis">example.com/releases/4</span><span class="invisible">.2</span></a>'
    "</p><p>Thanks to everyone who tested it<br />and reported issues. "
    '<a href="https://mastodon.social/tags/FOSS" class="mention hashtag" rel="tag">'
    "#<span>FOSS</span></a> "
    '<a href="https://mastodon.social/tags/release" class="mention hashtag" rel="tag">'
    "#<span>release</span></a></p>"
)


def _words(words: str) -> list[str]:
    return words.split()


# (broken input, <body>'s content as the HTML5 algorithm builds it)
BROKEN = (
    ("<p>a <b>b <i>c</b> d</i>", "<p>a <b>b <i>c</i></b><i> d</i></p>"),
    ("<table><p>x</table>", "<p>x</p><table></table>"),
    ("<p>one<p>two<div>three", "<p>one</p><p>two</p><div>three</div>"),
    ("<div>a</div></div>b", "<div>a</div>b"),
    ("<b><p>x</b>y", "<b></b><p><b>x</b>y</p>"),
    ('<a href="1">x<a href="2">y', '<a href="1">x</a><a href="2">y</a>'),
    ("<p>x</p></p>", "<p>x</p><p></p>"),
    (
        "<table><tr><td>a<td>b</table>",
        "<table><tbody><tr><td>a</td><td>b</td></tr></tbody></table>",
    ),
    ("<i>a<div>b</i>c</div>", "<i>a</i><div><i>b</i>c</div>"),
    ("<p><div>x</div></p>", "<p></p><div>x</div><p></p>"),
)

_WORDS = _words(
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will more about up out who get which go me translation model server request words"
)


def web_page(target_bytes: int = 50_000, seed: int = 0) -> str:
    """A deterministic article page of about `target_bytes`: head with style and script, a nav,
    paragraphs with inline markup, lists, a table, a figure, a footer."""
    rng = random.Random(seed)

    def sentence(n: int) -> str:
        words = [rng.choice(_WORDS) for _ in range(n)]
        for i in range(len(words)):
            roll = rng.random()
            if roll < 0.05:
                words[i] = f'<a href="/wiki/{words[i]}_{i}" title="{words[i]}">{words[i]}</a>'
            elif roll < 0.08:
                words[i] = f"<em>{words[i]}</em>"
            elif roll < 0.10:
                words[i] = f"<code>{words[i]}()</code>"
        return " ".join(words).capitalize() + "."

    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>A page</title>'
        '<link rel="stylesheet" href="/s.css"><style>'
        + "".join(f".c{i} {{ margin: {i}px; color: #{i:03x}; }}\n" for i in range(60))
        + "</style><script>"
        + "".join(f"function f{i}(a) {{ return a < {i} && a > 0; }}\n" for i in range(60))
        + "</script></head>\n<body>"
    )
    nav = (
        "<nav><ul>"
        + "".join(f'<li><a href="/s/{i}">Section {i}</a></li>\n' for i in range(30))
        + "</ul></nav>\n"
    )
    parts = [head, nav, "<main><article><h1>Article title</h1>\n"]
    size = sum(map(len, parts))
    index = 0
    while size < target_bytes - 2_000:
        kind = index % 9
        if kind == 4:
            part = "<ul>" + "".join(f"<li>{sentence(8)}</li>" for _ in range(5)) + "</ul>\n"
        elif kind == 7:
            rows = "".join(
                f"<tr><td>{rng.choice(_WORDS)}</td><td>{rng.randint(1, 999)}</td></tr>"
                for _ in range(6)
            )
            part = f"<table><tr><th>Word</th><th>Count</th></tr>{rows}</table>\n"
        elif kind == 8:
            part = (
                f'<figure><img src="/i/{index}.png" alt="{sentence(4)}">'
                f"<figcaption>{sentence(6)}</figcaption></figure>\n"
            )
        else:
            part = f"<p>{sentence(rng.randint(12, 40))} {sentence(rng.randint(8, 20))}</p>\n"
        parts.append(part)
        size += len(part)
        index += 1
    parts.append("</article></main><footer><p>&copy; 2026 Someone &amp; others</p></footer>")
    parts.append("</body></html>\n")
    return "".join(parts)


# --- Canonical <body> content, to compare trees across libraries ------------------------------

_VOID = frozenset(_words("area base br col embed hr img input link meta source track wbr"))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _element(tag: str, attributes: Iterable[tuple[str, str | None]], inner: str) -> str:
    written = "".join(f' {name}="{_escape(value or "")}"' for name, value in attributes)
    if tag in _VOID:
        return f"<{tag}{written}>"
    return f"<{tag}{written}>{inner}</{tag}>"


def _canonical_lexbor(node: Any) -> str:
    out = []
    for child in node.iter(include_text=True):
        if child.tag == "-text":
            out.append(_escape(child.text_content or ""))
        elif child.is_element_node:
            out.append(_element(child.tag, child.attributes.items(), _canonical_lexbor(child)))
    return "".join(out)


def _canonical_etree(element: Any, strip: str = "") -> str:
    out = [_escape(element.text or "")]
    for child in element:
        if isinstance(child.tag, str):
            tag = child.tag[len(strip) :] if child.tag.startswith(strip) else child.tag
            out.append(_element(tag, child.attrib.items(), _canonical_etree(child, strip)))
        out.append(_escape(child.tail or ""))
    return "".join(out)


# --- The parsers: parse + serialise, and the canonical body -----------------------------------


def _selectolax() -> tuple[Callable[[str, bool], str], Callable[[str], str]]:
    from selectolax.lexbor import LexborHTMLParser

    def run(markup: str, fragment: bool) -> str:
        return LexborHTMLParser(markup, is_fragment=fragment).html or ""

    def body(markup: str) -> str:
        return _canonical_lexbor(LexborHTMLParser(markup).body)

    return run, body


def _lxml() -> tuple[Callable[[str, bool], str], Callable[[str], str]]:
    import lxml.html

    def run(markup: str, fragment: bool) -> str:
        if fragment:
            element = lxml.html.fragment_fromstring(markup, create_parent="div")
            return str(lxml.html.tostring(element, encoding="unicode"))
        return str(lxml.html.tostring(lxml.html.document_fromstring(markup), encoding="unicode"))

    def body(markup: str) -> str:
        return _canonical_etree(lxml.html.document_fromstring(markup).body)

    return run, body


def _html5lib() -> tuple[Callable[[str, bool], str], Callable[[str], str]]:
    import html5lib

    def run(markup: str, fragment: bool) -> str:
        tree = (
            html5lib.parseFragment(markup, container="div", treebuilder="etree")
            if fragment
            else html5lib.parse(markup, treebuilder="etree")
        )
        return str(html5lib.serialize(tree, tree="etree"))

    def body(markup: str) -> str:
        namespace = "{http://www.w3.org/1999/xhtml}"
        root = html5lib.parse(markup, treebuilder="etree")
        return _canonical_etree(root.find(f"{namespace}body"), namespace)

    return run, body


PARSERS = {
    "selectolax (Lexbor)": _selectolax,
    "lxml.html (libxml2)": _lxml,
    "html5lib": _html5lib,
}


def per_call_us(call: Callable[[], object], rounds: int, budget_s: float = 0.2) -> float:
    """Median over `rounds` of the mean time of one call, in µs; each round runs about
    `budget_s`."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(budget_s / once))
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(number):
            call()
        means.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(means)


class _Identity:
    """The projection of a word-for-word translation that moves nothing."""

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        return start, end

    def point(self, position: int) -> int:
        return position


def main(argv: list[str] | None = None) -> None:
    arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arguments.add_argument("--rounds", type=int, default=7)
    arguments.add_argument("--page", type=Path, help="a web page to measure instead of ours")
    options = arguments.parse_args(argv)
    page = options.page.read_text(encoding="utf-8") if options.page else web_page()

    print(f"Mastodon status: {len(MASTODON.encode())} bytes; page: {len(page.encode())} bytes")
    print()
    print("| parser | status µs | page µs | spec repairs |")
    print("|---|---|---|---|")
    for name, make in PARSERS.items():
        run, body = make()
        status_us = per_call_us(partial(run, MASTODON, True), options.rounds)
        page_us = per_call_us(partial(run, page, False), options.rounds)
        right = sum(body(broken) == expected for broken, expected in BROKEN)
        print(f"| {name} | {status_us:,.0f} | {page_us:,.0f} | {right}/{len(BROKEN)} |")
    print()
    for name, make in PARSERS.items():
        _, body = make()
        for broken, expected in BROKEN:
            got = body(broken)
            if got != expected:
                print(f"{name}: {broken!r} -> {got!r}, the spec builds {expected!r}")

    from service.text.markup import Format, parse, render

    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<doc><title>A title</title>'
        + "".join(f"<para>Some <b>bold</b> text number {i} &amp; more.</para>" for i in range(10))
        + "</doc>"
    )
    print()
    print("| service.text.markup | blocks | parse µs | render, identity µs | render, changed µs |")
    print("|---|---|---|---|---|")
    inputs: tuple[tuple[str, str, Format], ...] = (
        ("status", MASTODON, "html"),
        ("page", page, "html"),
        ("XML, 10 paragraphs", xml, "xml"),
    )
    for name, markup, kind in inputs:
        document = parse(markup, kind)
        identity = [(block, _Identity()) for block in document.blocks]
        changed = [(block.upper(), _Identity()) for block in document.blocks]
        parse_us = per_call_us(partial(parse, markup, kind), options.rounds)
        same_us = per_call_us(partial(render, document, identity), options.rounds)
        changed_us = per_call_us(partial(render, document, changed), options.rounds)
        print(
            f"| {name} | {len(document.blocks)} | {parse_us:,.0f} | {same_us:,.0f} "
            f"| {changed_us:,.0f} |"
        )


if __name__ == "__main__":
    main()
