"""Import a checkpoint saved by transformers, with the importer its config.json's model_type
names (model/importers/).

    python -m model.import --from DIR --out checkpoints/NAME [the family's flags] [--force]

Marian (OPUS-MT): [--source-language CODE] [--target-language CODE] [--license ID]
[--origin URL]; model/importers/marian.py says what is read and written. Without --from, --help
lists every family's flags. (`import` is a keyword: this module runs with -m only.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.importers import IMPORTERS, importer_for
from model.importers.common import UnsupportedCheckpoint, build_parser, run

PROG = "python -m model.import"
DESCRIPTION = (
    "Import a checkpoint saved by transformers, by the model_type of its config.json "
    f"(supported: {', '.join(sorted(IMPORTERS))})."
)


def main(argv: list[str] | None = None) -> int:
    # --from first (and whether help is asked for): it picks the family whose flags to parse.
    first = argparse.ArgumentParser(prog=PROG, add_help=False)
    first.add_argument("--from", dest="source")
    first.add_argument("-h", "--help", action="store_true")
    known, _ = first.parse_known_args(argv)
    if known.source is None or known.help:
        families = [importer.add_arguments for importer in IMPORTERS.values()]
        build_parser(PROG, DESCRIPTION, families).parse_args(argv)  # exits: help, or no --from
    try:
        importer = importer_for(Path(known.source))
    except (FileNotFoundError, UnsupportedCheckpoint) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args = build_parser(PROG, DESCRIPTION, [importer.add_arguments]).parse_args(argv)
    return run(importer.import_checkpoint, args)


if __name__ == "__main__":
    sys.exit(main())
