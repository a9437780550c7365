"""benchmarks.http_parser_bench, briefly, on the tiny bundle: each protocol serves every load and
wrk's figures are read (the ratios themselves are the benchmark's to print)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks.http_parser_bench import LOADS, PARSERS, main


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_every_protocol_serves_every_load(
    eos_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--bundle", str(eos_bundle), "--duration", "1", "--rounds", "1"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert len(rows) == len(LOADS)
    for row, (name, _, connections, _) in zip(rows, LOADS, strict=True):
        assert row.startswith(name) and f" {connections} " in row
        numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", row[len(name) :])]
        # connections, then rate and p50 per protocol, then a ratio per protocol but the first
        assert len(numbers) == 1 + 2 * len(PARSERS) + len(PARSERS) - 1, row
        assert all(n > 0 for n in numbers), row
