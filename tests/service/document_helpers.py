"""Translating a document's units in tests: the real pipeline (prepare, the model's generate,
assemble) that Runtime.translate runs with a document's form, without the batcher, over
FakeModel (upper case, every character aligned to itself: the structure tests' identity-like
translator) or the real engine (the placement tests); OpenDocument's namespaces and flat XML
files; LibreOffice headless, which makes files to translate and opens the translations.
Imported by module path, as tests.service.helpers is."""

from __future__ import annotations

import io
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from service.bundle.decoding import DecodingOptions, nothing
from service.documents.base import DocumentFormat, Limits, Unit
from service.documents.translate import bare, dressed
from service.text import pipeline
from service.text.pipeline import Form
from tests.service.helpers import FakeModel


def translations(units: Sequence[Unit], model: Any, target: str | None = None) -> list[str]:
    """Each unit's translation, as the service would give it (one call per unit format; a unit
    without codes as the plain text it holds, as service.documents.translate sends it)."""
    sent = [bare(unit) for unit in units]
    out = [""] * len(units)
    for format in ("text", "html", "xml"):
        indices = [i for i, unit in enumerate(sent) if unit.format == format]
        if not indices:
            continue
        prepared = pipeline.prepare(
            model,
            [sent[i].text for i in indices],
            target,
            max_segment_characters=5000,
            format=format,  # type: ignore[arg-type]
            protection=Form().protection,  # placeholders kept, as a document's request keeps them
        )
        to_run = [i for i, ids in enumerate(prepared.sources) if ids]
        options = DecodingOptions(alignments=True)
        results = model.generate([prepared.sources[i] for i in to_run], options) if to_run else []
        nbest = [[nothing()] for _ in prepared.sources]
        for i, hypotheses in zip(to_run, results, strict=True):
            nbest[i] = hypotheses
        translated = pipeline.assemble(model, prepared, nbest, 1)
        for i, translation in zip(indices, translated, strict=True):
            out[i] = dressed(units[i], sent[i], translation.texts[0])
    return out


def translate(format: DocumentFormat, data: bytes, model: Any = None) -> bytes:
    """The file translated (by FakeModel, upper case, unless `model` is given; its tokens are
    characters: a long sentence is within its limit)."""
    extracted = format.read(data, Limits())
    return extracted.write(translations(extracted.units, model or _fake()))


def plain_translations(texts: Sequence[str], model: Any = None) -> list[str]:
    """Each text's translation as plain text (`POST /translate`'s), by FakeModel unless
    `model` is given: what a document's paragraph of the same text must come to."""
    return translations([Unit(text) for text in texts], model or _fake())


def _fake() -> FakeModel:
    """FakeModel whose tokens are characters: a long sentence is within its limit."""
    return FakeModel(max_input_tokens=5000)


def identity(format: DocumentFormat, data: bytes) -> bytes:
    """The file written back from its own units."""
    extracted = format.read(data, Limits())
    return extracted.write([unit.text for unit in extracted.units])


def unit_texts(format: DocumentFormat, data: bytes) -> Sequence[str]:
    return [unit.text for unit in format.read(data, Limits()).units]


ODF_NAMESPACES = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "number": "urn:oasis:names:tc:opendocument:xmlns:datastyle:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "dc": "http://purl.org/dc/elements/1.1/",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "of": "urn:oasis:names:tc:opendocument:xmlns:of:1.2",
}
_DECLARED = " ".join(f'xmlns:{prefix}="{uri}"' for prefix, uri in ODF_NAMESPACES.items())


def odf_document(root: str, body: str) -> str:
    """An OpenDocument XML part (`root`: document-content, document-styles...) with every
    namespace of ODF_NAMESPACES declared."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<office:{root} {_DECLARED} office:version="1.3">'
        f"{body}</office:{root}>"
    )


def flat_odf(kind: str, body: str) -> str:
    """A flat (single XML file) OpenDocument of media type `kind`, as LibreOffice reads .fodt,
    .fods and .fodp."""
    return odf_document("document", body).replace(
        "<office:document ", f'<office:document office:mimetype="{kind}" '
    )


SOFFICE = shutil.which("soffice")
needs_libreoffice = pytest.mark.skipif(
    SOFFICE is None, reason="LibreOffice (soffice) is not installed"
)


def libreoffice(profile: Path, directory: Path, *args: str) -> None:
    """soffice --headless with its own profile, in `directory`. It starts in about a second:
    convert many files in one call (`--convert-to txt a.docx b.docx`)."""
    command = [str(SOFFICE), "--headless", f"-env:UserInstallation=file://{profile}", *args]
    subprocess.run(command, cwd=directory, check=True, capture_output=True, timeout=120)


def replace_entry(
    data: bytes, name: str, content: bytes, extra: dict[str, bytes] | None = None
) -> bytes:
    """The archive with one entry's bytes replaced (and entries added)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info, content if info.filename == name else source.read(info))
        for extra_name, extra_data in (extra or {}).items():
            target.writestr(extra_name, extra_data)
    return out.getvalue()
