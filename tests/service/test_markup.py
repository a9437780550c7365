"""service/text/markup.py: HTML and XML to blocks of text and back around translations.

Invariants, on fixed examples and generated documents: an identity translation gives back the
input as the parser re-serialises it; any translation keeps every element, its attributes and
its nesting, keeps the untranslatable regions byte for byte, and puts exactly the translated
text in between. A fake projection stands for the word alignments.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree
from selectolax.lexbor import LexborHTMLParser, LexborNode

from service.text.markup import Document, MarkupError, Projection, parse, render
from service.text.segment import LETTER

# --- Fake translations --------------------------------------------------------------------------


class Identity:
    def span(self, start: int, end: int) -> tuple[int, int] | None:
        return start, end

    def point(self, position: int) -> int:
        return position


class Permutation:
    """A word-for-word translation of `source` (words between single spaces): target word j is
    `translate(source word order[j])`. span: the smallest target span covering the moved words;
    point: after the target of the word before it, else before the target of the next word,
    else 0."""

    def __init__(self, source: str, order: Sequence[int], translate: Any = str.upper) -> None:
        self.words: list[tuple[int, int]] = [
            (match.start(), match.end()) for match in re.finditer(r"[^ ]+", source)
        ]
        assert sorted(order) == list(range(len(self.words)))
        targets = [translate(source[start:end]) for start, end in self.words]
        self.target = " ".join(targets[i] for i in order)
        self.where: dict[int, tuple[int, int]] = {}
        position = 0
        for i in order:
            self.where[i] = (position, position + len(targets[i]))
            position += len(targets[i]) + 1

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        hit = [
            self.where[i]
            for i, (word_start, word_end) in enumerate(self.words)
            if word_start < end and word_end > start
        ]
        if not hit:
            return None
        return min(a for a, _ in hit), max(b for _, b in hit)

    def point(self, position: int) -> int:
        before = [i for i, (_, end) in enumerate(self.words) if end <= position]
        if before:
            return self.where[before[-1]][1]
        after = [i for i, (start, _) in enumerate(self.words) if start >= position]
        return self.where[after[0]][0] if after else 0


def identity(document: Document) -> list[tuple[str, Projection]]:
    return [(block, Identity()) for block in document.blocks]


def upper(document: Document) -> list[tuple[str, Projection]]:
    """Every word changed, none moved: the run is rebuilt, in place."""
    return [(block.upper(), Identity()) for block in document.blocks]


def reverse(document: Document) -> list[tuple[str, Projection]]:
    """Every word changed and the word order reversed."""
    translations: list[tuple[str, Projection]] = []
    for block in document.blocks:
        count = len(block.split(" "))
        permutation = Permutation(block, list(reversed(range(count))))
        translations.append((permutation.target, permutation))
    return translations


# --- What the output must keep ------------------------------------------------------------------

SPECIALS = (
    "https://example.com/a?b=1&c=2",
    "www.example.org",
    "@alice@mastodon.social",
    "@bob",
    "#FediTips",
    "mail@example.com",
)
BLOCKS = "p, div, li, h2, blockquote, br"  # what the generated HTML has of them
KEPT_TAGS = {"script", "style", "pre", "code", "kbd", "samp", "var", "textarea", "svg", "math"}
# Links, mentions, hashtags...: an inline element with only these for text is kept whole.
_LINKISH = re.compile(r"https?://\S+|www\.\S+|\w\S*@\S+|#\w+|@\w+(?:@[\w.-]+)?")
_ANY_SPECIAL = re.compile("|".join(re.escape(s) for s in sorted(SPECIALS, key=len, reverse=True)))


def html_tree(markup: str) -> LexborHTMLParser:
    fragment = not markup.lstrip().lower().startswith(("<!doctype", "<html"))
    return LexborHTMLParser(markup, is_fragment=fragment)


def reserialised(markup: str) -> str:
    return html_tree(markup).html or ""


def top_nodes(tree: LexborHTMLParser) -> list[LexborNode]:
    root = tree.root
    if root is None:
        return []
    return list(root.iter(include_text=True)) if root.parent is None else [root]


def html_kept(node: LexborNode) -> bool:
    """Kept whole by the rules: untranslatable tags, translate=no, notranslate, and inline
    elements whose text is only URLs, mentions... (Mastodon's links)."""
    if node.tag in KEPT_TAGS:
        return True
    attributes = node.attributes
    if attributes.get("translate") == "no" or "notranslate" in (attributes.get("class") or ""):
        return True
    if node.tag not in ("a", "span", "b", "i", "em") or node.css_first(BLOCKS) is not None:
        return False
    text = html_text(list(node.iter(include_text=True)))
    return bool(text.strip()) and not _LINKISH.sub("", text).strip()


def html_shape(nodes: Sequence[LexborNode], translated: Any = None) -> list[Any]:
    """Elements and comments with their attributes (in order) and nesting, text left out;
    siblings sorted, since a translation may reorder them. `translated`: what alt and title
    values become, outside kept elements."""
    shape = []
    for node in nodes:
        if node.is_comment_node:
            shape.append(("#comment", node.html))
        elif node.is_element_node:
            inner = None if translated is None or html_kept(node) else translated
            children = html_shape(list(node.iter(include_text=True)), inner)
            attributes = [
                (name, inner(value) if inner and name in ("alt", "title") else value)
                for name, value in ((name, value or "") for name, value in node.attributes.items())
            ]
            shape.append((node.tag, attributes, children))
    return sorted(shape, key=repr)


def html_kept_parts(nodes: Sequence[LexborNode]) -> Counter[str]:
    parts: Counter[str] = Counter()
    for node in nodes:
        if node.is_comment_node:
            parts[node.html or ""] += 1
        elif node.is_element_node:
            if html_kept(node):
                parts[node.html or ""] += 1
            else:
                parts.update(html_kept_parts(list(node.iter(include_text=True))))
    return parts


def html_text(nodes: Sequence[LexborNode]) -> str:
    """The translatable text: text nodes outside kept elements."""
    out = []
    for node in nodes:
        if node.tag == "-text":
            out.append(node.text_content or "")
        elif node.is_element_node and not html_kept(node):
            out.append(html_text(list(node.iter(include_text=True))))
    return "".join(out)


def squeeze(text: str) -> str:
    """Text with URLs, mentions... and all whitespace removed."""
    return re.sub(r"\s+", "", _ANY_SPECIAL.sub("", text))


def letters(text: str) -> str:
    """The letters of `squeeze(text)`: what the translations hold of a document's text (a run
    without a letter, "1<2", has nothing to translate and stays as it is)."""
    return "".join(LETTER.findall(squeeze(text)))


def assert_html_translated(
    markup: str, output: str, translations: Sequence[tuple[str, Projection]]
) -> None:
    # Both through serialise and parse once: HTML with misnested <a>s, say, does not come back
    # from one round as it was parsed.
    source = top_nodes(html_tree(reserialised(markup)))
    result = top_nodes(html_tree(output))
    assert html_shape(result) == html_shape(source)
    assert html_kept_parts(result) == html_kept_parts(source)
    specials_in = Counter(_ANY_SPECIAL.findall(html_text(source)))
    assert Counter(_ANY_SPECIAL.findall(html_text(result))) == specials_in
    assert letters(html_text(result)) == letters("".join(t for t, _ in translations))


# --- Fixed examples ---------------------------------------------------------------------------

MASTODON = (
    '<p>Hello <span class="h-card" translate="no"><a href="https://mastodon.social/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>! Fish &amp; chips tonight, see '
    '<a href="https://example.com/menu" rel="nofollow noopener" target="_blank">'
    '<span class="invisible">https://</span><span class="">example.com/menu</span>'
    '<span class="invisible"></span></a></p><p>Second line<br />third line '
    '<a href="https://mastodon.social/tags/food" class="mention hashtag" rel="tag">'
    "#<span>food</span></a></p>"
)
MASTODON_LINKS = (
    '<span class="h-card" translate="no"><a href="https://mastodon.social/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>',
    '<a href="https://example.com/menu" rel="nofollow noopener" target="_blank">'
    '<span class="invisible">https://</span><span class="">example.com/menu</span>'
    '<span class="invisible"></span></a>',
    '<a href="https://mastodon.social/tags/food" class="mention hashtag" rel="tag">'
    "#<span>food</span></a>",
)

EXAMPLES = [
    MASTODON,
    "",
    "   ",
    "plain text, no tags",
    "<p>a <b>b <i>c</b> d</i></p>",
    "<table><p>x</table>",
    "<p>one<p>two<div>three</div>",
    "<p>stray</div> end</p>",
    "<ul><li>a <b>bold</b> item<li>second</ul>",
    "<div>Hi <b>there <p>para</p> tail</b> end</div>",
    "<p>Run <code>ls -l</code> to list, <kbd>Ctrl</kbd>+<kbd>C</kbd> to stop.</p>",
    '<p>Keep <span class="notranslate">Brand Name</span> and <b translate="no">X</b>.</p>',
    "<p>a&nbsp;b &lt;tag&gt; &amp; &quot;q&quot; caf&eacute;</p>",
    "<p>See https://example.com/a?b=1&amp;c=2, www.example.org or mail@example.com.</p>",
    "<p>Hi @bob and @alice@mastodon.social #FediTips!</p>",
    '<p>A <img src="x.png" alt="a cat"> and <input value="v"> here</p>',
    "<p>  lots   of\n\twhitespace  <b> inside </b>  </p>",
    "<p>comment <!-- not text --> between</p><!-- top -->",
    "<p><script>if (a < b) { x(); }</script>text<style>p > b {}</style></p>",
    "<pre>  keep\n  me  </pre><p>but <em>translate</em> me</p>",
    "<p><svg><text>no</text></svg> yes <math><mi>x</mi></math></p>",
    "<p><template><b>t</b></template>template</p>",
    "<p>x<sup>2</sup> and H<sub>2</sub>O</p>",
    '<p><a href="/x" title="tip"><b>bold link</b> text</a></p>',
    "<button>Save</button><button>Cancel</button>",
    "<label>Name <input name=n></label>",
    "<select><option>One<option>Two</select>",
    "<!DOCTYPE html><html><head><title>The  title</title></head><body><p>Body</p></body></html>",
    "  <!doctype html><p>implied document",
    "<HTML><body>upper case html</body></HTML>",
    "<p>\u00e9t\u00e9 \u4e2d\u6587 \U0001f600 emoji</p>",
    "<noscript>Enable JavaScript</noscript><p>x</p>",
    "<p><b></b><i> </i>empty inline elements</p>",
    "<p>br<br>inside<br/>runs</p>",
    "<dl><dt>Term<dd>Definition <abbr title='x'>abbr</abbr></dl>",
]


@pytest.mark.parametrize("markup", EXAMPLES)
def test_identity_gives_the_input_back_as_reserialised(markup: str) -> None:
    document = parse(markup, "html")
    assert render(document, identity(document)) == reserialised(markup)


@pytest.mark.parametrize("markup", EXAMPLES)
@pytest.mark.parametrize("translate", [upper, reverse], ids=["upper", "reverse"])
def test_translations_keep_elements_kept_regions_and_text(markup: str, translate: Any) -> None:
    document = parse(markup, "html")
    translations = translate(document)
    assert_html_translated(markup, render(document, translations), translations)


def test_blocks_of_a_mastodon_status() -> None:
    assert parse(MASTODON, "html").blocks == [
        "Hello ! Fish & chips tonight, see",
        "Second line",
        "third line",
    ]


def test_mastodon_links_come_back_byte_for_byte() -> None:
    document = parse(MASTODON, "html")
    for translate in (upper, reverse):
        output = render(document, translate(document))
        for link in MASTODON_LINKS:
            assert output.count(link) == 1, (link, output)
        assert "<br>" in output and "&amp;" in output
        assert not output.startswith("<html") and "<body>" not in output


def test_mastodon_status_in_upper_case() -> None:
    document = parse(MASTODON, "html")
    assert render(document, upper(document)) == (
        f"<p>HELLO {MASTODON_LINKS[0]}! FISH &amp; CHIPS TONIGHT, SEE {MASTODON_LINKS[1]}</p>"
        f"<p>SECOND LINE<br>THIRD LINE {MASTODON_LINKS[2]}</p>"
    )


def test_a_tag_follows_its_word_to_where_it_went() -> None:
    document = parse("a <b>blue</b> shirt", "html")
    assert document.blocks == ["a blue shirt"]
    projection = Permutation("a blue shirt", [0, 2, 1])
    assert projection.target == "A SHIRT BLUE"
    assert render(document, [(projection.target, projection)]) == "A SHIRT <b>BLUE</b>"


def test_french_word_order() -> None:
    french = {"a": "une", "blue": "bleue", "shirt": "chemise"}
    projection = Permutation("a blue shirt", [0, 2, 1], french.__getitem__)
    document = parse("<p>a <b>blue</b> shirt</p>", "html")
    assert render(document, [(projection.target, projection)]) == "<p>une chemise <b>bleue</b></p>"


class Fixed:
    """A projection given as tables."""

    def __init__(
        self, spans: dict[tuple[int, int], tuple[int, int] | None], points: dict[int, int]
    ) -> None:
        self.spans, self.points = spans, points

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        return self.spans[(start, end)]

    def point(self, position: int) -> int:
        return self.points[position]


def test_overlapping_siblings_are_made_disjoint_and_an_emptied_one_stays() -> None:
    # "x <b>one</b> <i>two</i>": both elements aligned to the same target word.
    document = parse("<p>x <b>one</b> <i>two</i></p>", "html")
    assert document.blocks == ["x one two"]
    projection = Fixed({(2, 5): (2, 7), (6, 9): (2, 7)}, {})
    output = render(document, [("X UNDOS", projection)])
    assert output == "<p>X <b>UNDOS</b><i></i></p>"
    partial = Fixed({(2, 5): (0, 5), (6, 9): (3, 11)}, {})  # "AA BB" and "BB CC DD"
    output = render(document, [("AA BB CC DD", partial)])
    assert output == "<p><b>AA BB</b> <i>CC DD</i></p>"


def test_a_child_is_clipped_to_its_parent() -> None:
    document = parse("<p><b>big <i>red</i></b> dog</p>", "html")
    assert document.blocks == ["big red dog"]
    projection = Fixed({(0, 7): (0, 4), (4, 7): (0, 10)}, {})
    assert render(document, [("GROS CHIEN", projection)]) == "<p><b><i>GROS</i></b> CHIEN</p>"


def test_an_unaligned_element_goes_to_the_point_of_its_start() -> None:
    document = parse("<p>see <b>this</b> now</p>", "html")
    projection = Fixed({(4, 8): None}, {4: 3})
    assert render(document, [("VOIR MAINTENANT", projection)]) == ("<p>VOI<b></b>R MAINTENANT</p>")


def test_kept_items_keep_their_spacing_and_order_at_one_point() -> None:
    document = parse("<p>see https://a.example/x @bob now</p>", "html")
    assert document.blocks == ["see now"]
    projection = Fixed({}, {3: 0})
    assert render(document, [("MAINTENANT VOIR", projection)]) == (
        "<p>https://a.example/x @bob MAINTENANT VOIR</p>"
    )
    document = parse("<p>Hello @bob!</p>", "html")
    assert document.blocks == ["Hello !"]
    assert render(document, upper(document)) == "<p>HELLO @bob!</p>"


def test_a_kept_node_stays_inside_its_element() -> None:
    document = parse('<p>a <b>bold <img src="i.png"> word</b> end</p>', "html")
    translations = reverse(document)
    output = render(document, translations)
    assert output == '<p>END <b>WORD BOLD <img src="i.png"></b> A</p>'


def test_entities_round_trip() -> None:
    document = parse("<p>a&nbsp;b &amp; &lt;c&gt; &#169;</p>", "html")
    assert document.blocks == ["a\u00a0b & <c> \u00a9"]
    assert render(document, upper(document)) == "<p>A&nbsp;B &amp; &lt;C&gt; \u00a9</p>"


def test_a_fragment_stays_a_fragment_and_a_document_a_document() -> None:
    fragment = parse("<p>x</p>", "html")
    assert render(fragment, upper(fragment)) == "<p>X</p>"
    document = parse("\n <!DOCTYPE html><p>x</p>", "html")
    assert render(document, upper(document)) == (
        "<!DOCTYPE html><html><head></head><body><p>X</p></body></html>"
    )


def test_a_document_may_start_with_comments_and_processing_instructions() -> None:
    markup = (
        "<!-- generated --><!DOCTYPE html><html lang=en><head><title>Hi</title></head>"
        "<body class=x><p>A dog.</p></body></html>"
    )
    document = parse(markup, "html")
    assert render(document, upper(document)) == (
        '<!-- generated --><!DOCTYPE html><html lang="en"><head><title>HI</title></head>'
        '<body class="x"><p>A DOG.</p></body></html>'
    )
    document = parse("<?xml version='1.0'?>\n<html><body><p>A dog.</p></body></html>", "html")
    assert render(document, upper(document)) == (
        "<!--?xml version='1.0'?--><html><head></head><body><p>A DOG.</p></body></html>"
    )
    fragment = parse("<!-- c --><p>x</p>", "html")
    assert render(fragment, upper(fragment)) == "<!-- c --><p>X</p>"


def test_a_byte_order_mark_is_not_text_and_starts_the_output_again() -> None:
    document = parse("\ufeff<!DOCTYPE html><html><body><p>A dog.</p></body></html>", "html")
    assert document.blocks == ["A dog."]
    assert render(document, upper(document)) == (
        "\ufeff<!DOCTYPE html><html><head></head><body><p>A DOG.</p></body></html>"
    )
    fragment = parse("\ufeff<p>A dog.</p>", "html")
    assert fragment.blocks == ["A dog."]
    assert render(fragment, upper(fragment)) == "\ufeff<p>A DOG.</p>"
    xml = parse("\ufeff<doc><p>A dog.</p></doc>", "xml")
    assert render(xml, upper(xml)) == "\ufeff<doc><p>A DOG.</p></doc>"


def test_invisible_characters_alone_are_not_blocks_and_inside_words_stay() -> None:
    markup = (
        "<p>A dog.</p><p>&#8203;</p><p>\u2060 \ufeff\u200c</p><p>A <b>\u200b</b>cat.</p>"
        "<p>A co\u00adoperative \U0001f468\u200d\U0001f467 family.</p>"
    )
    document = parse(markup, "html")
    assert document.blocks == [
        "A dog.",
        "A cat.",
        "A co\u00adoperative \U0001f468\u200d\U0001f467 family.",
    ]
    assert render(document, identity(document)) == reserialised(markup)
    assert render(document, upper(document)) == (
        "<p>A DOG.</p><p>\u200b</p><p>\u2060 \ufeff\u200c</p><p>A <b>\u200b</b>CAT.</p>"
        "<p>A CO\u00adOPERATIVE \U0001f468\u200d\U0001f467 FAMILY.</p>"
    )


@pytest.mark.parametrize("space", ["<span> </span>", "<b>&nbsp;</b>", '<a href="#"> </a>'])
def test_an_element_holding_only_a_space_keeps_the_words_around_it_apart(space: str) -> None:
    markup = f"<p>A man{space}rides a bike.</p>"
    document = parse(markup, "html")
    assert document.blocks == ["A man rides a bike."]
    assert render(document, identity(document)) == reserialised(markup)
    assert render(document, upper(document)) == f"<p>A MAN{space} RIDES A BIKE.</p>"


def test_attributes_are_blocks_only_when_asked() -> None:
    markup = '<p title="A tip">Look <img src="c.png" alt="a  cat"> here</p>'
    assert parse(markup, "html").blocks == ["Look here"]
    document = parse(markup, "html", translate_attributes=True)
    assert document.blocks == ["A tip", "Look here", "a cat"]
    output = render(document, upper(document))
    assert output == '<p title="A TIP">LOOK <img src="c.png" alt="A CAT"> HERE</p>'
    assert render(document, identity(document)) == reserialised(markup)


def test_spacers_and_link_only_elements_are_not_blocks() -> None:
    markup = '<p>&nbsp;</p><p><a href="https://x.org" title="Go">https://x.org</a></p>'
    document = parse(markup, "html", translate_attributes=True)
    assert document.blocks == []
    assert render(document, []) == reserialised(markup)


def test_a_document_renders_again_and_again() -> None:
    document = parse(MASTODON, "html")
    first = render(document, reverse(document))
    assert render(document, upper(document)) != first
    assert render(document, reverse(document)) == first
    assert render(document, identity(document)) == reserialised(MASTODON)


def test_translations_must_match_blocks() -> None:
    document = parse("<p>a</p><p>b</p>", "html")
    with pytest.raises(ValueError, match="2 blocks"):
        render(document, [("A", Identity())])


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        parse("<p>x</p>", "json")  # type: ignore[arg-type]


# --- Hostile HTML -----------------------------------------------------------------------------

HOSTILE = [
    "<p>a <b>b <i>c</b> d</i>",
    "</div></div></p><p>",
    "<table><td>cell<p>para<tr>row</table>",
    "<<<>>>&&&;;;<!-- <!-- --> -->",
    "<b" * 1000,
    "<b>" * 5000 + "deep",
    "<span>" * 3000 + "deep" + "</span>" * 10,
    "<div>" * 2000 + "deep",
    "<p>" + "<a href=x>" * 500 + "links",
    "\x00\x01\x02\ufffd\ud800 binary \udfff junk",
    "<svg><foreignObject><p>inside <b>svg</b></p></foreignObject></svg>",
    "<math><mtext><p>inside math</p></mtext></math>",
    "<frameset><frame></frameset>text",
    "<?php echo 1; ?><p>x</p>",
    "<plaintext><p>not a tag",
    "<textarea><p>not a tag</textarea>after",
    "<select><div><option>odd</option></div></select>",
    "<p>" + "word " * 20000 + "</p>",
    "<!-- -->" * 20000 + "<p>not a document",  # looked at once, not once per comment
]


@pytest.mark.parametrize("markup", HOSTILE, ids=range(len(HOSTILE)))
def test_broken_html_never_raises(markup: str) -> None:
    document = parse(markup, "html")
    for translate in (identity, upper, reverse):
        render(document, translate(document))


def test_lexbor_repairs_broken_html_as_the_html5_algorithm_does() -> None:
    """The reason for selectolax (benchmarks/markup_parsers.py): its trees are the spec's."""
    from benchmarks.markup_parsers import BROKEN, PARSERS

    _, body = PARSERS["selectolax (Lexbor)"]()
    assert [body(broken) for broken, _ in BROKEN] == [expected for _, expected in BROKEN]


def test_elements_nested_too_deep_are_kept() -> None:
    markup = "<div>" * 300 + "deep" + "</div>" * 300 + "<p>shallow</p>"
    document = parse(markup, "html")
    assert document.blocks == ["shallow"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("<>&/=\"' !-"), max_size=300)
)
def test_any_text_parses_and_renders(markup: str) -> None:
    document = parse(markup, "html")
    render(document, reverse(document))


