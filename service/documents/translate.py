"""A document's units through the one translation path (Runtime.translate, as `POST /translate`
sends its texts), as background work: its sentences are decoded behind every interactive
request (service/scheduling/batcher.py), a few paragraphs at a time so that the queue never holds
much of it and progress moves. Each unit is one text of its request, translated in its own
format, so a paragraph gets the translation its text would get alone. An inline unit without
codes (a paragraph of one run) is sent as the plain text it is: it gets exactly the
translation of that text, without the markup path's work or the aligner's steps."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lxml import etree

from service.documents.base import ROOT, Unit, inline, read_inline
from service.errors import ErrorType, ServiceError
from service.glossaries import Entry
from service.scheduling.runtime import Runtime
from service.text import markup, segment
from service.text.pipeline import Form
from service.text.terms import Terms

log = logging.getLogger(__name__)

# Units sent in one call (by characters of markup): some 40 sentences, more than a batch.
CHUNK_CHARACTERS = 4000
# Calls of one document in flight: the next ones queued while one decodes, so that the engine
# never waits for the event loop between two and a background batch that empties is refilled
# whole (service/scheduling/batcher.py).
IN_FLIGHT = 3
# A job's options key for the entries of the glossary it was sent with (source, target, case).
GLOSSARY = "glossary"
# A full queue (interactive requests hold it) is waited out, not a failure of the document.
QUEUE_FULL_WAIT_S = 0.2
# Characters of the document read to detect its language when its source is "auto".
DETECT_CHARACTERS = 2000


@dataclass
class Progress:
    """Sentences translated of the document's total (an estimate until it is done)."""

    total: int
    done: int = 0


def plain_text(unit: Unit) -> str:
    """A unit's words without its markup (for detection and the sentence count)."""
    if unit.format == "text":
        return unit.text
    if unit.format == "xml":
        # Bytes: lxml refuses a str that starts with an encoding declaration (an XHTML file).
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        return "".join(etree.fromstring(unit.text.encode("utf-8"), parser=parser).itertext())
    return " ".join(markup.parse(unit.text, "html").blocks)


def count_sentences(units: Sequence[Unit], language: str) -> int:
    return sum(len(segment.split(plain_text(unit), language).segments) for unit in units)


def paragraph_label(indices: Sequence[int]) -> Callable[[int], str]:
    """How an error names a unit of one call: by its paragraph in the document."""
    return lambda index: f"paragraph {indices[index] + 1}"


def bare(unit: Unit) -> Unit:
    """An inline unit without codes (`<p>text</p>`: a paragraph of one run) as the plain text
    it holds; any other unit as it is."""
    if unit.format == "xml" and unit.text.startswith(f"<{ROOT}>") and unit.text.count("<") == 2:
        (text,) = read_inline(unit.text)
        if isinstance(text, str):
            return Unit(text, "text")
    return unit


def dressed(unit: Unit, sent: Unit, translation: str) -> str:
    """The translation of `sent` (`bare(unit)`) in `unit`'s form: an inline unit again where
    it went as plain text."""
    return translation if sent is unit else inline([translation]).text


def chunks(units: Sequence[Unit]) -> list[list[int]]:
    """Unit indices in calls, in document order of their first unit: units of one format,
    in order, up to CHUNK_CHARACTERS each (a longer unit alone)."""
    out: list[list[int]] = []
    current: dict[str, tuple[list[int], int]] = {}  # format: its last call, its characters
    for i, unit in enumerate(units):
        call, size = current.get(unit.format, ([], CHUNK_CHARACTERS))
        if call and size + len(unit.text) <= CHUNK_CHARACTERS:
            call.append(i)
            current[unit.format] = (call, size + len(unit.text))
        else:
            out.append([i])
            current[unit.format] = (out[-1], len(unit.text))
    return out


async def detect_source(runtime: Runtime, units: Sequence[Unit]) -> str | None:
    """The document's language from its first DETECT_CHARACTERS of text (None: nothing to
    detect)."""
    sample, size = [], 0
    for unit in units:
        text = plain_text(unit).strip()
        if text:
            sample.append(text)
            size += len(text)
        if size >= DETECT_CHARACTERS:
            break
    (candidates,) = await runtime.detect(["\n".join(sample)])
    if candidates == []:
        served = ", ".join(sorted(runtime.detector.languages))
        raise ServiceError(
            ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
            f"the document is in none of the languages served ({served})",
        )
    return None if candidates is None else candidates[0].language


async def translate_units(
    runtime: Runtime,
    units: Sequence[Unit],
    pair: tuple[str, str],
    requested: Mapping[str, Any],
    progress: Progress,
    on_progress: Callable[[], None] = lambda: None,
) -> list[str]:
    """Each unit's translation, in order, with the glossary entries the job was sent with
    (`requested[GLOSSARY]`) enforced; `progress.done` grows as calls finish."""
    requested = dict(requested)
    glossary = requested.pop(GLOSSARY, None)
    terms = None if glossary is None else Terms([Entry(*entry) for entry in glossary])
    options = runtime.decoding_options(pair, requested)
    translations: list[str] = [""] * len(units)
    gate = asyncio.Semaphore(IN_FLIGHT)
    sent = [bare(unit) for unit in units]

    async def call(indices: list[int]) -> None:
        texts = [sent[i].text for i in indices]
        form = Form(format=sent[indices[0]].format)
        async with gate:
            while True:
                try:
                    results = await runtime.translate(
                        texts,
                        pair,
                        options,
                        deadline=math.inf,
                        form=form,
                        label=paragraph_label(indices),
                        background=True,
                        terms=terms,
                    )
                    break
                except ServiceError as e:
                    if e.type is not ErrorType.QUEUE_FULL:
                        raise
                    await asyncio.sleep(QUEUE_FULL_WAIT_S)
        for i, result in zip(indices, results, strict=True):
            translations[i] = dressed(units[i], sent[i], result.texts[0])
        progress.done = min(progress.total, progress.done + sum(len(r.segments) for r in results))
        on_progress()

    calls = [asyncio.ensure_future(call(indices)) for indices in chunks(sent)]
    try:
        await asyncio.gather(*calls)  # the first failure as it is (a TaskGroup would wrap it)
    finally:
        for pending in calls:  # after a failure or a cancellation, nothing goes on
            pending.cancel()
    progress.done = progress.total
    on_progress()
    return translations
