"""The training recipe (TrainConfig) and the model's fields, from --preset, --config FILE.json
({"model": {...}, "training": {...}}) or --init-from DIR, with the flags on top; every field is
checked here, before anything is read or written."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.data import DataError
from model.tokenizer import TOKENIZER_FILE
from model.transformer import CONFIG_FILE, PAD_ID, PRESETS, WEIGHTS_FILE, ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    """The training recipe; saved in config.json next to the model config."""

    max_updates: int = 8000
    max_tokens: int = 4096
    lr: float = 0.005
    warmup_updates: int = 2000
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    max_len: int = 128
    vocab_size: int = 8000
    seed: int = 1
    log_every: int = 50
    valid_every: int = 500
    save_every: int = 100
    average_last: int = 10
    valid_bleu_sentences: int = 1014
    precision: str = "fp32"
    # R-Drop (Liang et al., 2021): each batch goes through the model twice (two dropout masks)
    # and the loss adds this multiple of the symmetric KL between the two output distributions.
    # 0 trains on the plain cross-entropy, one pass per batch.
    rdrop_alpha: float = 0.0
    # Guided alignment (Garg et al., 2019): the loss adds this multiple of the cross-entropy
    # between the model's alignment head (ModelConfig.alignment_layer/head) and a word aligner's
    # links (`--alignments`, model/alignment.py), per target token. 0: no alignment loss.
    alignment_weight: float = 0.0
    # Train the model's aligner alone (ModelConfig.aligner, added if the model has none) on the
    # cross-entropy of its weights against the aligner's links; every other weight is frozen,
    # so the model translates exactly as before (model/train.py --train-aligner).
    train_aligner: bool = False
    # Batches per update in each process (gradient accumulation): an update sums the gradients
    # of accumulate x processes batches of up to max_tokens tokens, over all their tokens.
    accumulate: int = 1
    # Stream the training files instead of reading them whole: this many pairs at a time are
    # encoded, batched by length and shuffled (a corpus larger than memory); 0: in memory.
    stream_buffer: int = 0

    def __post_init__(self) -> None:
        if self.accumulate < 1:
            raise ValueError(f"accumulate must be at least 1, got {self.accumulate}")
        if self.stream_buffer < 0:
            raise ValueError(f"stream_buffer must be >= 0 (0: in memory), got {self.stream_buffer}")
        if self.stream_buffer and self.aligned:
            raise ValueError(
                "guided alignment and --train-aligner read their corpus whole: no stream_buffer"
            )
        if not 0 <= self.rdrop_alpha < math.inf:
            raise ValueError(f"rdrop_alpha must be >= 0, got {self.rdrop_alpha}")
        if not 0 <= self.alignment_weight < math.inf:
            raise ValueError(f"alignment_weight must be >= 0, got {self.alignment_weight}")
        if self.alignment_weight and self.rdrop_alpha:
            raise ValueError("guided alignment and R-Drop are not combined: set one of them")
        if self.train_aligner and (self.alignment_weight or self.rdrop_alpha):
            raise ValueError(
                "train_aligner trains the aligner alone, on its alignment loss: "
                "no alignment_weight or rdrop_alpha with it"
            )

    @property
    def aligned(self) -> bool:
        """Whether training reads word links (`--alignments`): guided alignment or the
        aligner."""
        return bool(self.alignment_weight) or self.train_aligner


# Model fields a config may add to an --init-from model: they choose how it aligns, or shape an
# aligner it does not have yet (train_aligner gives it one), and change no trained weight.
ALIGNMENT_FIELDS = ("alignment_layer", "alignment_head", "aligner_hidden")


def init_model_fields(directory: Path) -> dict[str, Any]:
    """The model config of the directory --init-from names, once its three files are there."""
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
        if not (directory / name).is_file():
            raise DataError(f"--init-from: {directory} has no {name}")
    model = json.loads((directory / CONFIG_FILE).read_text()).get("model")
    if not isinstance(model, dict):
        raise DataError(f"--init-from: {directory / CONFIG_FILE} has no model section")
    return dict(model)


def build_configs(args: argparse.Namespace) -> tuple[dict[str, Any], TrainConfig]:
    """Model overrides (vocab size comes later, from the tokenizer) and the training recipe.

    `args` is model/train.py's: --preset, --config, --init-from, --device, and a flag for each
    TrainConfig field it overrides (--max-updates -> max_updates, ...)."""
    model_fields: dict[str, Any]
    raw: dict[str, Any] = {}
    if args.config is not None:
        if not args.config.is_file():
            raise DataError(f"no such config file: {args.config}")
        raw = json.loads(args.config.read_text())
    training = dict(raw.get("training", {}))
    if args.init_from is not None:
        added = dict(raw.get("model", {}))
        if args.preset is not None or set(added) - set(ALIGNMENT_FIELDS):
            raise DataError(
                "--init-from takes the model from its directory: drop --preset and the "
                f"config's model section but for {', '.join(ALIGNMENT_FIELDS)}"
            )
        model_fields = {**init_model_fields(args.init_from), **added}
    elif args.config is not None:
        model_fields = dict(raw.get("model", {}))
    else:
        model_fields = {"preset": args.preset or "tiny"}
    if "preset" in model_fields:
        name = model_fields.pop("preset")
        if name not in PRESETS:
            raise DataError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        model_fields = {**PRESETS[name], **model_fields}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(training) - known
    if unknown:
        raise DataError(f"unknown training fields in {args.config}: {sorted(unknown)}")
    for name in known:
        value = getattr(args, name, None)
        if value is not None:
            training[name] = value
    if "adam_betas" in training:
        training["adam_betas"] = tuple(training["adam_betas"])
    if "precision" not in training:
        cuda = args.device.startswith("cuda")
        training["precision"] = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    for name in ("alignment_layer", "alignment_head"):  # no weights change: on top of any model
        value = getattr(args, name, None)
        if value is not None:
            model_fields[name] = value
    if training.get("train_aligner"):
        model_fields["aligner"] = True
    elif training.get("alignment_weight") and model_fields.get("aligner"):
        raise DataError(
            "guided alignment trains a head, and this model aligns through its aligner: "
            "train the aligner with --train-aligner instead"
        )
    model_fields.pop("vocab_size", None)
    # Validate the model fields now (with a placeholder vocabulary) so errors come before I/O.
    try:
        ModelConfig(vocab_size=PAD_ID + 16, **model_fields)
    except TypeError as e:
        raise DataError(f"bad model config: {e}") from e
    return model_fields, TrainConfig(**training)
