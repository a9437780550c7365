"""XLIFF 1.2 and 2.0 and gettext PO (service/documents/formats/localization.py): each source
without a translation gets one, marked for review; inline codes and placeholders come back as
they were; the output reads in polib, msgfmt and lxml."""

# ruff: noqa: E501 (the files below keep their long lines, as their tools write them)

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import polib
import pytest
from lxml import etree

from service.documents.base import Limits
from service.documents.formats.localization import PoFormat, XliffFormat
from service.documents.safe import DocumentError
from service.inference.engine import Engine
from tests.service.document_helpers import translate, unit_texts
from tests.service.helpers import GarblingModel

PO, XLIFF = PoFormat(), XliffFormat()

PO_FILE = """# Translations of the app.
msgid ""
msgstr ""
"Project-Id-Version: app 1.0\\n"
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);\\n"

#: src/main.c:10
#, c-format
msgid "Deleted %d of %1$s files in %(dir)s, {0} left"
msgstr ""

#: src/main.c:12
#, c-format
msgid "One dog"
msgid_plural "%d dogs"
msgstr[0] ""
msgstr[1] ""
msgstr[2] ""

#: src/main.c:14
msgid "Line one\\nline two"
msgstr ""

#: src/main.c:20
msgid "Already done"
msgstr "Schon fertig"

#: src/main.c:22
msgid "{count, plural, one {# file} other {# files}} found"
msgstr ""

#~ msgid "Old"
#~ msgstr "Alt"
"""


def test_po_units_hide_placeholders_from_the_model() -> None:
    assert unit_texts(PO, PO_FILE.encode()) == [
        "<p>Deleted <c0/> of <c1/> files in <c2/>, <c3/> left</p>",
        "<p>One dog</p>",
        "<p><c4/> dogs</p>",
        "<p>Line one <c5/> line two</p>",
        "<p><c6/> found</p>",
    ]


def test_a_template_placeholder_is_one_code_with_its_dollar() -> None:
    """`${user}` whole: its `$` reached the model as a word, and `{user}` was a code of its
    own (placed apart from it: "${user}dogs" came back "$DOGS{user}")."""
    sent = b'msgid ""\nmsgstr ""\n\nmsgid "Hello ${user}, two dogs run."\nmsgstr ""\n'
    assert unit_texts(PO, sent) == ["<p>Hello <c0/>, two dogs run.</p>"]
    (entry,) = polib.pofile(translate(PO, sent, GarblingModel()).decode())
    assert entry.msgstr == "HELLO ${user}, TWO DOGS RUN."


def test_a_po_entry_keeps_what_every_other_format_keeps() -> None:
    """The placeholders a request or another document keeps (service/text/placeholders.py):
    a template's {{name}}, numbered tags, code in backticks, a URL, an e-mail address."""
    text = "Ask {{name}} at help@example.org, see <0>https://example.org/a</0> or run `ls -l`."
    sent = f'msgid ""\nmsgstr ""\n\nmsgid "{text}"\nmsgstr ""\n'.encode()
    assert unit_texts(PO, sent) == ["<p>Ask <c0/> at <c1/>, see <c2/><c3/><c4/> or run <c5/>.</p>"]
    (entry,) = polib.pofile(translate(PO, sent, GarblingModel()).decode())
    assert entry.msgstr == (
        "ASK {{name}} AT help@example.org, SEE <0>https://example.org/a</0> OR RUN `ls -l`."
    )


