"""Where a document's bold, italic and linked words land, against an independent aligner.

The documents' counterpart of benchmarks/tag_placement.py (HTML), with argos-translate-files
beside it:

    python -m benchmarks.document_placement --bundle bundles/multi30k-en-de [--limit N]
        [--seed 0] [--beam-size 4] [--argos-python /work/venv-argos/bin/python]
        [--extra-limit N] [--flags "--intra-op-threads 1"] [--json OUT]

Multi30k's test2016 English sentences, each one paragraph, each with a random contiguous span of
1-3 of its words (tag_placement.pick_span, drawn from --seed sentence by sentence) made bold,
italic or a hyperlink (drawn too), written as four real files by their own libraries: docx
(python-docx), pptx (python-pptx: ten paragraphs a slide, in one text box), odt (zipfile and
lxml, as the project's OpenDocument tests build theirs) and Markdown (`**`, `*`, `[..](..)`).
The same paragraphs, with the same runs, in every format. A service (`python -m service`,
loopback, without the sentence cache) translates:

- each file through `POST /documents` (the document jobs: service/documents/);
- the paragraphs' text as one plain `POST /translate`: the words a run is judged in;
- with --argos-python, each file but the Markdown one (argos has no Markdown translator)
  through argos-translate-files, run by benchmarks/argos_files.py in that interpreter's
  environment, its translation object answering every text argos sends with this service's
  `POST /translate` of that text.

The translated files are read back with the formats' libraries (python-docx, python-pptx,
lxml, markdown-it-py's HTML), never with service/documents' readers: each paragraph's text, and
for each of its characters whether it is bold, italic or in a link. The run's target span is the
words of the paragraph's kind the formatting covers, counted as tag_placement counts a tag's
(covered_words): none is a run lost; a run split is one whose formatting lies in several
stretches of characters that hold more than spaces (words apart, or a word and a lone full stop:
stricter than tag_placement's "tag split"). The reference span
is tag_placement's: eflomal aligns each source sentence with its plain translation (or, where an
output paragraph's text is not that translation, with the output's text: reference_spans), and
the smallest target span covering the words aligned to the run's words. Scored as
tag_placement scores (span_scores: exact, overlap, of the spans with a reference), per format and
system and over all formats; and the paragraphs whose text is the plain translation (whitespace
collapsed). Where the misses come from: the same runs as HTML (`<b>`, tag_placement.html_input)
through `POST /translate` with format html, and the share of runs on exactly the words the
HTML path puts them on (a document's run placed otherwise than the same tag in HTML is the
document format's doing). Goals, printed and never enforced: exact >= 90 %, overlap >= 97 %,
same text 100 %.
The last lines printed are a markdown table for benchmarks/RESULTS.md, then a few misses of each
format; --json writes every number and every miss.

argos-translate-files' environment (kept out of the project's; argos-translate-files 1.4.4
requires argos-translate-lt, LibreTranslate's fork of argostranslate, which needs no torch):

    python3 -m venv /work/venv-argos
    /work/venv-argos/bin/pip install --no-deps argos-translate-files==1.4.4 \\
        argos-translate-lt==1.12.1
    /work/venv-argos/bin/pip install beautifulsoup4==4.9.3 lxml pysrt PyMuPDF ctranslate2 \\
        minisbd packaging sacremoses sentencepiece
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Collection, Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, NamedTuple

import docx
import httpx
import pptx
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from docx.text.hyperlink import Hyperlink
from lxml import etree
from markdown_it import MarkdownIt
from pptx.util import Inches

from benchmarks.document_bench import finished
from benchmarks.paths import multi30k_dir
from benchmarks.reference_alignment import EXTRA_SOURCE, EXTRA_TARGET, read_words
from benchmarks.servers import service
from benchmarks.tag_placement import (
    Span,
    Tagged,
    covered_words,
    html_input,
    overlaps,
    parse_run,
    pick_span,
    read_tagged,
    reference_spans,
    same_text,
    span_scores,
)
from service.documents.base import append_text

__all__ = [
    "FORMATS",
    "KINDS",
    "Formatted",
    "Marks",
    "draw",
    "main",
    "score",
]

KINDS = ("bold", "italic", "link")
GOALS_PCT = {"exact": 90.0, "overlap": 97.0, "same_text": 100.0}
EN_DE = {"source": "en", "target": "de"}
LINK = "https://example.com/{}"
PARAGRAPHS_PER_SLIDE = 10
EXAMPLES = 3  # misses printed per format and system


class Formatted(NamedTuple):
    """A paragraph: its words, the span of them formatted, and how (one of KINDS)."""

    words: list[str]
    span: Span
    kind: str

    def parts(self) -> Iterator[tuple[str, bool]]:
        """The text in stretches, each with whether it is the formatted one (the spaces
        between words outside it)."""
        start, end = self.span
        if start:
            yield " ".join(self.words[:start]) + " ", False
        yield " ".join(self.words[start:end]), True
        if end < len(self.words):
            yield " " + " ".join(self.words[end:]), False


def draw(sentences: Sequence[list[str]], seed: int) -> list[Formatted]:
    """A span and a kind for each sentence, sentence by sentence (a shorter --limit gets the
    same draws)."""
    rng = random.Random(seed)
    out = []
    for words in sentences:
        span = pick_span(len(words), rng)
        out.append(Formatted(words, span, rng.choice(KINDS)))
    return out


class Marks:
    """A paragraph's text as read back, run by run, and for each character which KINDS it
    has."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.inside: dict[str, list[bool]] = {kind: [] for kind in KINDS}

    def add(self, text: str, kinds: Collection[str]) -> None:
        self.parts.append(text)
        for kind, inside in self.inside.items():
            inside.extend([kind in kinds] * len(text))

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def tagged(self, kind: str) -> Tagged:
        return covered_words(self.text, self.inside[kind])

    def stretches(self, kind: str) -> int:
        """The separate stretches of `kind` that hold more than spaces (a link on a word and
        another on the full stop: 2, where the words it covers are one span)."""
        groups = itertools.groupby(zip(self.text, self.inside[kind], strict=True), lambda c: c[1])
        return sum(1 for inside, part in groups if inside and "".join(c for c, _ in part).strip())

    def bracketed(self, kind: str) -> str:
        """The text with each stretch of `kind` in [ ] (for a person to read)."""
        out, was = [], False
        for character, inside in zip(self.text, self.inside[kind], strict=True):
            if inside != was:
                out.append("[" if inside else "]")
                was = inside
            out.append(character)
        return "".join(out) + ("]" if was else "")


