"""benchmarks.nllb_bench on a small model of the NLLB kind (--shape): it builds, imports and
exports the model, and every system decodes the same fixed number of tokens to the same ids."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

N, LENGTH = 4, 5


def test_a_small_nllb_shaped_model_runs_through_every_system(
    multi30k: Path, tmp_path: Path
) -> None:
    systems = ["engine-fp32", "engine-int8"]
    if importlib.util.find_spec("ctranslate2") is not None:  # the bench extra, not CI's dev
        systems.append("ct2-fp32")
    argv = [
        sys.executable, "-m", "benchmarks.nllb_bench", "--shape", "32,1,9000",
        "--work", str(tmp_path), "--src", str(multi30k / "val.en.gz"), "--n", str(N),
        "--length", str(LENGTH), "--threads", "1", "--batch-sizes", "1", "4",
        "--systems", *systems, "--shortlist",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["system"] for r in summary["results"]] == systems
    for result in summary["results"]:
        assert [run["target_tokens"] for run in result["runs"]] == [N * LENGTH] * 2
    manifest = json.loads((tmp_path / "nllb-fp32" / "manifest.json").read_text())
    assert manifest["model"]["vocab_size"] == 9000 and len(manifest["source_tokens"]) == 202
    # The engine again with a shortlist: its own bundles, the same number of tokens decoded.
    assert [r["system"] for r in summary["shortlist"]] == systems[:2]
    for result in summary["shortlist"]:
        assert [run["target_tokens"] for run in result["runs"]] == [N * LENGTH] * 2
    shortlisted = json.loads((tmp_path / "nllb-int8-shortlist" / "manifest.json").read_text())
    assert shortlisted["shortlist"]["per_token"] == 100 and "shortlist" not in manifest
    assert summary["goals"]["engine-fp32+shortlist / engine-fp32 (batch 4, beam 4)"] > 0
    if "ct2-fp32" in systems:
        assert "ct2-fp32 output vs engine-fp32: equal" in done.stdout
        assert {goal for goal in summary["goals"] if "shortlist" not in goal} == {
            "engine-fp32 / ct2 (batch 1, beam 4)",
            "engine-fp32 / ct2 (batch 4, beam 4)",
        }