def test_po_entries_are_translated_marked_fuzzy_and_plurals_filled() -> None:
    out = translate(PO, PO_FILE.encode())
    po = polib.pofile(out.decode())
    by_id = {entry.msgid: entry for entry in po}
    deleted = by_id["Deleted %d of %1$s files in %(dir)s, {0} left"]
    assert deleted.msgstr == "DELETED %d OF %1$s FILES IN %(dir)s, {0} LEFT"
    assert deleted.flags == ["c-format", "fuzzy"]
    dogs = by_id["One dog"]
    # Russian's first form is 1, 21, 31... dogs: the plural's translation, with its %d.
    assert dogs.msgstr_plural == {0: "%d DOGS", 1: "%d DOGS", 2: "%d DOGS"}
    assert by_id["Line one\nline two"].msgstr == "LINE ONE\nLINE TWO"
    assert by_id["{count, plural, one {# file} other {# files}} found"].msgstr == (
        "{count, plural, one {# file} other {# files}} FOUND"
    )
    # What had a translation, the header, the obsolete entry: as they were.
    assert by_id["Already done"].msgstr == "Schon fertig" and not by_id["Already done"].fuzzy
    text = out.decode()
    # The header and every entry not translated here: byte for byte.
    assert text.startswith(PO_FILE[: PO_FILE.index("#: src/main.c:10")])
    for kept in ('#: src/main.c:20\nmsgid "Already done"\nmsgstr "Schon fertig"\n',):
        assert kept in text
    assert text.endswith('#~ msgid "Old"\n#~ msgstr "Alt"\n')


