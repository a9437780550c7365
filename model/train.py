"""Train the Transformer on parallel text.

    python -m model.train --src-train F --tgt-train F --src-valid F --tgt-valid F --out DIR
        [--preset tiny|base | --config FILE.json] [--max-updates N] [--max-tokens N]
        [--device cpu|cuda] [--seed S] [--resume] [--average-last K] [--init-from MODEL_DIR]

DIR receives model.safetensors (the average of the last K checkpoints), config.json (model
config, training recipe, data files with their sha256), tokenizer.json, metrics.jsonl and
training_curve.png; DIR/checkpoints/ holds the periodic checkpoints and the resumable state.
--init-from starts from a trained model directory (its weights, architecture and tokenizer) to
continue or fine-tune it under this run's recipe. Every input is checked before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tqdm import tqdm

from model.data import (
    Batch,
    DataError,
    Example,
    encode_pairs,
    epoch_batches,
    read_parallel,
    token_budget_batches,
)
from model.evaluate import score_translations, translate
from model.tokenizer import TOKENIZER_FILE, load_tokenizer, train_tokenizer
from model.transformer import (
    CONFIG_FILE,
    PAD_ID,
    PRESETS,
    WEIGHTS_FILE,
    ModelConfig,
    Transformer,
    save_model,
)
from service.bundle.manifest import sha256_file

log = logging.getLogger("model.train")

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "last_state.safetensors"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training_curve.png"


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

    def __post_init__(self) -> None:
        if not 0 <= self.rdrop_alpha < math.inf:
            raise ValueError(f"rdrop_alpha must be >= 0, got {self.rdrop_alpha}")


@dataclass
class TrainerState:
    update: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    checkpoints: list[str] = field(default_factory=list)


def learning_rate(update: int, config: TrainConfig) -> float:
    """The paper's schedule, parameterised by its peak: linear warmup, then lr * sqrt(warmup/step).

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) is this curve with the peak
    d_model^-0.5 * warmup^-0.5; naming the peak directly makes recipes comparable.
    """
    step = max(update, 1)
    return config.lr * min(step / config.warmup_updates, math.sqrt(config.warmup_updates / step))


def language_of(path: str | Path) -> str:
    """'train.en.gz' -> 'en'."""
    name = Path(path).name.removesuffix(".gz")
    return name.rsplit(".", 1)[-1] if "." in name else ""


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


class Trainer:
    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        config: TrainConfig,
        out: Path,
        device: torch.device,
        train_examples: list[Example],
        valid_examples: list[Example],
        valid_src: list[str],
        valid_ref: list[str],
        target_language: str,
    ) -> None:
        self.model, self.tokenizer, self.config, self.out, self.device = (
            model,
            tokenizer,
            config,
            out,
            device,
        )
        self.train_examples, self.valid_examples = train_examples, valid_examples
        self.valid_src, self.valid_ref = valid_src, valid_ref
        self.target_language = target_language
        self.batches = token_budget_batches(train_examples, config.max_tokens)
        self.optimizer = torch.optim.Adam(
            model.parameters(),
            lr=config.lr,
            betas=config.adam_betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.state = TrainerState()
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.ckpt_dir = out / CHECKPOINT_DIR
        self.history: list[dict[str, Any]] = []

    def autocast(self) -> Any:
        if self.config.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.config.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def loss(self, batch: Batch, label_smoothing: float) -> tuple[torch.Tensor, int]:
        """Summed label-smoothed cross-entropy over non-pad target tokens, and their count."""
        with self.autocast():
            logits = self.model(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
            reduction="sum",
        )
        return loss, batch.n_tgt_tokens

    def training_loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        """The objective summed over target tokens, and their count.

        With R-Drop, the batch is stacked on itself and run in one pass, so the two copies see
        different dropout masks: the loss is both copies' label-smoothed cross-entropy plus
        alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2 per target token (the paper's L_NLL^1 +
        L_NLL^2 + alpha * L_KL), over the doubled batch's 2N target tokens.
        """
        config = self.config
        if config.rdrop_alpha == 0:
            return self.loss(batch, config.label_smoothing)
        doubled = Batch(*(torch.cat([t, t]) for t in (batch.src, batch.tgt_in, batch.tgt_out)))
        with self.autocast():
            logits = self.model(doubled.src, doubled.tgt_in)  # (2B, T, V)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        cross_entropy = F.cross_entropy(
            log_probs.flatten(0, 1),
            doubled.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=config.label_smoothing,
            reduction="sum",
        )
        first, second = log_probs.chunk(2)
        # KL(p1 || p2) + KL(p2 || p1) = sum_v (p1 - p2) * (log p1 - log p2), per position.
        symmetric = ((first.exp() - second.exp()) * (first - second)).sum(-1)
        kl = symmetric[batch.tgt_out != PAD_ID].sum() / 2
        return cross_entropy + config.rdrop_alpha * kl, doubled.n_tgt_tokens

    # --- resumable state -------------------------------------------------------------------

    def save_state(self) -> None:
        """Weights, optimizer and counters in ONE atomic file: a crash leaves the old or the new
        state, never a mix (the counters ride in the safetensors metadata)."""
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        tensors.update(optimizer_tensors(self.model, self.optimizer))
        metadata = {
            "trainer_state": json.dumps(dataclasses.asdict(self.state)),
            "grad_scaler": json.dumps(self.scaler.state_dict()),
        }
        atomic_save_tensors(tensors, self.ckpt_dir / STATE_FILE, metadata)

    def load_state(self) -> None:
        path = self.ckpt_dir / STATE_FILE
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        self.model.load_state_dict(
            {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        )
        load_optimizer_tensors(self.model, self.optimizer, tensors)
        self.state = TrainerState(**json.loads(metadata["trainer_state"]))
        scaler_state = json.loads(metadata["grad_scaler"])
        if scaler_state:
            self.scaler.load_state_dict(scaler_state)
        # Rows logged after the saved update (before a crash) are replayed: drop them.
        metrics = self.out / METRICS_FILE
        if metrics.is_file():
            self.history = [
                row
                for row in map(json.loads, metrics.read_text().splitlines())
                if row["update"] <= self.state.update
            ]
            atomic_write_text(metrics, "".join(json.dumps(row) + "\n" for row in self.history))

    def save_checkpoint(self) -> None:
        path = self.ckpt_dir / f"update_{self.state.update:06d}.safetensors"
        atomic_save_tensors(self.model.state_dict(), path)
        keep = max(self.config.average_last, 1)
        names = [*self.state.checkpoints, path.name]
        stale, self.state.checkpoints = names[:-keep], names[-keep:]
        self.save_state()
        # Only once the state no longer names them.
        for old in stale:
            (self.ckpt_dir / old).unlink(missing_ok=True)

    # --- validation ----------------------------------------------------------------------------

    @torch.inference_mode()
    def validate(self) -> dict[str, float]:
        self.model.eval()
        total, tokens = 0.0, 0
        for indices in token_budget_batches(self.valid_examples, self.config.max_tokens):
            batch = Batch.from_examples([self.valid_examples[i] for i in indices]).to(self.device)
            loss, n = self.loss(batch, label_smoothing=0.0)
            total, tokens = total + float(loss), tokens + n
        n_bleu = min(self.config.valid_bleu_sentences, len(self.valid_src))
        texts, _ = translate(
            self.model, self.tokenizer, self.valid_src[:n_bleu], beam_size=1, batch_size=128
        )
        scores = score_translations(texts, self.valid_ref[:n_bleu], self.target_language)
        self.model.train()
        return {"nll": total / tokens, "ppl": math.exp(total / tokens), "bleu": scores["bleu"]}

    def record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        with open(self.out / METRICS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")

    # --- the loop ------------------------------------------------------------------------------

    def train(self) -> None:
        config, state = self.config, self.state
        self.model.train()
        progress = tqdm(
            total=config.max_updates, initial=state.update, desc="train", dynamic_ncols=True
        )
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        while state.update < config.max_updates:
            batches = list(epoch_batches(self.batches, config.seed, state.epoch))
            for indices in batches[state.batch_in_epoch :]:
                if state.update >= config.max_updates:
                    break
                state.batch_in_epoch += 1
                torch.manual_seed(config.seed * 1_000_003 + state.update)  # dropout, resumable
                batch = Batch.from_examples([self.train_examples[i] for i in indices])
                batch = batch.to(self.device)
                lr = learning_rate(state.update + 1, config)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                loss, n_tokens = self.training_loss(batch)
                self.optimizer.zero_grad(set_to_none=True)
                self.scaler.scale(loss / n_tokens).backward()
                if config.clip_norm > 0:
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                state.update += 1
                window_loss += float(loss.detach())
                window_tokens += n_tokens
                progress.update(1)

                if state.update % config.log_every == 0 or state.update == config.max_updates:
                    elapsed = time.perf_counter() - window_start
                    row = {
                        "update": state.update,
                        "split": "train",
                        "loss": window_loss / window_tokens,
                        "lr": lr,
                        "tokens_per_s": window_tokens / elapsed,
                        "seconds_per_update": elapsed / (config.log_every or 1),
                        "epoch": state.epoch,
                    }
                    self.record(row)
                    progress.set_postfix(
                        loss=f"{row['loss']:.3f}",
                        lr=f"{lr:.2e}",
                        tok_s=f"{row['tokens_per_s']:.0f}",
                    )
                    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
                if state.update % config.save_every == 0 or state.update == config.max_updates:
                    self.save_checkpoint()
                if state.update % config.valid_every == 0 or state.update == config.max_updates:
                    metrics = self.validate()
                    self.record({"update": state.update, "split": "valid", **metrics})
                    progress.write(
                        f"update {state.update}: valid nll {metrics['nll']:.3f} "
                        f"ppl {metrics['ppl']:.2f} bleu {metrics['bleu']:.2f}"
                    )
                    window_start = time.perf_counter()
            else:
                state.epoch += 1
                state.batch_in_epoch = 0
        progress.close()


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model.train", description=__doc__.split("\n")[1])
    p.add_argument("--src-train", required=True)
    p.add_argument("--tgt-train", required=True)
    p.add_argument("--src-valid", required=True)
    p.add_argument("--tgt-valid", required=True)
    p.add_argument("--out", required=True, type=Path)
    arch = p.add_mutually_exclusive_group()
    arch.add_argument("--preset", help=f"one of {sorted(PRESETS)} (default tiny)")
    arch.add_argument("--config", type=Path, help="JSON: {'model': {...}, 'training': {...}}")
    p.add_argument("--max-updates", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-updates", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--save-every", type=int)
    p.add_argument("--valid-every", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--valid-bleu-sentences", type=int)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--rdrop-alpha", type=float, help="R-Drop's KL weight (0: off)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, help="torch intra-op threads (CPU)")
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoints")
    p.add_argument("--average-last", type=int)
    p.add_argument(
        "--init-from",
        type=Path,
        help="a trained model directory to start from (its weights, model config and tokenizer)",
    )
    p.add_argument("--src-lang", help="default: from the file name, e.g. train.en.gz -> en")
    p.add_argument("--tgt-lang")
    return p.parse_args(argv)


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
    """Model overrides (vocab size comes later, from the tokenizer) and the training recipe."""
    model_fields: dict[str, Any]
    raw: dict[str, Any] = {}
    if args.config is not None:
        if not args.config.is_file():
            raise DataError(f"no such config file: {args.config}")
        raw = json.loads(args.config.read_text())
    training = dict(raw.get("training", {}))
    if args.init_from is not None:
        if args.preset is not None or "model" in raw:
            raise DataError(
                "--init-from takes the model from its directory: "
                "drop --preset and the config's model section"
            )
        model_fields = init_model_fields(args.init_from)
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
    model_fields.pop("vocab_size", None)
    # Validate the model fields now (with a placeholder vocabulary) so errors come before I/O.
    try:
        ModelConfig(vocab_size=PAD_ID + 16, **model_fields)
    except TypeError as e:
        raise DataError(f"bad model config: {e}") from e
    return model_fields, TrainConfig(**training)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        return run(args)
    except (DataError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    # 1. Check everything before writing anything.
    model_fields, config = build_configs(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DataError("--device cuda asked for, but CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    src_train, tgt_train = read_parallel(args.src_train, args.tgt_train)
    src_valid, tgt_valid = read_parallel(args.src_valid, args.tgt_valid)
    state_file = out / CHECKPOINT_DIR / STATE_FILE
    if args.resume and not state_file.is_file():
        raise DataError(f"--resume: no training state at {state_file}")
    if not args.resume and out.exists() and any(out.iterdir()):
        raise DataError(f"{out} is not empty; pass --resume to continue or choose another --out")
    src_lang = args.src_lang or language_of(args.src_train)
    tgt_lang = args.tgt_lang or language_of(args.tgt_train)

    # 2. Tokenizer: trained once on both sides of the training text, reused on resume; a run
    # started from a trained model keeps that model's.
    if args.resume:
        tokenizer = load_tokenizer(out / TOKENIZER_FILE)
    elif args.init_from is not None:
        tokenizer = load_tokenizer(args.init_from / TOKENIZER_FILE)
    else:
        log.info("training a joint BPE of %d tokens", config.vocab_size)
        tokenizer = train_tokenizer(src_train + tgt_train, config.vocab_size)
    train_examples = encode_pairs(tokenizer, src_train, tgt_train, config.max_len)
    valid_examples = encode_pairs(tokenizer, src_valid, tgt_valid, config.max_len)
    if not train_examples:
        raise DataError(f"no usable training pairs in {args.src_train} / {args.tgt_train}")
    if not valid_examples:
        raise DataError(f"no usable validation pairs in {args.src_valid} / {args.tgt_valid}")
    model_config = ModelConfig(vocab_size=tokenizer.get_vocab_size(), **model_fields)
    if config.max_len > model_config.max_positions:
        raise DataError(f"max_len {config.max_len} > max_positions {model_config.max_positions}")

    torch.manual_seed(config.seed)
    model = Transformer(model_config)
    if args.init_from is not None and not args.resume:  # on resume the saved state has them
        try:
            model.load_state_dict(load_file(str(args.init_from / WEIGHTS_FILE)))
        except RuntimeError as e:
            raise DataError(f"--init-from: {args.init_from} does not match its config: {e}") from e
    model = model.to(device)
    log.info(
        "%s -> %s: %d train / %d valid pairs, %d parameters, %s on %s",
        src_lang,
        tgt_lang,
        len(train_examples),
        len(valid_examples),
        model.num_parameters(),
        config.precision,
        device,
    )

    # 3. Train.
    (out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / TOKENIZER_FILE))
    trainer = Trainer(
        model,
        tokenizer,
        config,
        out,
        device,
        train_examples,
        valid_examples,
        src_valid,
        tgt_valid,
        tgt_lang,
    )
    if args.resume:
        trainer.load_state()
        log.info("resumed at update %d", trainer.state.update)
    if trainer.state.update < config.max_updates:
        trainer.train()

    # 4. Final model: the average of the last K checkpoints.
    paths = [out / CHECKPOINT_DIR / name for name in trainer.state.checkpoints]
    paths = paths[-max(config.average_last, 1) :]
    model.load_state_dict(average_checkpoints(paths))
    final = trainer.validate()
    trainer.record({"update": trainer.state.update, "split": "valid_averaged", **final})
    log.info("averaged %d checkpoints: valid %s", len(paths), final)
    data = {
        name: {"path": str(path), "sha256": sha256_file(Path(path)), "lines": len(lines)}
        for name, path, lines in (
            ("src_train", args.src_train, src_train),
            ("tgt_train", args.tgt_train, tgt_train),
            ("src_valid", args.src_valid, src_valid),
            ("tgt_valid", args.tgt_valid, tgt_valid),
        )
    }
    meta = {
        "training": dataclasses.asdict(config),
        "source_language": src_lang,
        "target_language": tgt_lang,
        "data": data,
        "train_pairs_used": len(train_examples),
        "parameters": model.num_parameters(),
        "init_from": None
        if args.init_from is None
        else {
            "path": str(args.init_from),
            "sha256": sha256_file(args.init_from / WEIGHTS_FILE),
        },
        "averaged_checkpoints": [p.name for p in paths],
        "valid_after_averaging": final,
        "device": str(device),
    }
    save_model(model, out, meta)
    plot_history(trainer.history, out / PLOT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
