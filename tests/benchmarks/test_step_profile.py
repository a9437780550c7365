"""benchmarks.step_profile on the tiny eos bundle: every decoder step is counted once, the
breakdown adds up to the pass, and the operator profile names the step graph's kernels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

N = 6


# With 2 threads the tiny model's steps run on the engine's one-thread session (StepSessions):
# they are counted and profiled all the same.
@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_breakdown_counts_every_step_and_adds_up(
    eos_bundle: Path, multi30k: Path, threads: str
) -> None:
    argv = [
        sys.executable, "-m", "benchmarks.step_profile", "--bundle", str(eos_bundle),
        "--src", str(multi30k / "val.en.gz"), "--n", str(N), "--threads", threads,
        "--batch-sizes", "1", "3", "--beam-sizes", "1", "2", "--repeat", "1", "--ort-profile",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=600)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    results = {(r["batch_size"], r["beam_size"]): r for r in summary["results"]}
    assert set(results) == {(1, 1), (3, 1), (1, 2), (3, 2)}
    sentences = summary["sentences"]
    greedy = results[(1, 1)]
    # Batch 1, greedy: one step per token, plus one for each </s>.
    assert greedy["tokens"] <= greedy["steps"] <= greedy["tokens"] + sentences
    # A batch of 3 steps together: fewer runs than one sentence at a time.
    assert results[(3, 1)]["steps"] < greedy["steps"]
    for r in results.values():
        assert r["step_run_seconds"] > 0 and r["encoder_seconds"] > 0 and r["host_seconds"] > 0
        parts = r["step_run_seconds"] + r["encoder_seconds"] + r["host_seconds"]
        assert abs(parts - r["seconds"]) < 1e-6
        operators = r["operators"]
        assert "MultiHeadAttention" in operators and "TopK" in operators
        assert operators["TopK"]["nodes_per_step"] == 1.0  # one TopK per step run
        assert r["device"] == "cpu" and not r["cuda_graphs"]
        assert all(o["cpu_nodes_per_step"] == o["nodes_per_step"] for o in operators.values())