def _saved(document: Any) -> bytes:
    """A python-docx or python-pptx document's file."""
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _kinds(bold: bool | None, italic: bool | None, link: bool) -> set[str]:
    """A run's KINDS from its library's properties (None: inherited, not set here)."""
    return {kind for kind, on in zip(KINDS, (bold, italic, link), strict=True) if on}


# --- docx (python-docx) ------------------------------------------------------------------------


def make_docx(paragraphs: Sequence[Formatted]) -> bytes:
    document = docx.Document()
    for k, item in enumerate(paragraphs):
        paragraph = document.add_paragraph()
        for text, formatted in item.parts():
            if formatted and item.kind == "link":
                # python-docx reads hyperlinks but has no call to add one: its XML, by hand.
                rel = paragraph.part.relate_to(
                    LINK.format(k), RELATIONSHIP_TYPE.HYPERLINK, is_external=True
                )
                hyperlink = OxmlElement("w:hyperlink")
                hyperlink.set(qn("r:id"), rel)
                run, t = OxmlElement("w:r"), OxmlElement("w:t")
                t.set(qn("xml:space"), "preserve")
                t.text = text
                run.append(t)
                hyperlink.append(run)
                paragraph._p.append(hyperlink)
            else:
                run = paragraph.add_run(text)
                if formatted:
                    setattr(run, item.kind, True)
    return _saved(document)


