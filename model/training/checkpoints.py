"""Checkpoint files: atomic writes, the optimizer's state as named tensors, and averaging.

DIR/checkpoints/ holds update_NNNNNN.safetensors (the model's weights at that update) and
last_state.safetensors (weights, optimizer and counters in one file: loop.Trainer.save_state).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from model.transformer import Transformer

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "last_state.safetensors"


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_save_tensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata)
    os.replace(tmp, path)


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of several state dicts (in fp64, returned in the stored dtype)."""
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        for name, tensor in load_file(str(path)).items():
            total[name] = total.get(name, 0) + tensor.double()
            dtypes[name] = tensor.dtype
    return {name: (t / len(paths)).to(dtypes[name]) for name, t in total.items()}


def optimizer_tensors(model: Transformer, optimizer: torch.optim.Adam) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, param in model.named_parameters():
        for key, value in optimizer.state.get(param, {}).items():
            tensors[f"optim.{name}.{key}"] = torch.as_tensor(value)
    return tensors


def load_optimizer_tensors(
    model: Transformer, optimizer: torch.optim.Adam, tensors: dict[str, torch.Tensor]
) -> None:
    device = next(model.parameters()).device
    for name, param in model.named_parameters():
        state = {
            key.rsplit(".", 1)[-1]: value
            for key, value in tensors.items()
            if key.startswith(f"optim.{name}.") and key.count(".") == name.count(".") + 2
        }
        if state:
            optimizer.state[param] = {
                k: (v if k == "step" else v.to(device)) for k, v in state.items()
            }
