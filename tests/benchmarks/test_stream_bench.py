"""benchmarks.stream_bench on a small generated corpus: it trains streamed (and in memory) and
reports a peak RSS and a speed for each."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import stream_bench


def test_the_benchmark_reports_both_ways_of_reading(multi30k: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = ["--lines", "3000", "--updates", "2", "--stream-buffer", "1000", "--in-memory"]
    assert stream_bench.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for way in ("streamed", "in memory"):
        assert result[way]["peak_rss_mib"] > 0 and result[way]["tokens_per_s"] > 0
