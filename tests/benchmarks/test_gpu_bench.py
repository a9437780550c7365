"""benchmarks/gpu_bench.py without a GPU: the command exports its bundles, runs its systems and
reports the goals, with the portable (CUDA) graph held to the CPU's graph token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_bench import goals, main


def test_gpu_bench_runs_on_the_cpu(
    tiny_checkpoint: Path, multi30k: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu_bench.json"
    argv = ["--checkpoint", str(tiny_checkpoint), "--src", str(multi30k / "val.en.gz")]
    argv += ["--n", "6", "--device", "cpu", "--batch-sizes", "1", "2", "--beam-sizes", "1", "2"]
    argv += ["--repeat", "1", "--threads", "1", "--json", str(out)]
    argv += ["--systems", "engine-fp32", "engine-fp32-graphs", "engine-fp32-cpu"]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert not [r for r in summary["results"] if "error" in r], summary["results"]
    runs = {r["system"]: r["runs"] for r in summary["results"]}
    assert set(runs) == {"engine-fp32", "engine-fp32-graphs", "engine-fp32-cpu"}
    assert all(len(r) == 4 for r in runs.values())  # batch 1 and 2, greedy and beam 2
    assert all(r[0]["ms_per_step"] > 0 for r in runs.values())  # batch 1, greedy
    goals = "\n".join(summary["goals"])
    assert "| engine-fp32 equals the CPU engine on >= 99.5% | 100.00% |" in goals
    assert "| fp32: CUDA graphs on equal off | 100.00% |" in goals


def test_goals_hold_the_best_engine_to_ctranslate2_in_each_cell() -> None:
    """Beam 4 at batch 1 and 32 against CTranslate2's float16 and int8_float16: the worst cell
    counts, each cell against the fastest engine on the device."""

    def system(name: str, speeds: dict[int, float]) -> dict[str, object]:
        runs = [
            {"batch_size": b, "beam_size": 4, "target_tokens": t, "seconds": 1.0}
            | {"ms_per_step": None, "outputs": []}
            for b, t in speeds.items()
        ]
        return {"system": name, "runs": runs}

    summary = {
        "results": [
            system("engine-fp16", {1: 500.0, 32: 9_000.0}),
            system("engine-fp16-graphs", {1: 1_000.0, 32: 8_000.0}),
            system("ct2-fp16", {1: 2_000.0, 32: 9_000.0}),
            system("ct2-int8-fp16", {1: 800.0, 32: 4_500.0}),
        ]
    }
    line = next(g for g in goals(summary) if "CTranslate2" in g)
    assert line.endswith("| 0.50x at worst (ct2-fp16 batch 1) |"), line
    assert "| n/a |" in next(g for g in goals({"results": []}) if "CTranslate2" in g)
