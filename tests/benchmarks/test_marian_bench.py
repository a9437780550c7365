"""benchmarks.engine_bench with --length and --hf-dir (what benchmarks.marian_bench runs): every
system does the same work on an imported Marian model and gives the engine's tokens."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.marian_bench import goals
from tests.conftest import REPO

N, LENGTH = 4, 6


def test_fixed_lengths_give_every_system_the_same_tokens(
    marian_dir: Path, marian_checkpoint: Path, marian_bundle: Path, multi30k: Path, tmp_path: Path
) -> None:
    systems = ["engine-fp32", "transformers", "torch-uncached"]
    if importlib.util.find_spec("ctranslate2") is not None:  # the bench extra, not CI's dev
        systems.append("ct2-fp32")
    argv = [
        sys.executable, "-m", "benchmarks.engine_bench",
        "--checkpoint", str(marian_checkpoint), "--hf-dir", str(marian_dir),
        "--bundle-fp32", str(marian_bundle), "--ct2-dir", str(tmp_path / "ct2"),
        "--src", str(multi30k / "val.en.gz"), "--n", str(N), "--length", str(LENGTH),
        "--threads", "1", "--repeat", "1", "--batch-sizes", "1", "4",
        "--beam-sizes", "1", "2", "--systems", *systems,
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["system"] for r in summary["results"]] == systems
    for result in summary["results"]:
        assert [run["target_tokens"] for run in result["runs"]] == [N * LENGTH] * 4
    verdicts = [line for line in done.stdout.splitlines() if "output vs engine-fp32" in line]
    assert len(verdicts) == len(systems) - 1
    assert all(": equal (" in line for line in verdicts), verdicts


def test_goals_are_engine_over_ctranslate2_and_over_the_uncached_loop() -> None:
    def run(batch: int, beam: int, seconds: float) -> dict[str, float]:
        return {"batch_size": batch, "beam_size": beam, "target_tokens": 100, "seconds": seconds}

    summary = {
        "results": [
            {"system": "engine-fp32", "runs": [run(1, 1, 1.0), run(1, 4, 2.0)]},
            {"system": "ct2-fp32", "runs": [run(1, 1, 2.0), run(1, 4, 1.0)]},
            {"system": "torch-uncached", "runs": [run(1, 4, 20.0)]},
            {"system": "engine-int8", "error": "no --bundle-int8 given"},
        ]
    }
    assert goals(summary) == {
        "engine-fp32 / ct2 (batch 1, beam 1)": 2.0,
        "engine-fp32 / ct2 (batch 1, beam 4)": 0.5,
        "engine-fp32 / uncached (batch 1, beam 4)": 10.0,
    }
