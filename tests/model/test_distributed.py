"""Training in several processes (torchrun, gloo on the CPU): two processes with one batch
each per update move the weights as one process does with two batches per update
(--accumulate 2), and rank 0 alone writes the run."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model.data import Example, read_lines
from model.training.distributed import World
from model.training.loop import Trainer
from model.training.recipe import TrainConfig
from model.transformer import EOS_ID, ModelConfig, Transformer
from tests.conftest import REPO, TINY_TEST_CONFIG

# The weights of the two runs after the same updates: equal up to the order in which float
# sums are taken (each process's gradient is summed with the other's, not accumulated).
TOLERANCE = 1e-5


def write(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


@pytest.fixture(scope="module")
def data(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("distributed_data")
    src, tgt = read_lines(multi30k / "train.en.gz"), read_lines(multi30k / "train.de.gz")
    config = {
        "model": {**TINY_TEST_CONFIG, "dropout": 0.0, "max_positions": 128},  # no masks
        "training": {
            "max_updates": 4, "max_tokens": 300, "warmup_updates": 2, "vocab_size": 300,
            "save_every": 4, "valid_every": 4, "log_every": 1, "valid_bleu_sentences": 4,
            "average_last": 1, "lr": 0.003,
        },
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    return [
        "--src-train", str(write(root / "train.en.gz", src[:300])),
        "--tgt-train", str(write(root / "train.de.gz", tgt[:300])),
        "--src-valid", str(write(root / "valid.en.gz", src[300:308])),
        "--tgt-valid", str(write(root / "valid.de.gz", tgt[300:308])),
        "--config", str(root / "config.json"), "--threads", "1",
    ]  # fmt: skip


def train(command: list[str]) -> None:
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_processes_make_the_update_of_one_with_two_batches(
    data: list[str], tmp_path: Path
) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    train(
        [
            *torchrun,
            "--nproc_per_node",
            "2",
            "-m",
            "model.train",
            *data,
            "--out",
            str(tmp_path / "two"),
        ]
    )
    train(
        [
            sys.executable,
            "-m",
            "model.train",
            *data,
            "--accumulate",
            "2",
            "--out",
            str(tmp_path / "one"),
        ]
    )
    last = Path("checkpoints") / "update_000004.safetensors"
    two, one = load_file(tmp_path / "two" / last), load_file(tmp_path / "one" / last)
    assert two.keys() == one.keys()
    worst = max(float((two[k] - one[k]).abs().max()) for k in two)
    assert worst <= TOLERANCE  # 0.0 on this machine: the same sums in the same order
    rows = [
        json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    ]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["update"] for r in train_rows] == [1, 2, 3, 4]  # one writer: rank 0
    assert {r["batches_per_update"] for r in train_rows} == {2}
    one_rows = [
        json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["loss"] for r in train_rows] == pytest.approx(
        [r["loss"] for r in one_rows if r["split"] == "train"], rel=1e-5
    )
    assert (tmp_path / "two" / "model.safetensors").is_file()


def test_a_distributed_run_resumes_where_it_stopped(data: list[str], tmp_path: Path) -> None:
    """Two processes stopped after update 2 (its checkpoint and state) and resumed to update
    4 end where the same run without a stop ends."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    run = [*torchrun, "-m", "model.train", *data, "--save-every", "2"]
    train([*run, "--out", str(tmp_path / "whole")])
    train([*run, "--max-updates", "2", "--out", str(tmp_path / "stopped")])
    train([*run, "--resume", "--out", str(tmp_path / "stopped")])
    last = Path("checkpoints") / "update_000004.safetensors"
    whole, resumed = load_file(tmp_path / "whole" / last), load_file(tmp_path / "stopped" / last)
    assert max(float((whole[k] - resumed[k]).abs().max()) for k in whole) <= TOLERANCE


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (TrainConfig(train_aligner=True, max_tokens=3), "one process"),  # a batch each
        (TrainConfig(alignment_weight=0.5, max_tokens=3), "one process"),
        (TrainConfig(max_tokens=10_000, accumulate=4), "fewer than one update takes"),
    ],
)
def test_what_several_processes_cannot_train_is_refused_before_training(
    recipe: TrainConfig, message: str, tmp_path: Path
) -> None:
    """Checked in the Trainer before any process group work: a clear error, nothing written."""
    config = ModelConfig(vocab_size=40, **TINY_TEST_CONFIG)  # type: ignore[arg-type]
    examples = [Example([5, 6, EOS_ID], [7, 8, EOS_ID]) for _ in range(4)]  # one batch
    world = World(rank=0, size=2)
    with pytest.raises(ValueError, match=message):
        Trainer(
            Transformer(config), None, recipe, tmp_path, torch.device("cpu"), examples,
            [], [], [], "de", world,
        )  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_a_run_resumed_with_another_split_of_its_updates_is_refused(tmp_path: Path) -> None:
    """The saved state records processes x accumulate; resuming with another is an error,
    not a silently different run."""
    config = ModelConfig(vocab_size=40, **TINY_TEST_CONFIG)  # type: ignore[arg-type]
    examples = [Example([5, 6, EOS_ID], [7, 8, EOS_ID]) for _ in range(4)]

    def trainer(accumulate: int) -> Trainer:
        recipe = TrainConfig(max_tokens=3, accumulate=accumulate)  # a batch per example
        return Trainer(
            Transformer(config), None, recipe, tmp_path, torch.device("cpu"), examples,
            [], [], [], "de",
        )  # fmt: skip

    (tmp_path / "checkpoints").mkdir()
    trainer(2).save_state()
    trainer(2).load_state()  # the same split: fine
    with pytest.raises(ValueError, match="same number of processes and --accumulate"):
        trainer(1).load_state()
