"""benchmarks.step_threads on the tiny eos bundle: a time for each session and row count, and
the one-row parts, each cut graph cheaper than the whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_each_row_count_is_timed_on_both_sessions(eos_bundle: Path) -> None:
    argv = [
        sys.executable, "-m", "benchmarks.step_threads", "--bundle", str(eos_bundle),
        "--rows", "1", "8", "64", "--runs", "100", "--positions", "8", "--source", "5",
        "--intra-op-spinning",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=600)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["threads"] == 2 and summary["spinning"] is True
    assert "threads 1 against 2, spinning" in done.stdout
    assert set(summary["rows"]) == {"1", "8", "64"}
    for times in summary["rows"].values():
        assert times["one"] > 0 and times["wide"] > 0
    parts = summary["parts"]
    # The projection onto 64 ids instead of the whole vocabulary costs less.
    assert 0 < parts["and projection to 64 ids"] < parts["whole"]
    assert "| 64 |" in done.stdout
