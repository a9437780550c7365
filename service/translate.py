"""Translate a file line by line with the engine: the batch path, no HTTP.

    python -m service.translate --bundle BUNDLE [--source LANG] [--target LANG] [--beam-size K]
        [--batch-size N]
        [--device auto|cpu|cuda] [--device-id N] [--threads N] [--length-penalty A]
        [--max-decoding-length N] [--format text|html|xml [--translate-attributes]]
        < in.txt > out.txt
    python -m service.translate --bundle BUNDLE --file in.docx --out out.docx [...]

One output line per input line, in order; empty lines stay empty. Each line goes through the same
text pipeline as a text sent over HTTP (service/text/pipeline.py): split into sentences, decoded
with the same options (the service's settings, MT_* variables included, under the flags given here),
reassembled around its separators; so a line gets the translation the service gives it; with
--format html or xml each line is a document, translated as the service translates one
(docs/api.md). A sentence has the service's limits (the model's tokens, max_segment_characters; beam
sizes up to max_beam_size); the request-wide ones (max_characters, max_texts, max_queue_segments)
are the server's only. The input must be UTF-8, and every line is checked before anything is
translated, so a bad byte or a too-long sentence fails the run (exit status 2, naming the line)
instead of being truncated or leaving a partial output. Progress goes to stderr when it is a
terminal; a summary is logged at the end.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import BundleError
from service.documents.base import Limits, UnitFormat
from service.documents.formats import choose
from service.documents.translate import paragraph_label
from service.errors import ServiceError
from service.glossaries import EntriesFormat, Entry, checked, parse_entries
from service.inference.engine import Engine
from service.inference.models import step_threads
from service.settings import Settings
from service.text import pipeline
from service.text.terms import Terms, check_spelling
from service.text.terms import constraints as term_constraints

log = logging.getLogger(__name__)

# Lines handed to the engine at once, in batches: the engine sorts each window by length, so a
# window several batches long keeps batches homogeneous while the progress line still moves.
_BATCHES_PER_WINDOW = 8


class _Progress:
    """A one-line counter on stderr, redrawn at most every `interval` seconds."""

    def __init__(self, total: int, stream: TextIO, interval: float = 0.2) -> None:
        self.total, self.stream, self.interval = total, stream, interval
        self.start = self.last = time.perf_counter()
        self.enabled = stream.isatty()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < self.interval and done < self.total):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        self.stream.write(f"\r{done}/{self.total} lines ({rate:.1f} lines/s)")
        if done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def translate_lines(
    engine: Engine,
    lines: Sequence[str],
    options: DecodingOptions,
    *,
    out: TextIO,
    max_segment_characters: int,
    target: str | None = None,
    source: str | None = None,
    on_progress: Callable[[int], None] = lambda done: None,
    form: pipeline.Form = pipeline.PLAIN,
    glossary: Terms | None = None,
) -> int:
    """Write one translation per line to `out`, window by window; returns target tokens.
    Refuses a `form` the engine cannot do (pipeline.check_form) before anything is read.

    Raises ServiceError, naming the line, before anything is written if a line is over a limit.
    """
    tokens = 0
    windows = _windows(
        engine,
        lines,
        options,
        max_segment_characters=max_segment_characters,
        target=target,
        source=source,
        form=form,
        label=lambda index: f"line {index + 1}",
        glossary=glossary,
    )
    for done, translations, window_tokens in windows:
        tokens += window_tokens
        for translation in translations:
            # One line in, one line out: a newline in a translation would shift every line.
            out.write(translation.replace("\n", " ") + "\n")
        out.flush()
        on_progress(done)
    return tokens


def _windows(
    engine: Engine,
    texts: Sequence[str],
    options: DecodingOptions,
    *,
    max_segment_characters: int,
    target: str | None,
    source: str | None,
    form: pipeline.Form,
    label: Callable[[int], str],
    glossary: Terms | None = None,
) -> Iterator[tuple[int, list[str], int]]:
    """The texts' translations a window at a time: (texts done, the window's translations,
    its target tokens), with a glossary's terms enforced. Every text is checked before the
    first window is translated."""
    options = pipeline.check_form(engine, form, options)
    prepared = pipeline.prepare(
        engine,
        texts,
        target,
        source=source,
        max_segment_characters=max_segment_characters,
        label=label,
        format=form.format,
        translate_attributes=form.translate_attributes,
        protection=form.protection,
        terms=glossary,
    )
    options = prepared.decoding(options)
    renderings: dict[str, str] = {}
    window = engine.max_batch_size * _BATCHES_PER_WINDOW
    prefix = engine.decoder_prefix(target)
    for start in range(0, len(texts), window):
        part = prepared.texts(start, start + window)
        constraints = None
        if any(part.matched):
            _render(engine, part.matched, renderings, target, source)
            constraints = term_constraints(engine, part.matched, renderings.__getitem__)
        nbest = engine.generate(
            part.sources, options, prefixes=[prefix] * len(part.sources), constraints=constraints
        )
        translations = [t.texts[0] for t in pipeline.assemble(engine, part, nbest, 1)]
        yield min(start + window, len(texts)), translations, sum(len(h[0].ids) for h in nbest)


def translate_document(
    engine: Engine,
    data: bytes,
    filename: str,
    options: DecodingOptions,
    *,
    max_segment_characters: int,
    target: str | None = None,
    source: str | None = None,
    glossary: Terms | None = None,
) -> tuple[bytes, int]:
    """A document file translated (its format by its name and content, as POST /documents
    reads it: service/documents/) and its paragraphs' count. Each paragraph is one text of
    the engine's path in its own format, so it gets the translation its text gets."""
    format = choose(filename, None, data)
    extracted = format.read(data, Limits())
    units = extracted.units
    translations = [unit.text for unit in units]
    by_format: dict[UnitFormat, list[int]] = {}
    for i, unit in enumerate(units):
        by_format.setdefault(unit.format, []).append(i)
    for unit_format, indices in by_format.items():
        texts = [units[i].text for i in indices]
        windows = _windows(
            engine,
            texts,
            options,
            max_segment_characters=max_segment_characters,
            target=target,
            source=source,
            form=pipeline.Form(unit_format),
            label=paragraph_label(indices),
            glossary=glossary,
        )
        done = 0
        for end, window, _ in windows:
            for i, translation in zip(indices[done:end], window, strict=True):
                translations[i] = translation
            done = end
    return (extracted.write(translations) if units else data), len(units)


