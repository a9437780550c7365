"""Bundles exported once per session from the tiny checkpoint, and the sentences they decode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from export.onnx_export import export_bundle
from model.data import read_lines
from model.tokenizer import TOKENIZER_FILE
from model.transformer import CONFIG_FILE, EOS_ID, load_model, save_model

N_SENTENCES = 20


@pytest.fixture(scope="session")
def fp32_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_fp32")
    export_bundle(tiny_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def int8_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_int8")
    export_bundle(tiny_checkpoint, out, dtype="int8")
    return out


@pytest.fixture(scope="session")
def fp16_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_fp16")
    export_bundle(tiny_checkpoint, out, dtype="fp16")
    return out


@pytest.fixture(scope="session")
def eos_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint edited so that searches end with </s> after 6 to 48 tokens.

    With random weights every hypothesis runs to max_positions, so finished rows would never
    leave the batch (Stepper.select) and parity would not cover that path. Making </s>'s
    embedding longer and pushing the last decoder norm's output towards it gives varied lengths.
    """
    model = load_model(tiny_checkpoint)
    with torch.no_grad():
        eos = model.embedding.weight[EOS_ID]
        model.decoder_layers[-1].sublayer[-1].norm.bias += eos / eos.norm()
        eos *= 4
    out = tmp_path_factory.mktemp("eos_checkpoint")
    meta = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    meta.pop("model")
    save_model(model, out, meta)
    shutil.copyfile(tiny_checkpoint / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return out


@pytest.fixture(scope="session")
def eos_bundle(eos_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_eos")
    export_bundle(eos_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def val_src(multi30k: Path) -> list[str]:
    return read_lines(multi30k / "val.en.gz")[:N_SENTENCES]


@pytest.fixture(scope="session")
def val_ref(multi30k: Path) -> list[str]:
    return read_lines(multi30k / "val.de.gz")[:N_SENTENCES]