def test_a_po_file_with_nothing_to_translate_comes_back_byte_for_byte() -> None:
    # Its long header line as written (polib rewrapped it), the entries, the obsolete one.
    done = PO_FILE.replace('msgstr ""\n\n#: src/main.c:12', 'msgstr "Fertig"\n\n#: src/main.c:12')
    done = done.replace(
        'msgstr[0] ""\nmsgstr[1] ""\nmsgstr[2] ""', 'msgstr[0] "a"\nmsgstr[1] "b"\nmsgstr[2] "c"'
    )
    done = done.replace('msgstr ""\n\n#: src/main.c:20', 'msgstr "x"\n\n#: src/main.c:20')
    done = done.replace('msgstr ""\n\n#~', 'msgstr "y"\n\n#~')
    extracted = PO.read(done.encode(), Limits())
    assert extracted.units == []
    assert extracted.write([]) == done.encode()


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="gettext's msgfmt is not installed")
def test_msgfmt_checks_the_translated_po_file(tmp_path: Path) -> None:
    path = tmp_path / "de.po"
    path.write_bytes(translate(PO, PO_FILE.encode()))
    checked = subprocess.run(
        ["msgfmt", "--check", "--use-fuzzy", "-o", str(tmp_path / "de.mo"), str(path)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_two_plural_forms_get_the_singular_and_the_plural() -> None:
    source = PO_FILE.replace("nplurals=3;", "nplurals=2;").replace('msgstr[2] ""\n', "")
    po = polib.pofile(translate(PO, source.encode()).decode())
    assert next(e for e in po if e.msgid == "One dog").msgstr_plural == {0: "ONE DOG", 1: "%d DOGS"}


def test_one_plural_form_gets_the_plural() -> None:
    source = PO_FILE.replace("nplurals=3; plural=(n%10==1", "nplurals=1; plural=0; x=(n%10==1")
    po = polib.pofile(translate(PO, source.encode()).decode())
    assert next(e for e in po if e.msgid == "One dog").msgstr_plural == {0: "%d DOGS"}


def test_what_is_not_a_po_file_is_refused() -> None:
    # polib would read a string naming a file as that file.
    with pytest.raises(DocumentError, match="not a PO file"):
        PO.read(b"/etc/passwd", Limits())
    with pytest.raises(DocumentError, match="not a PO file"):
        PO.read(b'msgid "a"\nmsgid "b"\nmsgstr "c"\n', Limits())
    # Every plural entry would hold as many forms as the header says.
    billions = PO_FILE.replace("nplurals=3;", "nplurals=99999999999;")
    with pytest.raises(DocumentError, match="a language has 1 to 16 forms"):
        PO.read(billions.encode(), Limits())


XLIFF_1 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" target-language="de" datatype="plaintext" original="app">
    <body>
      <trans-unit id="1">
        <source>A <g id="1" ctype="bold">big</g> dog<x id="2"/> runs <ph id="3">&lt;br/&gt;</ph> to %s.</source>
      </trans-unit>
      <trans-unit id="2">
        <source>Two <bpt id="4">&lt;i&gt;</bpt>cats<ept id="4">&lt;/i&gt;</ept> sleep.</source>
        <target/>
      </trans-unit>
      <trans-unit id="3">
        <source>Done</source>
        <target state="translated">Fertig</target>
      </trans-unit>
      <trans-unit id="4" translate="no">
        <source>Brand</source>
      </trans-unit>
    </body>
  </file>
</xliff>
"""

XLIFF_2 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en" trgLang="de">
  <file id="f1">
    <unit id="u1">
      <segment>
        <source>A <pc id="1" dataRefStart="d1">big</pc> dog <ph id="2"/>runs <sc id="3"/>fast<ec startRef="3"/>.</source>
      </segment>
      <segment state="final">
        <source>Done.</source>
        <target>Fertig.</target>
      </segment>
    </unit>
  </file>
</xliff>
"""

NS1 = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
NS2 = {"x": "urn:oasis:names:tc:xliff:document:2.0"}


def canonical(element: etree._Element) -> bytes:
    return etree.tostring(element, method="c14n")


def test_xliff_1_targets_with_codes_placed_and_marked_for_review() -> None:
    source = etree.fromstring(XLIFF_1.encode())
    out = etree.fromstring(translate(XLIFF, XLIFF_1.encode()))
    first, second, done, brand = out.iterfind(".//x:trans-unit", NS1)
    target = first.find("x:target", NS1)
    assert target.get("state") == "needs-review-translation"
    assert target.get("state-qualifier") == "mt-suggestion"
    assert "".join(target.itertext()) == "A BIG DOG RUNS <br/> TO %s."
    assert target.find("x:g", NS1).text == "BIG" and target.find("x:g", NS1).get("id") == "1"
    for name in ("x", "ph"):  # copies of the source's own elements
        (kept,) = target.iterfind(f"x:{name}", NS1)
        (original,) = source.iterfind(f".//x:trans-unit[@id='1']/x:source/x:{name}", NS1)
        assert canonical(kept).split(b">")[0] == canonical(original).split(b">")[0]
    assert [e.tag.split("}")[1] for e in second.find("x:target", NS1)] == ["bpt", "ept"]
    assert second.find("x:target", NS1).find("x:ept", NS1).tail == " SLEEP."
    # Translated before, or not to be translated: as they were.
    assert done.find("x:target", NS1).text == "Fertig"
    assert brand.find("x:target", NS1) is None
    for unit in (done, brand):
        original = source.find(f".//x:trans-unit[@id='{unit.get('id')}']", NS1)
        assert canonical(unit) == canonical(original)


def test_xliff_2_segments_are_translated_and_marked() -> None:
    out = etree.fromstring(translate(XLIFF, XLIFF_2.encode()))
    first, done = out.iterfind(".//x:segment", NS2)
    assert (first.get("state"), first.get("subState")) == ("translated", "mt:needs-review")
    target = first.find("x:target", NS2)
    assert target.find("x:pc", NS2).text == "BIG"
    assert [etree.QName(e).localname for e in target] == ["pc", "ph", "sc", "ec"]
    assert target.find("x:sc", NS2).tail == "FAST"
    assert done.get("state") == "final" and done.find("x:target", NS2).text == "Fertig."


def test_xliff_with_entities_or_of_another_kind_is_refused() -> None:
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><xliff>&a;</xliff>'
    with pytest.raises(DocumentError, match="entities"):
        XLIFF.read(bomb, Limits())
    with pytest.raises(DocumentError, match="not an XLIFF file"):
        XLIFF.read(b"<html/>", Limits())
    assert XLIFF.sniff(XLIFF_2.encode()) and not XLIFF.sniff(b"<html/>")
    assert PO.sniff(PO_FILE.encode()) and not PO.sniff(XLIFF_1.encode())


def test_the_real_model_puts_a_g_code_on_the_translated_word(shipped_engine: Engine) -> None:
    source = XLIFF_1.replace(
        'A <g id="1" ctype="bold">big</g> dog<x id="2"/> runs <ph id="3">&lt;br/&gt;</ph> to %s.',
        'A man in a <g id="1" ctype="bold">blue</g> shirt is riding a bike to %s.',
    )
    out = etree.fromstring(translate(XLIFF, source.encode(), shipped_engine))
    target = out.find(".//x:trans-unit[@id='1']/x:target", NS1)
    assert target.find("x:g", NS1).text.startswith("blau")
    assert "%s" in "".join(target.itertext())
