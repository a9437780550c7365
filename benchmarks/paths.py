"""Where the benchmarks find the repository and Multi30k; imports nothing heavy (detect_bench
measures processes that import it)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Multi30k's gzipped files: $MULTI30K_DIR, else ../shared/data/multi30k beside the repository.
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