def read_docx(data: bytes) -> list[Marks]:
    paragraphs = []
    for paragraph in docx.Document(io.BytesIO(data)).paragraphs:
        marks = Marks()
        for item in paragraph.iter_inner_content():
            runs, link = (item.runs, True) if isinstance(item, Hyperlink) else ([item], False)
            for run in runs:
                marks.add(run.text, _kinds(run.bold, run.italic, link))
        paragraphs.append(marks)
    return paragraphs


# --- pptx (python-pptx) ------------------------------------------------------------------------


def make_pptx(paragraphs: Sequence[Formatted]) -> bytes:
    presentation = pptx.Presentation()
    blank = presentation.slide_layouts[6]
    for first in range(0, len(paragraphs), PARAGRAPHS_PER_SLIDE):
        slide = presentation.slides.add_slide(blank)
        frame = slide.shapes.add_textbox(Inches(0.5), Inches(0.5), Inches(9), Inches(6)).text_frame
        for j, item in enumerate(paragraphs[first : first + PARAGRAPHS_PER_SLIDE]):
            paragraph = frame.paragraphs[0] if j == 0 else frame.add_paragraph()
            for text, formatted in item.parts():
                run = paragraph.add_run()
                run.text = text
                if formatted and item.kind == "link":
                    run.hyperlink.address = LINK.format(first + j)
                elif formatted:
                    setattr(run.font, item.kind, True)
    return _saved(presentation)


def read_pptx(data: bytes) -> list[Marks]:
    paragraphs = []
    for slide in pptx.Presentation(io.BytesIO(data)).slides:
        for shape in slide.shapes:
            if not shape.has_text_frame:
                continue
            for paragraph in shape.text_frame.paragraphs:
                marks = Marks()
                for run in paragraph.runs:
                    link = run.hyperlink.address is not None
                    marks.add(run.text, _kinds(run.font.bold, run.font.italic, link))
                paragraphs.append(marks)
    return paragraphs


# --- odt (zipfile and lxml) --------------------------------------------------------------------

_ODF = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "manifest": "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0",
}
_ODT_TYPE = "application/vnd.oasis.opendocument.text"
# Automatic text styles: name -> the kind, and the property that makes it.
_ODT_STYLES = {"T1": ("bold", "font-weight", "bold"), "T2": ("italic", "font-style", "italic")}


def _q(name: str) -> str:
    prefix, local = name.split(":")
    return f"{{{_ODF[prefix]}}}{local}"


def _odf_root(name: str) -> etree._Element:
    nsmap = {p: u for p, u in _ODF.items() if p != "manifest"}
    root = etree.Element(_q(f"office:{name}"), nsmap=nsmap)
    root.set(_q("office:version"), "1.3")
    return root


