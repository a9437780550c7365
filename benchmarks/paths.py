"""Where the benchmarks find the repository and Multi30k; imports nothing heavy (detect_bench
measures processes that import it)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def multi30k_dir() -> Path:
    """Multi30k's gzipped files: $MULTI30K_DIR (read at each call: tests set it), else
    ../shared/data/multi30k beside the repository."""
    return Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))


MULTI30K = multi30k_dir()
