"""The run's history: metrics.jsonl (one JSON row per log, validation and the final average)
and training_curve.png drawn from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model.training.checkpoints import atomic_write_text

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training_curve.png"


def append_row(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def rows_through(path: Path, update: int) -> list[dict[str, Any]]:
    """The rows up to `update`, the file rewritten without the later ones: rows logged after
    the saved state (before a crash) are replayed on resume. [] when there is no file."""
    if not path.is_file():
        return []
    rows = [
        row for row in map(json.loads, path.read_text().splitlines()) if row["update"] <= update
    ]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return rows


def plot_history(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in history if r["split"] == "train"]
    valid = [r for r in history if r["split"] == "valid"]
    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(
        [r["update"] for r in train], [r["loss"] for r in train], label="train (smoothed CE)"
    )
    ax_loss.plot([r["update"] for r in valid], [r["nll"] for r in valid], "o-", label="valid NLL")
    ax_loss.set_xlabel("update")
    ax_loss.set_ylabel("loss per target token (nats)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_bleu.plot([r["update"] for r in valid], [r["bleu"] for r in valid], "o-", color="C2")
    ax_bleu.set_xlabel("update")
    ax_bleu.set_ylabel("valid BLEU (greedy, sacreBLEU)")
    ax_bleu.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