# --- Generated HTML ---------------------------------------------------------------------------

WORDS = st.sampled_from(
    ["cat", "Dog", "blue", "shirt", "a", "x&amp;y", "1&lt;2", "it's", "caf&eacute;", "a&nbsp;b"]
)
SPACES = st.sampled_from([" ", "  ", "\n", "\n  ", "\t"])
ATTRIBUTES = st.lists(
    st.sampled_from(
        [
            'class="c"',
            'id="i"',
            'href="https://e.com/?a=1&amp;b=2"',
            'title="A tip"',
            'data-x="&lt;&quot;"',
            "lang=en",
            "hidden",
        ]
    ),
    max_size=3,
    unique=True,
)
KEPT = st.sampled_from(
    [
        "<!-- a comment -->",
        "<script>if (a < b && c) { x(); }</script>",
        "<code>f(x) &lt; 2</code>",
        '<span class="notranslate">Keep Me</span>',
        '<b translate="no">no</b>',
        '<img src="i.png" alt="pic">',
        "<br>",
        MASTODON_LINKS[0],
        MASTODON_LINKS[1],
        MASTODON_LINKS[2],
    ]
)


@st.composite
def texts(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(WORDS | st.sampled_from(SPECIALS).map(html.escape), max_size=6))
    return "".join(token + draw(SPACES) for token in tokens)


