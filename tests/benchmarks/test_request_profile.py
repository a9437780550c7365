"""benchmarks.request_profile on the tiny eos bundle: every layer answers every request, and
the runtime's clocked parts (prepare, the engine call, assemble) are each seen and add up to
no more than the requests took."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

N = 5


def test_every_layer_answers_and_the_parts_add_up(eos_bundle: Path, multi30k: Path) -> None:
    argv = [
        sys.executable, "-m", "benchmarks.request_profile", "--bundle", str(eos_bundle),
        "--src", str(multi30k / "val.en.gz"), "--n", str(N), "--beam-size", "2",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=600)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    results = summary["results"]
    assert list(results) == ["engine", "runtime", "app", "http"]
    for layer in results.values():
        assert layer["requests"] == N
        assert 0 < layer["p50_ms"] <= layer["p90_ms"]
    runtime = results["runtime"]
    parts = [runtime[f"{part}_ms"] for part in ("prepare", "engine", "assemble")]
    assert all(part > 0 for part in parts)
    assert runtime["rest_ms"] >= 0  # the parts of n requests, within the n requests' time
    assert "| http |" in done.stdout and "inside runtime" in done.stdout
