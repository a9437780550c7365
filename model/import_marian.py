"""The older command, `python -m model.import_marian`, same flags: model/importers/marian.py."""

import sys

from model.importers.marian import main

if __name__ == "__main__":
    sys.exit(main())