def inline(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    @st.composite
    def element(draw: st.DrawFn) -> str:
        tag = draw(st.sampled_from(["b", "i", "a", "span", "em"]))
        attributes = "".join(" " + a for a in draw(ATTRIBUTES))
        inner = "".join(draw(st.lists(children, max_size=4)))
        close = draw(st.sampled_from([f"</{tag}>"] * 5 + [""]))  # sometimes left open
        return f"<{tag}{attributes}>{inner}{close}"

    return element()


INLINE = st.recursive(texts() | KEPT, inline, max_leaves=12)


def blocks(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    @st.composite
    def element(draw: st.DrawFn) -> str:
        tag = draw(st.sampled_from(["p", "div", "li", "h2", "blockquote"]))
        attributes = "".join(" " + a for a in draw(ATTRIBUTES))
        inner = "".join(draw(st.lists(children, max_size=4)))
        return f"<{tag}{attributes}>{inner}</{tag}>" + draw(SPACES)

    return element()


HTML = st.recursive(INLINE, blocks, max_leaves=20).map(lambda body: body) | st.lists(
    st.recursive(INLINE, blocks, max_leaves=10), max_size=4
).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HTML, st.booleans())
def test_generated_html(body: str, whole: bool) -> None:
    markup = f"<!DOCTYPE html><html><head><title>T</title></head><body>{body}</body></html>"
    markup = markup if whole else body
    document = parse(markup, "html")
    assert render(document, identity(document)) == reserialised(markup)
    for translate in (upper, reverse):
        translations = translate(document)
        assert_html_translated(markup, render(document, translations), translations)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HTML)
