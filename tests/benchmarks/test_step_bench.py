"""benchmarks.step_bench: the layouts it times must compute the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.step_bench import main


def test_layouts_agree_and_are_timed(fp32_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--bundle", str(fp32_bundle), "--rows", "12", "--groups", "4", "2", "1"]
    assert main([*argv, "--past", "3", "--repeat", "2", "--runs", "1", "--threads", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [layout["group"] for layout in summary["layouts"]] == [4, 2, 1]
    assert summary["layouts"][0]["ratio"] == 1.0
    assert all(layout["median_ms"] > 0 for layout in summary["layouts"])
    assert summary["max_diff"] <= 1e-5


@pytest.mark.parametrize("groups", [["3", "2"], ["8"], ["0", "1"]])
def test_layouts_that_do_not_divide_are_refused(
    fp32_bundle: Path, groups: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--bundle", str(fp32_bundle), "--rows", "12", "--groups", *groups]) == 2
    assert "must divide" in capsys.readouterr().err
