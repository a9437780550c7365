"""Importers of checkpoints saved by transformers, one module per model family, chosen by the
model_type of the checkpoint's config.json (as CTranslate2's converters choose a loader).

A family is a module with MODEL_TYPE, add_arguments(parser) and import_checkpoint(source, out,
*, force, **its options) (common.Importer); a new one is that module and one line in
IMPORTERS. marian: OPUS-MT; m2m100: M2M100 and NLLB-200 (one architecture, model_type
"m2m_100", two tokenizers). `python -m model.import` (model/import.py) is the command.
"""

from __future__ import annotations

from pathlib import Path

from model.importers import m2m100, marian
from model.importers.common import Importer, UnsupportedCheckpoint, read_json

IMPORTERS: dict[str, Importer] = {
    marian.MODEL_TYPE: marian,
    m2m100.MODEL_TYPE: m2m100,
}


def importer_for(directory: Path) -> Importer:
    """The importer for the checkpoint in `directory`, by its config.json's model_type."""
    path = directory / "config.json"
    supported = ", ".join(sorted(IMPORTERS))
    if not path.is_file():
        raise UnsupportedCheckpoint(
            f"{path} is missing: no model_type to choose an importer by (supported: {supported})"
        )
    model_type = read_json(path, required=True).get("model_type")
    importer = IMPORTERS.get(model_type) if isinstance(model_type, str) else None
    if importer is None:
        raise UnsupportedCheckpoint(
            f"{path}: model_type {model_type!r} has no importer (supported: {supported})"
        )
    return importer