def test_generated_html_with_attributes(body: str) -> None:
    document = parse(body, "html", translate_attributes=True)
    assert render(document, identity(document)) == reserialised(body)
    output = render(document, upper(document))
    expected = html_shape(top_nodes(html_tree(reserialised(body))), translated=str.upper)
    assert html_shape(top_nodes(html_tree(output))) == expected


# --- XML --------------------------------------------------------------------------------------


ITS = "http://www.w3.org/2005/11/its"


def xml_tree(markup: str) -> Any:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, strip_cdata=False)
    return etree.fromstring(markup.encode(), parser)


def xml_reserialised(markup: str) -> str:
    return str(etree.tostring(xml_tree(markup).getroottree(), encoding="unicode"))


def xml_kept(element: Any) -> bool:
    if not isinstance(element.tag, str):
        return True
    return "no" in (element.get("translate"), element.get(f"{{{ITS}}}translate"))


def xml_shape(element: Any) -> Any:
    if not isinstance(element.tag, str):
        return ("#other", etree.tostring(element, with_tail=False))
    children = sorted((xml_shape(child) for child in element), key=repr)
    return (element.tag, list(element.items()), children)


def xml_kept_parts(element: Any) -> Counter[bytes]:
    if xml_kept(element):
        return Counter([etree.tostring(element, with_tail=False)])
    parts: Counter[bytes] = Counter()
    for child in element:
        parts.update(xml_kept_parts(child))
    return parts