def make_odt(paragraphs: Sequence[Formatted]) -> bytes:
    content = _odf_root("document-content")
    styles = etree.SubElement(content, _q("office:automatic-styles"))
    style_of = {}
    for name, (kind, attribute, value) in _ODT_STYLES.items():
        style = etree.SubElement(styles, _q("style:style"))
        style.set(_q("style:name"), name)
        style.set(_q("style:family"), "text")
        etree.SubElement(style, _q("style:text-properties")).set(_q(f"fo:{attribute}"), value)
        style_of[kind] = name
    text = etree.SubElement(etree.SubElement(content, _q("office:body")), _q("office:text"))
    for k, item in enumerate(paragraphs):
        paragraph = etree.SubElement(text, _q("text:p"))
        for part, formatted in item.parts():
            if not formatted:
                append_text(paragraph, part)
                continue
            if item.kind == "link":
                element = etree.SubElement(paragraph, _q("text:a"))
                element.set(_q("xlink:type"), "simple")
                element.set(_q("xlink:href"), LINK.format(k))
            else:
                element = etree.SubElement(paragraph, _q("text:span"))
                element.set(_q("text:style-name"), style_of[item.kind])
            element.text = part
    manifest = etree.Element(_q("manifest:manifest"), nsmap={"manifest": _ODF["manifest"]})
    manifest.set(_q("manifest:version"), "1.3")
    for path, media_type in (("/", _ODT_TYPE), ("content.xml", "text/xml"),
                             ("styles.xml", "text/xml")):  # fmt: skip
        entry = etree.SubElement(manifest, _q("manifest:file-entry"))
        entry.set(_q("manifest:full-path"), path)
        entry.set(_q("manifest:media-type"), media_type)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("mimetype", _ODT_TYPE, compress_type=zipfile.ZIP_STORED)
        for name, root in (("content.xml", content), ("styles.xml", _odf_root("document-styles")),
                           ("META-INF/manifest.xml", manifest)):  # fmt: skip
            package.writestr(name, etree.tostring(root, xml_declaration=True, encoding="UTF-8"))
    return out.getvalue()


def read_odt(data: bytes) -> list[Marks]:
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        content = etree.fromstring(package.read("content.xml"))
    kinds_of: dict[str, set[str]] = {}
    for style in content.iter(_q("style:style")):
        properties = style.find(_q("style:text-properties"))
        kinds_of[style.get(_q("style:name"), "")] = {
            kind
            for kind, attribute, value in _ODT_STYLES.values()
            if properties is not None and properties.get(_q(f"fo:{attribute}")) == value
        }
    paragraphs = []
    for paragraph in content.iter(_q("text:p"), _q("text:h")):
        marks = Marks()
        _read_odf_text(paragraph, set(), kinds_of, marks)
        paragraphs.append(marks)
    return paragraphs


def _read_odf_text(
    element: etree._Element, kinds: set[str], kinds_of: dict[str, set[str]], marks: Marks
) -> None:
    if element.text:
        marks.add(element.text, kinds)
    for child in element:
        inner = set(kinds)
        if child.tag == _q("text:span"):
            inner |= kinds_of.get(child.get(_q("text:style-name"), ""), set())
        elif child.tag == _q("text:a"):
            inner.add("link")
        if child.tag == _q("text:s"):
            marks.add(" " * int(child.get(_q("text:c"), "1")), kinds)
        elif child.tag == _q("text:tab"):
            marks.add("\t", kinds)
        elif child.tag == _q("text:line-break"):
            marks.add("\n", kinds)
        else:
            _read_odf_text(child, inner, kinds_of, marks)
        if child.tail:
            marks.add(child.tail, kinds)


# --- Markdown (markdown-it-py's HTML) ----------------------------------------------------------

_MARKDOWN_SYNTAX = re.compile(r"([\\`*_\[\]<>&~|#!])")
_HTML_KINDS = {"strong": "bold", "em": "italic", "a": "link"}
_HTML_PARAGRAPH = re.compile(r"<p>(.*?)</p>", re.S)


def make_markdown(paragraphs: Sequence[Formatted]) -> bytes:
    lines = []
    for k, item in enumerate(paragraphs):
        line = ""
        for text, formatted in item.parts():
            escaped = _MARKDOWN_SYNTAX.sub(r"\\\1", text)
            if formatted:
                escaped = {"bold": "**{}**", "italic": "*{}*", "link": "[{}](" + LINK + ")"}[
                    item.kind
                ].format(escaped, k)
            line += escaped
        lines.append(re.sub(r"^([-+]|\d+[.)])(?=\s)", r"\\\1", line))  # not a list item
    return "\n\n".join(lines).encode("utf-8") + b"\n"


