"""Translating a document's units in tests: the real pipeline (prepare, the model's generate,
assemble) that Runtime.translate runs, without the batcher, over FakeModel (upper case, every
character aligned to itself: the structure tests' identity-like translator) or the real engine
(the placement tests). Imported by module path, as tests.service.helpers is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.bundle.decoding import DecodingOptions, nothing
from service.documents.base import DocumentFormat, Extracted, Limits
from service.text import pipeline
from tests.service.helpers import FakeModel


def translations(extracted: Extracted, model: Any, target: str | None = None) -> list[str]:
    """Each unit's translation, as the service would give it (one call per unit format)."""
    units = extracted.units
    out = [""] * len(units)
    for format in ("text", "html", "xml"):
        indices = [i for i, unit in enumerate(units) if unit.format == format]
        if not indices:
            continue
        prepared = pipeline.prepare(
            model,
            [units[i].text for i in indices],
            target,
            max_segment_characters=5000,
            format=format,  # type: ignore[arg-type]
        )
        to_run = [i for i, ids in enumerate(prepared.sources) if ids]
        options = DecodingOptions(alignments=True)
        results = model.generate([prepared.sources[i] for i in to_run], options) if to_run else []
        nbest = [[nothing()] for _ in prepared.sources]
        for i, hypotheses in zip(to_run, results, strict=True):
            nbest[i] = hypotheses
        translated = pipeline.assemble(model, prepared, nbest, 1)
        for i, translation in zip(indices, translated, strict=True):
            out[i] = translation.texts[0]
    return out


def translate(format: DocumentFormat, data: bytes, model: Any = None) -> bytes:
    """The file translated (by FakeModel, upper case, unless `model` is given; its tokens are
    characters: a long sentence is within its limit)."""
    extracted = format.read(data, Limits())
    return extracted.write(translations(extracted, model or FakeModel(max_input_tokens=5000)))


def identity(format: DocumentFormat, data: bytes) -> bytes:
    """The file written back from its own units."""
    extracted = format.read(data, Limits())
    return extracted.write([unit.text for unit in extracted.units])


def unit_texts(format: DocumentFormat, data: bytes) -> Sequence[str]:
    return [unit.text for unit in format.read(data, Limits()).units]