def xml_text(element: Any) -> str:
    out = [element.text or ""]
    for child in element:
        if not xml_kept(child):
            out.append(xml_text(child))
        out.append(child.tail or "")
    return "".join(out)


XML_EXAMPLES = [
    "<doc/>",
    "<doc>just text</doc>",
    "<doc><title>Hello world</title><p>Some <b>bold</b> text.</p></doc>",
    '<doc><p>Keep <b translate="no">this</b> and <!-- c --> <?pi x?>that</p></doc>',
    '<doc xmlns:its="http://www.w3.org/2005/11/its"><p>A <b its:translate="no">B</b> c</p></doc>',
    "<doc><list>\n  <item>one</item>\n  <item>two <i>2</i></item>\n</list></doc>",
    "<doc><p>a &amp; b &lt; c &#233;</p></doc>",
    '<doc><img alt="a cat" title="tip"/><p title="x">text</p></doc>',
    "<doc><p>x</p><p>see https://example.com/a?b=1&amp;c=2 and @bob</p></doc>",
    "<ns:doc xmlns:ns='urn:x'><ns:p>Prefixed <ns:b>bold</ns:b> text</ns:p></ns:doc>",
]


@pytest.mark.parametrize("markup", XML_EXAMPLES)
def test_xml_identity_gives_the_input_back(markup: str) -> None:
    document = parse(markup, "xml")
    assert render(document, identity(document)) == xml_reserialised(markup)