def _render(
    engine: Engine,
    matched: Sequence[Sequence[Entry]],
    renderings: dict[str, str],
    target: str | None,
    source: str | None,
) -> None:
    """The model's own greedy translation of each matched source term it has not translated
    yet, into `renderings` (what the search avoids beside the glossary's term)."""
    missing = sorted({e.source for own in matched for e in own} - renderings.keys())
    if not missing:
        return
    greedy = DecodingOptions(max_length_a=3.0, max_length_b=10)
    prefix = engine.decoder_prefix(target)
    found = engine.generate(
        engine.encode(missing, target, source), greedy, prefixes=[prefix] * len(missing)
    )
    renderings.update((s, engine.decode(h[0].ids)) for s, h in zip(missing, found, strict=True))


def read_glossary(path: Path, engine: Engine, pair: tuple[str, str], max_entries: int) -> Terms:
    """A glossary file's terms: DeepL's CSV for a .csv name, else its TSV; checked as the
    service checks a glossary (service/glossaries.py), each target term one the model spells."""
    entries_format: EntriesFormat = "csv" if path.suffix.lower() == ".csv" else "tsv"
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"--glossary {path}: {e.strerror}") from None
    entries = checked(parse_entries(read_utf8(data), entries_format, pair), max_entries)
    check_spelling(engine, engine.name, entries)
    return Terms(entries)


