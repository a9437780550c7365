"""benchmarks.scheduling_bench end to end on real servers, one per scheduler: every scenario
answers its short and long requests without an error, and the report compares the two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scheduling_bench import main


def test_both_schedulers_answer_every_scenario(
    fp32_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scheduling.json"
    texts = tmp_path / "texts.txt"  # short enough for the tiny model's positions
    texts.write_text("".join(f"A dog number {i} runs in the park.\n" for i in range(20)))
    args = ["--bundle", str(fp32_bundle), "--texts", str(texts), "--duration", "1.5"]
    args += ["--unloaded", "3"]
    args += ["--rates", "4", "--paragraph", "3", "--long-clients", "1", "--json", str(out)]
    assert main(args) == 0
    results = json.loads(out.read_text())
    assert {r["scheduler"] for r in results} == {"batch", "step"}
    # unloaded, closed mixed, closed long only, one open-loop rate; each scheduler
    assert len(results) == 8
    for r in results:
        long_only = r["scenario"].endswith("long clients only")
        if long_only:
            assert r["short"] == {}, r  # no short client
        else:
            assert r["short"]["answered"] > 0 and r["short"]["errors"] == 0, r["short"]
        if r["scenario"] != "unloaded":
            assert r["long"]["answered"] > 0 and r["long"]["errors"] == 0, r
            assert r["long"]["sentences_per_s"] > 0
    printed = capsys.readouterr().out
    assert "step / batch" in printed and "the unloaded p50" in printed