@pytest.mark.parametrize("markup", XML_EXAMPLES)
@pytest.mark.parametrize("translate", [upper, reverse], ids=["upper", "reverse"])
def test_xml_translations_keep_elements_kept_regions_and_text(markup: str, translate: Any) -> None:
    document = parse(markup, "xml")
    translations = translate(document)
    assert_xml_translated(markup, render(document, translations), translations)


def assert_xml_translated(
    markup: str, output: str, translations: Sequence[tuple[str, Projection]]
) -> None:
    source, result = xml_tree(markup), xml_tree(output)
    assert xml_shape(result) == xml_shape(source)
    assert xml_kept_parts(result) == xml_kept_parts(source)
    assert letters(xml_text(result)) == letters("".join(t for t, _ in translations))


def test_xml_blocks() -> None:
    document = parse(XML_EXAMPLES[2], "xml")
    assert document.blocks == ["Hello world", "Some bold text."]
    assert render(document, upper(document)) == (
        "<doc><title>HELLO WORLD</title><p>SOME <b>BOLD</b> TEXT.</p></doc>"
    )
    document = parse(XML_EXAMPLES[5], "xml")
    assert document.blocks == ["one", "two 2"]


def test_xml_declaration_doctype_entities_and_cdata_are_kept() -> None:
    markup = (
        '<?xml version="1.0" encoding="ISO-8859-1"?>\n'
        '<!DOCTYPE doc [<!ENTITY e "expanded">]>\n'
        "<doc><p>An &e; here</p><p>x <![CDATA[<b>raw</b>]]> y</p></doc>"
    )
    document = parse(markup, "xml")
    assert document.blocks == ["An here"]
    output = render(document, upper(document))
    assert output.startswith("<?xml version='1.0' encoding='UTF-8'?>\n<!DOCTYPE doc [")
    assert output.endswith("<doc><p>AN &e; HERE</p><p>x <![CDATA[<b>raw</b>]]> y</p></doc>")
    assert "expanded</p>" not in output


