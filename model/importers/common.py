"""What every importer shares: its error, its interface, reading a checkpoint's JSON files, and
the command line around it (python -m model.import, and each family's older command)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol


class UnsupportedCheckpoint(ValueError):
    """The checkpoint cannot be imported; the message names the file, field or tensor."""


class Importer(Protocol):
    """One model family: a module with these three names (model/importers/marian.py)."""

    MODEL_TYPE: str  # the model_type of the checkpoint's config.json

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The family's flags, besides --from, --out and --force."""

    def import_checkpoint(self, source: Path, out: Path, *, force: bool = ...) -> dict[str, Any]:
        """Import `source` into `out` (replacing it only with `force`), with the family's
        options as keywords (their argparse dests); returns the written config.json. Raises
        UnsupportedCheckpoint or FileNotFoundError before writing anything."""


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """A JSON object file; {} for a missing optional one."""
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnsupportedCheckpoint(f"{path}: not JSON: {e}") from e
    if not isinstance(value, dict):
        raise UnsupportedCheckpoint(f"{path}: not a JSON object")
    return value


def build_parser(
    prog: str,
    description: str,
    family_arguments: Sequence[Callable[[argparse.ArgumentParser], None]],
) -> argparse.ArgumentParser:
    """--from, --out, the flags of one family (or, for the overview --help, of all: a flag two
    families share is listed once, conflict_handler="resolve"), --force."""
    p = argparse.ArgumentParser(prog=prog, description=description, conflict_handler="resolve")
    p.add_argument("--from", dest="source", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--out", required=True, type=Path, help="checkpoint to write")
    for add_arguments in family_arguments:
        add_arguments(p)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    return p


def run(import_checkpoint: Callable[..., dict[str, Any]], args: argparse.Namespace) -> int:
    """Import as the parsed flags say; print one JSON line, or the error (exit status 2)."""
    options = {k: v for k, v in vars(args).items() if k not in ("source", "out")}
    try:
        written = import_checkpoint(args.source, args.out, **options)
    except (FileNotFoundError, UnsupportedCheckpoint) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"checkpoint": str(args.out), "model": written["model"]}))
    return 0