def read_utf8(data: bytes) -> str:
    """`data` as UTF-8, or a ValueError naming the line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise ValueError(
            f"the input is not UTF-8: line {line}, byte "
            f"{e.start - line_start + 1} ({data[e.start : e.start + 1]!r}: {e.reason}); "
            "nothing was translated"
        ) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m service.translate",
        description="Translate stdin to stdout, line by line, with an ONNX bundle.",
    )
    p.add_argument("--bundle", required=True, help="bundle directory (python -m export)")
    p.add_argument("--source", help="source language, for a multilingual model")
    p.add_argument("--target", help="target language, for a multi-target or multilingual model")
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    p.add_argument(
        "--beam-size",
        type=int,
        help=f"1 is greedy (default: the service's, {defaults['default_beam_size']}; "
        f"at most max_beam_size, {defaults['max_beam_size']})",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="ONNX Runtime intra-op threads (default: as the server's, MT_INTRA_OP_THREADS)",
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        help=f"default: the service's, {defaults['default_length_penalty']} (the shipped model's "
        "card says why)",
    )
    p.add_argument(
        "--max-decoding-length",
        type=int,
        help="target tokens per sentence (default: the service's, "
        f"{defaults['default_max_decoding_length']}, capped by the model)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        help="no n-gram of this many tokens twice in a sentence's translation (default: the "
        f"service's, {defaults['default_no_repeat_ngram_size']}: off)",
    )
    p.add_argument(
        "--format",
        choices=("text", "html", "xml"),
        default="text",
        help="each line is plain text (default), or an HTML or XML document",
    )
    p.add_argument(
        "--translate-attributes",
        action="store_true",
        help="html/xml: translate alt and title attributes too",
    )
    p.add_argument(
        "--glossary",
        type=Path,
        help="a glossary file whose terms are enforced: DeepL's TSV (source<TAB>target a line), "
        "or its CSV for a .csv name (docs/api.md#glossaries)",
    )
    p.add_argument(
        "--file",
        type=Path,
        help="translate this document (docx, pptx, xlsx, ...: docs/api.md) instead of stdin",
    )
    p.add_argument("--out", type=Path, help="with --file: where the translated document goes")
    args = p.parse_args(argv)
    if (args.file is None) != (args.out is None):
        p.error("--file and --out go together")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.model_validate({})  # the defaults under the MT_* variables
        threads, spinning = step_threads(settings, 1, 1)  # as one server process of one model
        engine = Engine.load(
            args.bundle,
            device=args.device,
            device_id=args.device_id,
            intra_op_threads=args.threads or threads,
            intra_op_spinning=spinning,
            max_batch_size=args.batch_size,
        )
        requested = {
            "beam_size": args.beam_size,
            "length_penalty": args.length_penalty,
            "max_decoding_length": args.max_decoding_length,
            "no_repeat_ngram_size": args.no_repeat_ngram_size,
        }
        options = pipeline.decoding_options(
            settings,
            {name: value for name, value in requested.items() if value is not None},
            max_input_tokens=engine.max_input_tokens,
        )
        glossary = None
        if args.glossary is not None:
            pair = (
                args.source or engine.source_language,
                args.target or engine.target_languages[0],
            )
            glossary = read_glossary(args.glossary, engine, pair, settings.max_glossary_entries)
        if args.file is not None:
            start = time.perf_counter()
            translated, paragraphs = translate_document(
                engine,
                args.file.read_bytes(),
                args.file.name,
                options,
                max_segment_characters=settings.max_segment_characters,
                target=args.target,
                source=args.source,
                glossary=glossary,
            )
            args.out.write_bytes(translated)
            log.info(
                "translated %s (%d paragraphs) into %s in %.1f s",
                args.file,
                paragraphs,
                args.out,
                time.perf_counter() - start,
            )
            return 0
        # Lines end at "\n" only (str.splitlines would also split at U+2028 and friends, and
        # the output would no longer line up with the input).
        lines = read_utf8(sys.stdin.buffer.read()).split("\n")
        if lines[-1] == "":
            lines.pop()
        start = time.perf_counter()
        tokens = translate_lines(
            engine,
            lines,
            options,
            out=sys.stdout,
            max_segment_characters=settings.max_segment_characters,
            target=args.target,
            source=args.source,
            on_progress=_Progress(len(lines), sys.stderr).update,
            form=pipeline.Form(args.format, args.translate_attributes),
            glossary=glossary,
        )
    except (BundleError, ServiceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    log.info(
        "translated %d lines (%d target tokens) in %.1f s on %s",
        len(lines),
        tokens,
        seconds,
        engine.provider,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