def test_xml_attributes() -> None:
    document = parse(XML_EXAMPLES[7], "xml", translate_attributes=True)
    assert document.blocks == ["a cat", "tip", "x", "text"]  # an element's own before its text
    assert render(document, upper(document)) == (
        '<doc><img alt="A CAT" title="TIP"/><p title="X">TEXT</p></doc>'
    )


@pytest.mark.parametrize(
    ("markup", "line", "column"),
    [
        ("<a><b>x</a>", 1, 12),
        ("<doc>\n  <p>unclosed\n</doc>", 3, 7),
        ("<a>&undefined;</a>", 1, 15),
        ("", 1, 1),
        ("text", 1, 1),
        ("<a/><b/>", 1, 5),
        ("<a>" * 300 + "</a>" * 300, 1, 0),
    ],
)
def test_malformed_xml_raises_markup_error(markup: str, line: int, column: int) -> None:
    with pytest.raises(MarkupError, match=r"malformed XML at line \d+, column \d+: ") as error:
        parse(markup, "xml")
    assert error.value.line == line
    if column:
        assert error.value.column == column
    assert isinstance(error.value, ValueError)


def test_xml_entities_are_never_expanded_from_outside() -> None:
    markup = '<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d><p>a &x; b</p></d>'
    document = parse(markup, "xml")
    assert document.blocks == ["a b"]
    assert "root:" not in render(document, upper(document))


