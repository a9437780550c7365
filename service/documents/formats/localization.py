"""Localization files: XLIFF 1.2 and 2.x, gettext PO. Each source unit without a translation
is translated into its target; units already translated are left as they are.

Codes. XLIFF's inline elements are codes: those around text (1.2's `g` and `mrk`, 2.x's `pc`
and `mrk`) wrap the target words of their source words; the others (`x`, `bx`, `ex`, `ph`,
`bpt`, `ept`, `it`, `sc`, `ec`, `cp`, `sm`, `em`) are empty codes placed at the point their
source position aligns to, written back as copies of the source element (attributes, native
code and all). Placeholders in the text of every format are empty codes too, so the model
never reads them and they come back byte for byte: those every request and document keeps
(service/text/placeholders.py): printf's (`%s`, `%d`, `%1$s`, `%-5.2f`, `%@`, `%%`), Python's
(`%(name)s`, `{0}`, `{name}`, `{name!r:>10}`), templates' (`${name}`, `{{name}}`), ICU's
(`{count, plural, one {# file} other {# files}}`, kept whole, its inner messages
untranslated), numbered tags, code in backticks, URLs, e-mail addresses, @mentions and
#hashtags.
A line break is an empty code as well.

Marks. XLIFF 1.2: the new `<target>` has state="needs-review-translation" and
state-qualifier="mt-suggestion"; 2.x: the segment gets state="translated" and
subState="mt:needs-review" (2.0 section 4.3.1.32: a prefix, a colon, a value). PO: the entry
gets the `fuzzy` flag, which gettext's msgfmt leaves out of the compiled catalogue until a
translator clears it. A PO entry with a plural (msgid_plural) gets its singular's translation in
msgstr[0] and its plural's in msgstr[1] to msgstr[n-1], n from the file's Plural-Forms header
(2 without one; a language of one form, nplurals=1, gets the plural's).

Libraries. XLIFF is read and written with lxml (service/documents/safe.py's parser: no
entities, DTDs or network): a walk over `trans-unit` and `segment` that keeps every other
element as it was. PO with translate-toolkit 3.20 (maintained; lxml and one Rust wheel): it
writes an entry it did not change as it read it. polib 1.2.0 was measured against it on a
file written by hand and the same file after gettext's msgcat: translate-toolkit gave both
back byte for byte, polib neither (it rewraps long lines at its own width, and writes the
header's fields each on one line, which msgcat had wrapped).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lxml import etree
from translate.misc.multistring import multistring
from translate.storage import pypo

from service.documents.base import (
    Code,
    Extracted,
    Limits,
    Unit,
    append_text,
    inline,
    read_inline,
)
from service.documents.formats.plain import text_head, tight_breaks
from service.documents.safe import DocumentError, parse_xml, serialize_xml
from service.text.markup import kept_spans, translatable
from service.text.placeholders import Protection

# The built-in placeholders, as every other document format and a request keep them.
_PROTECTION = Protection()
_NEWLINE = "\n"


@dataclass(frozen=True)
class _Raw:
    """Text kept as it is: a placeholder, a line break."""

    text: str


@dataclass(frozen=True)
class _Element:
    """An XLIFF inline element: copied whole when `wraps` is False, else its start and end
    around the translated words it wraps."""

    element: Any  # lxml's _Element (no type hints)
    wraps: bool


class _Codes:
    """A file's codes and what each stands for."""

    def __init__(self) -> None:
        self.table: list[_Raw | _Element] = []

    def add(self, entry: _Raw | _Element, into: list[Code | str]) -> Code:
        self.table.append(entry)
        code = Code(len(self.table) - 1)
        into.append(code)
        return code

    def text(self, text: str, into: list[Code | str]) -> None:
        """`text` with its placeholders and line breaks as codes."""
        at = 0
        for start, end in _placeholders(text):
            _append(into, text[at:start])
            if text[start:end] == _NEWLINE:
                into.append(" ")
                self.add(_Raw(_NEWLINE), into)
                into.append(" ")
            else:
                self.add(_Raw(text[start:end]), into)
            at = end
        _append(into, text[at:])

    def written(self, children: Sequence[Code | str]) -> str:
        """Plain text from a translation's strings and codes (PO)."""
        return tight_breaks(self._written(children))

    def _written(self, children: Sequence[Code | str]) -> str:
        out = []
        for child in children:
            if isinstance(child, str):
                out.append(child)
                continue
            entry = self.table[child.index]
            out.append(entry.text if isinstance(entry, _Raw) else self._written(child.children))
        return "".join(out)

    def fill(self, parent: Any, children: Sequence[Code | str]) -> None:
        """`parent`'s content from a translation's strings and codes (XLIFF)."""
        for child in children:
            if isinstance(child, str):
                append_text(parent, child)
                continue
            entry = self.table[child.index]
            if isinstance(entry, _Raw):
                append_text(parent, entry.text)
            elif entry.wraps:
                element = etree.SubElement(parent, entry.element.tag, dict(entry.element.attrib))
                self.fill(element, child.children)
            else:
                element = copy.deepcopy(entry.element)
                element.tail = None
                parent.append(element)