class _MarkedHtml(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.marks = Marks()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HTML_KINDS:
            self.open.append(_HTML_KINDS[tag])

    def handle_endtag(self, tag: str) -> None:
        if tag in _HTML_KINDS and _HTML_KINDS[tag] in self.open:
            self.open.remove(_HTML_KINDS[tag])

    def handle_data(self, data: str) -> None:
        self.marks.add(data, set(self.open))


def read_markdown(data: bytes) -> list[Marks]:
    html = MarkdownIt("commonmark").render(data.decode("utf-8"))
    paragraphs = []
    for paragraph in _HTML_PARAGRAPH.finditer(html):
        reader = _MarkedHtml()
        reader.feed(paragraph.group(1))
        reader.close()
        paragraphs.append(reader.marks)
    return paragraphs


class Format(NamedTuple):
    make: Callable[[Sequence[Formatted]], bytes]
    read: Callable[[bytes], list[Marks]]
    argos: bool  # whether argos-translate-files translates it


FORMATS = {
    "docx": Format(make_docx, read_docx, True),
    "pptx": Format(make_pptx, read_pptx, True),
    "odt": Format(make_odt, read_odt, True),
    "md": Format(make_markdown, read_markdown, False),
}


# --- Scoring -----------------------------------------------------------------------------------


def score(
    paragraphs: Sequence[Formatted],
    read: Sequence[Marks],
    plain: Sequence[str],
    references: Sequence[Span | None],
    html: Sequence[Span | None],
) -> dict[str, Any]:
    """One system's translation of one file: span scores of its runs against the references,
    runs lost and split, paragraphs whose text is the plain translation, runs on the words the
    HTML path puts the same run's <b> on (`html`: its spans, in the plain translation's words),
    and the misses."""
    if len(read) != len(paragraphs):
        raise ValueError(f"{len(paragraphs)} paragraphs sent, {len(read)} read back")
    tagged = [marks.tagged(item.kind) for marks, item in zip(read, paragraphs, strict=True)]
    split = [marks.stretches(item.kind) > 1 for marks, item in zip(read, paragraphs, strict=True)]
    same = [same_text(marks.text, p) for marks, p in zip(read, plain, strict=True)]
    as_html = [s and t.span == span for s, t, span in zip(same, tagged, html, strict=True)]
    misses = []
    for k, (item, t, reference) in enumerate(zip(paragraphs, tagged, references, strict=True)):
        if (reference is not None and t.span != reference) or split[k]:
            misses.append({
                "paragraph": k,
                "kind": item.kind,
                "source": _marked(item.words, item.span),
                "output": read[k].bracketed(item.kind) + ("" if t.span else " (run lost)"),
                "reference": None if reference is None else _marked(t.text.split(), reference),
                "same_text": same[k],
                "overlap": overlaps(t.span, reference),
            })  # fmt: skip
    return {
        "scores": span_scores([p.span for p in paragraphs], [t.span for t in tagged], references),
        "same_text": sum(same),
        "same_text_pct": 100.0 * sum(same) / len(same) if same else None,
        "runs_lost": sum(1 for t in tagged if t.span is None),
        "runs_split": sum(split),
        "as_html": sum(as_html),
        "as_html_pct": 100.0 * sum(as_html) / len(as_html) if as_html else None,
        "misses": misses,
    }


def _marked(words: Sequence[str], span: Span) -> str:
    start, end = span
    inside = " ".join(words[start:end])
    return " ".join([*words[:start], f"[{inside}]", *words[end:]])


# --- The run -----------------------------------------------------------------------------------


def translate_document(client: httpx.Client, name: str, data: bytes, beam_size: int) -> bytes:
    """`name` through POST /documents, its result once done."""
    sent = client.post(
        "/documents",
        files={"file": (name, data)},
        data={**EN_DE, "beam_size": str(beam_size)},
        timeout=120,
    )
    sent.raise_for_status()
    id = sent.json()["id"]
    status = finished(client, id)
    if status["status"] != "done":
        raise RuntimeError(f"{name}: {status}")
    result = client.get(f"/documents/{id}/result", timeout=120)
    result.raise_for_status()
    return result.content


def translate_plain(
    client: httpx.Client, texts: Sequence[str], beam_size: int, format: str = "text"
) -> list[str]:
    """The texts through one POST /translate."""
    response = client.post(
        "/translate",
        json={"text": list(texts), **EN_DE, "beam_size": beam_size, "format": format},
        timeout=1200,
    )
    response.raise_for_status()
    return [t["text"] for t in response.json()["translations"]]


def translate_argos(
    python: str, url: str, files: Sequence[Path], beam_size: int
) -> tuple[dict[Path, bytes], dict[str, Any]]:
    """Each file through argos-translate-files in `python`'s environment (benchmarks/
    argos_files.py), its translation object over the service at `url`."""
    script = Path(__file__).with_name("argos_files.py")
    argv = [
        python, str(script), "--url", url, "--beam-size", str(beam_size),
        "--source", EN_DE["source"], "--target", EN_DE["target"], *map(str, files),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as home:  # argos makes its data directories in $HOME
        env = {**os.environ, "HOME": home, "XDG_DATA_HOME": home, "XDG_CONFIG_HOME": home,
               "XDG_CACHE_HOME": home}  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outputs = {path: Path(report[str(path)]["output"]).read_bytes() for path in files}
    return outputs, report


def _run(args: argparse.Namespace) -> dict[str, Any]:
    data = multi30k_dir()
    sources = [words for words in read_words(data / f"{args.split}.en.gz") if words]
    paragraphs = draw(sources, args.seed)[: args.limit]  # drawn before the cut: stable
    sources = [p.words for p in paragraphs]
    texts = [" ".join(words) for words in sources]
    seconds: dict[str, float] = {}
    outputs: dict[str, dict[str, bytes]] = {"ours": {}, "argos": {}}
    argos_report: dict[str, Any] = {}
    flags = [
        "--max-texts", str(len(texts)), "--max-characters", "10000000",
        "--max-queue-segments", str(10 * len(texts)), "--request-timeout-s", "1200",
        *shlex.split(args.flags),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        files = {}
        for name, fmt in FORMATS.items():
            files[name] = Path(work) / f"placement.{name}"
            files[name].write_bytes(fmt.make(paragraphs))
        with (
            service(args.bundle, [*flags, "--documents-dir", str(Path(work) / "jobs")]) as running,
            httpx.Client(base_url=running.url) as client,
        ):
            start = time.perf_counter()
            plain = translate_plain(client, texts, args.beam_size)
            seconds["plain"] = time.perf_counter() - start
            start = time.perf_counter()
            documents = [html_input(p.words, p.span) for p in paragraphs]
            html = translate_plain(client, documents, args.beam_size, format="html")
            html_spans = [
                tagged.span if same_text(tagged.text, p) else None
                for tagged, p in zip(map(read_tagged, html), plain, strict=True)
            ]
            seconds["html"] = time.perf_counter() - start
            for name, path in files.items():
                start = time.perf_counter()
                outputs["ours"][name] = translate_document(
                    client, path.name, path.read_bytes(), args.beam_size
                )
                seconds[f"ours_{name}"] = time.perf_counter() - start
            if args.argos_python is not None:
                start = time.perf_counter()
                argos_files = [path for name, path in files.items() if FORMATS[name].argos]
                by_path, argos_report = translate_argos(
                    args.argos_python, running.url, argos_files, args.beam_size
                )
                outputs["argos"] = {path.suffix[1:]: out for path, out in by_path.items()}
                seconds["argos"] = time.perf_counter() - start

    read = {
        system: {name: FORMATS[name].read(out) for name, out in by_format.items()}
        for system, by_format in outputs.items()
    }
    runs = [(system, name) for system, by_format in read.items() for name in by_format]
    extra = (read_words(data / EXTRA_SOURCE, args.extra_limit),
             read_words(data / EXTRA_TARGET, args.extra_limit))  # fmt: skip
    start = time.perf_counter()
    references = reference_spans(
        sources,
        [p.span for p in paragraphs],
        plain,
        [[marks.text for marks in read[system][name]] for system, name in runs],
        extra,
    )
    seconds["align"] = time.perf_counter() - start
    results: dict[str, dict[str, Any]] = {"ours": {}, "argos": {}}
    for (system, name), spans in zip(runs, references, strict=True):
        results[system][name] = score(paragraphs, read[system][name], plain, spans, html_spans)
    for system, by_format in read.items():
        if by_format:  # every format's paragraphs as one file's
            n = len(by_format)
            every = [marks for name in by_format for marks in by_format[name]]
            spans = [span for (s, _), own in zip(runs, references, strict=True) if s == system
                     for span in own]  # fmt: skip
            overall = score(
                list(paragraphs) * n, every, list(plain) * n, spans, list(html_spans) * n
            )
            results[system]["all"] = {**overall, "misses": []}
    return {
        "bundle": str(args.bundle),
        "split": args.split,
        "paragraphs": len(paragraphs),
        "kinds": {kind: sum(p.kind == kind for p in paragraphs) for kind in KINDS},
        "beam_size": args.beam_size,
        "seed": args.seed,
        "extra_pairs": len(extra[0]),
        "results": results,
        "argos": argos_report,
        "goals_pct": GOALS_PCT,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


def _cell(result: dict[str, Any] | None, key: str) -> str:
    """A table cell: a rate with its goal's mark, or a count."""
    if result is None:
        return "-"
    if key in ("exact", "overlap"):
        rate = result["scores"][f"{key}_pct"]
    elif key in ("same_text", "as_html"):
        rate = result[f"{key}_pct"]
    else:
        return str(result[key])
    if rate is None:
        return "-"
    return f"{rate:.1f} %" + (" !" if rate < GOALS_PCT.get(key, 0.0) else "")


def _print_report(report: dict[str, Any]) -> None:
    results = report["results"]
    seconds = report["seconds"]
    print(
        f"{report['paragraphs']} paragraphs a format (test2016, {report['kinds']}), beam "
        f"{report['beam_size']}, seed {report['seed']}, {report['extra_pairs']} extra pairs "
        f"for eflomal; seconds: {seconds}"
    )
    print()
    print(
        "| format | exact, ours / argos (goal ≥ 90 %) | overlap (≥ 97 %) "
        "| paragraphs = plain translation (100 %) | run where HTML's <b> is | runs lost "
        "| runs split | no reference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in [*FORMATS, "all"]:
        ours, argos = results["ours"].get(name), results["argos"].get(name)
        row = [
            f"{_cell(ours, key)} / {_cell(argos, key)}"
            for key in ("exact", "overlap", "same_text", "as_html", "runs_lost", "runs_split")
        ]
        no_reference = "-" if ours is None else ours["scores"]["no_reference"]
        print(f"| {name} | {' | '.join(row)} | {no_reference} |")
    print("! = goal missed (goals are printed, never enforced); argos has no Markdown")
    for system, by_format in results.items():
        for name, result in by_format.items():
            for miss in result["misses"][:EXAMPLES]:
                print(
                    f"{system} {name} #{miss['paragraph']} {miss['kind']}: {miss['source']} -> "
                    f"{miss['output']} (eflomal: {miss['reference']})"
                )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    report = _run(args)
    _print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.document_placement", description=__doc__.split("\n")[0]
    )
    p.add_argument("--flags", default="", help="more `python -m service` flags")
    p.add_argument(
        "--argos-python",
        default=None,
        help="the python of an environment with argos-translate-files (its docstring says how "
        "to make one); without it, the service's side only",
    )
    return parse_run(p, argv)


if __name__ == "__main__":
    sys.exit(main())
