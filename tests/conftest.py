"""Session-wide fixtures: the Multi30k location and a tiny checkpoint built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from model.data import read_lines
from model.tokenizer import TOKENIZER_FILE, train_tokenizer
from model.transformer import ModelConfig, Transformer, save_model

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))

# Small enough to build and decode in seconds, with every architectural part present.
TINY_TEST_CONFIG = dict(
    d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, max_positions=48
)


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MULTI30K_DIR)")
    return MULTI30K


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, multi30k: Path) -> Path:
    """A checkpoint directory (config.json, model.safetensors, tokenizer.json) with random
    weights and a real BPE trained on 2000 Multi30k lines: what export and serving consume."""
    out = tmp_path_factory.mktemp("tiny_checkpoint")
    src = read_lines(multi30k / "train.en.gz")[:2000]
    tgt = read_lines(multi30k / "train.de.gz")[:2000]
    tokenizer = train_tokenizer(src + tgt, vocab_size=600)
    tokenizer.save(str(out / TOKENIZER_FILE))
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.get_vocab_size(), **TINY_TEST_CONFIG)  # type: ignore[arg-type]
    save_model(
        Transformer(config).eval(),
        out,
        {"source_language": "en", "target_language": "de", "note": "random weights, tests only"},
    )
    return out