def _append(into: list[Code | str], text: str) -> None:
    if text:
        into.append(text)


def _placeholders(text: str) -> list[tuple[int, int]]:
    """The spans of `text`'s placeholders (service/text/placeholders.py, URLs and the like
    included) and line breaks, in order, not overlapping."""
    spans = kept_spans(text, _PROTECTION)
    spans += [(m.start(), m.end()) for m in re.finditer(_NEWLINE, text)]
    spans.sort()
    kept: list[tuple[int, int]] = []
    for start, end in spans:
        if not kept or start >= kept[-1][1]:
            kept.append((start, end))
    return kept


def _translated(children: Sequence[Code | str]) -> bool:
    return translatable("".join(c for c in children if isinstance(c, str)))


# --- gettext PO --------------------------------------------------------------------------------

# Languages have at most 6 plural forms (Arabic's); a header saying millions would have every
# plural entry hold as many msgstr[n].
_MOST_PLURALS = 16


@dataclass(frozen=True)
class _PoUnit:
    """An entry's msgid or msgid_plural, and which msgstr[n] its translation goes to (none:
    the entry has no plural, msgstr)."""

    entry: Any  # translate-toolkit's pypo.pounit (no type hints)
    forms: range | None


@dataclass(frozen=True)
class _Po:
    store: Any  # translate-toolkit's pypo.pofile
    codes: _Codes
    found: list[tuple[_PoUnit, list[Code | str]]]
    nplurals: int

    @cached_property  # built once: the writer reads them again
    def units(self) -> Sequence[Unit]:
        return [inline(children) for _, children in self.found]

    def write(self, translations: Sequence[str]) -> bytes:
        if len(translations) != len(self.found):
            raise ValueError(f"{len(translations)} translations for {len(self.found)} units")
        plurals: dict[int, tuple[Any, list[str]]] = {}  # id(entry) -> the entry, its msgstr[n]
        for (unit, _), translation in zip(self.found, translations, strict=True):
            entry, text = unit.entry, self.codes.written(read_inline(translation))
            if unit.forms is None:
                entry.target = text
            else:
                forms = plurals.setdefault(id(entry), (entry, [""] * self.nplurals))[1]
                for n in unit.forms:
                    forms[n] = text
        for entry, forms in plurals.values():
            entry.target = multistring(forms)
        for unit, _ in self.found:  # once its target is whole (a plural's: all its forms)
            unit.entry.markfuzzy(True)
        try:
            return bytes(self.store)
        except UnicodeEncodeError:  # the file's charset cannot hold the translation: UTF-8
            self.store.updateheader(add=True, Content_Type="text/plain; charset=UTF-8")
            self.store.encoding = "UTF-8"
            return bytes(self.store)


class PoFormat:
    name = "po"
    extensions = (".po", ".pot")
    media_type = "text/x-gettext-translation"

    def sniff(self, data: bytes) -> bool:
        head = text_head(data)
        return head is not None and re.search(r'^msgid\s+"', head, re.MULTILINE) is not None

    def read(self, data: bytes, limits: Limits) -> Extracted:
        if not self.sniff(data):
            raise DocumentError("not a PO file: no msgid line in its first 4 KB")
        try:
            store = pypo.pofile.parsestring(data)  # type: ignore[no-untyped-call]
        # translate-toolkit's parser raises whatever its state machine trips on in a broken
        # file (ValueError, UnicodeError, AttributeError on msgid_plural without msgstr[n]).
        except Exception as e:
            raise DocumentError(f"not a PO file that can be read: {e}") from e
        declared = (store.getheaderplural() or (None, None))[0]
        nplurals = int(declared) if declared and str(declared).strip().isdigit() else 2
        if not 1 <= nplurals <= _MOST_PLURALS:
            raise DocumentError(
                f"the PO file's Plural-Forms says nplurals={nplurals}: a language has 1 to "
                f"{_MOST_PLURALS} forms"
            )
        codes = _Codes()
        found: list[tuple[_PoUnit, list[Code | str]]] = []
        characters = 0
        for entry in store.units:
            if entry.isheader() or entry.isobsolete() or _has_target(entry):
                continue
            for unit, source in _po_units(entry, nplurals):
                characters += len(source)
                children: list[Code | str] = []
                codes.text(source, children)
                if _translated(children):
                    found.append((unit, children))
        if characters > limits.max_characters:
            raise DocumentError(
                f"{characters} characters to translate, more than the limit of "
                f"{limits.max_characters}"
            )
        return _Po(store, codes, found, nplurals)


def _has_target(entry: Any) -> bool:
    target = entry.target
    strings = target.strings if isinstance(target, multistring) else [target]
    return any(strings)