XML_NAMES = st.sampled_from(["para", "b", "i", "note", "item"])
XML_WORDS = st.sampled_from(["cat", "Dog", "x&amp;y", "1&lt;2", "&#233;t&#233;", "blue"])
XML_KEPT = st.sampled_from(
    ["<!-- c -->", "<?pi data?>", '<code translate="no">f(x)</code>', '<k translate="no"/>']
)


@st.composite
def xml_texts(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(XML_WORDS | st.sampled_from(SPECIALS).map(html.escape), max_size=5))
    return "".join(token + draw(SPACES) for token in tokens)


def xml_elements(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    @st.composite
    def element(draw: st.DrawFn) -> str:
        name = draw(XML_NAMES)
        attributes = draw(
            st.lists(st.sampled_from(['id="i"', 'class="c &amp; d"', 'n="1"']), max_size=2)
        )
        written = "".join(" " + a for a in dict.fromkeys(attributes))
        inner = "".join(draw(st.lists(children, max_size=4)))
        return f"<{name}{written}>{inner}</{name}>"

    return element()


XML = st.recursive(xml_texts() | XML_KEPT, xml_elements, max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(XML)
def test_generated_xml(body: str) -> None:
    markup = f"<doc>{body}</doc>"
    document = parse(markup, "xml")
    assert render(document, identity(document)) == xml_reserialised(markup)
    for translate in (upper, reverse):
        translations = translate(document)
        assert_xml_translated(markup, render(document, translations), translations)