def _po_units(entry: Any, nplurals: int) -> list[tuple[_PoUnit, str]]:
    """An entry's texts to translate, each with the forms it fills. msgstr[0] is the
    singular's only where the target's first form can be one thing alone: two forms (n != 1),
    or a singular with the plural's placeholders (msgfmt --check refuses "One file" in a
    first form that also says 21 files, as Russian's does)."""
    if not entry.hasplural():
        return [(_PoUnit(entry, None), str(entry.source))]
    singular, plural = (str(s) for s in entry.source.strings[:2])
    placeholders = sorted(singular[a:b] for a, b in _placeholders(singular))
    plural_placeholders = sorted(plural[a:b] for a, b in _placeholders(plural))
    first = 1 if nplurals > 1 and (nplurals == 2 or placeholders == plural_placeholders) else 0
    return [
        (_PoUnit(entry, range(first)), singular),
        (_PoUnit(entry, range(first, nplurals)), plural),
    ]


# --- XLIFF -------------------------------------------------------------------------------------

_XLIFF_1 = ("urn:oasis:names:tc:xliff:document:1.2", "urn:oasis:names:tc:xliff:document:1.1")
_XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
_WRAPS = frozenset({"g", "mrk", "pc"})
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


@dataclass(frozen=True)
class _XliffUnit:
    holder: Any  # 1.2's trans-unit, 2.x's segment
    source: Any
    children: list[Code | str]


@dataclass(frozen=True)
class _Xliff:
    root: Any
    namespace: str
    version: int
    codes: _Codes
    found: list[_XliffUnit]

    @cached_property  # built once: the writer reads them again
    def units(self) -> Sequence[Unit]:
        return [inline(unit.children) for unit in self.found]

    def write(self, translations: Sequence[str]) -> bytes:
        if len(translations) != len(self.found):
            raise ValueError(f"{len(translations)} translations for {len(self.found)} units")
        for unit, translation in zip(self.found, translations, strict=True):
            target = unit.holder.find(f"{{{self.namespace}}}target")
            if target is None:
                target = etree.Element(f"{{{self.namespace}}}target")
                # On a line of its own, indented as the source is, where the file is indented.
                indent = unit.holder.text if unit.holder.index(unit.source) == 0 else None
                target.tail = unit.source.tail
                if indent is not None and not indent.strip():
                    unit.source.tail = indent
                unit.source.addnext(target)
            space = unit.source.get(_XML_SPACE)
            if space is not None:
                target.set(_XML_SPACE, space)
            self.codes.fill(target, read_inline(translation))
            if self.version == 1:
                target.set("state", "needs-review-translation")
                target.set("state-qualifier", "mt-suggestion")
            else:
                unit.holder.set("state", "translated")
                unit.holder.set("subState", "mt:needs-review")
        return serialize_xml(self.root)


def _inline(element: Any, codes: _Codes, into: list[Code | str]) -> None:
    """An XLIFF source's content as strings and codes."""
    codes.text(element.text or "", into)
    for child in element:
        name = etree.QName(child).localname if isinstance(child.tag, str) else ""
        if name in _WRAPS:
            shell = copy.copy(child)
            for inner in list(shell):
                shell.remove(inner)
            shell.text = shell.tail = None
            code = codes.add(_Element(shell, True), into)
            _inline(child, codes, code.children)
        else:
            codes.add(_Element(child, False), into)
        codes.text(child.tail or "", into)


def _empty(target: Any) -> bool:
    return target is None or (not (target.text or "").strip() and not len(target))


class XliffFormat:
    name = "xliff"
    extensions = (".xlf", ".xliff")
    media_type = "application/xliff+xml"

    def sniff(self, data: bytes) -> bool:
        head = text_head(data)
        return head is not None and "urn:oasis:names:tc:xliff:document:" in head

    def read(self, data: bytes, limits: Limits) -> Extracted:
        root = parse_xml(data, "the XLIFF file")
        namespace = etree.QName(root).namespace or ""
        if etree.QName(root).localname != "xliff" or not namespace.startswith(
            "urn:oasis:names:tc:xliff:document:"
        ):
            raise DocumentError("not an XLIFF file: its root is not an XLIFF <xliff> element")
        if namespace not in (*_XLIFF_1, _XLIFF_2):
            raise DocumentError(f"XLIFF of namespace {namespace} is not read: 1.2 and 2.x are")
        version = 2 if namespace == _XLIFF_2 else 1
        ns = f"{{{namespace}}}"
        holders = (
            [tu for tu in root.iter(f"{ns}trans-unit") if tu.get("translate") != "no"]
            if version == 1
            else [
                segment
                for unit in root.iter(f"{ns}unit")
                if unit.get("translate") != "no"
                for segment in unit.iter(f"{ns}segment")
            ]
        )
        codes = _Codes()
        found = []
        characters = 0
        for holder in holders:
            source = holder.find(f"{ns}source")
            if source is None or not _empty(holder.find(f"{ns}target")):
                continue
            children: list[Code | str] = []
            _inline(source, codes, children)
            characters += len(etree.tostring(source, method="text", encoding="unicode"))
            if _translated(children):
                found.append(_XliffUnit(holder, source, children))
        if characters > limits.max_characters:
            raise DocumentError(
                f"{characters} characters to translate, more than the limit of "
                f"{limits.max_characters}"
            )
        return _Xliff(root, namespace, version, codes, found)


FORMATS = (XliffFormat(), PoFormat())
