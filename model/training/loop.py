"""The training loop: Adam under the paper's warmup schedule, label-smoothed cross-entropy
(optionally R-Drop), gradient clipping and mixed precision; every log_every updates a metrics
row, every save_every a checkpoint and the resumable state, every valid_every a validation.

An update takes the next processes x accumulate batches of the epoch's shuffled order: each
process (model/training/distributed.py) its own `accumulate` of them, their gradients summed
and divided by the tokens of all of them, so N processes give the update one process gives
with N times the accumulation (tests/model/test_distributed.py). An epoch's last batches that
would not give every process its share are skipped in that epoch (the next one shuffles all
of them again)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer
from tqdm import tqdm

from model.data import Batch, Example, epoch_batches, token_budget_batches
from model.training.checkpoints import (
    CHECKPOINT_DIR,
    STATE_FILE,
    atomic_save_tensors,
    load_optimizer_tensors,
    optimizer_tensors,
)
from model.training.distributed import World, leave
from model.training.history import METRICS_FILE, append_row, rows_through
from model.training.recipe import TrainConfig
from model.training.validation import ValidationSet, validate
from model.transformer import PAD_ID, Transformer


@dataclass
class TrainerState:
    update: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    checkpoints: list[str] = field(default_factory=list)
    batches_per_update: int = 1  # processes x accumulate: a resumed run must keep it


def learning_rate(update: int, config: TrainConfig) -> float:
    """The paper's schedule, parameterised by its peak: linear warmup, then lr * sqrt(warmup/step).

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) is this curve with the peak
    d_model^-0.5 * warmup^-0.5; naming the peak directly makes recipes comparable.
    """
    step = max(update, 1)
    return config.lr * min(step / config.warmup_updates, math.sqrt(config.warmup_updates / step))


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
        world: World | None = None,
        stream: Callable[[int], Iterator[list[Example]]] | None = None,
    ) -> None:
        """`stream(epoch)`, when given, yields an epoch's batches read from the training files
        (model/data.py stream_batches), and `train_examples` is empty: a corpus larger than
        memory."""
        self.model, self.tokenizer, self.config, self.out, self.device = (
            model,
            tokenizer,
            config,
            out,
            device,
        )
        self.train_examples = train_examples
        self.stream = stream
        self.valid = ValidationSet(valid_examples, valid_src, valid_ref, target_language)
        self.batches = token_budget_batches(train_examples, config.max_tokens)
        self.world = world or World(device=device)
        self.per_update = self.world.size * config.accumulate  # batches in one update
        if stream is None and len(self.batches) < self.per_update:
            raise ValueError(
                f"{len(self.batches)} batches of training data, fewer than one update takes "
                f"({self.world.size} processes x accumulate {config.accumulate})"
            )
        # What the training losses run forward through: the model, or with several processes
        # the model under DistributedDataParallel (which sums the processes' gradients).
        self.net: torch.nn.Module = model
        if self.world.size > 1:
            if config.aligned:  # their losses run the model's other methods, not forward
                raise ValueError(
                    "guided alignment and --train-aligner train in one process (no torchrun)"
                )
            self.net = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[device] if device.type == "cuda" else None,
                # An aligner the translation loss does not use gets no gradient.
                find_unused_parameters=model.aligner is not None,
                forward_sync_buffers=False,  # the sinusoids: the same everywhere
            )
        if config.train_aligner:  # the aligner alone learns; the translation stays as it was
            for name, parameter in model.named_parameters():
                parameter.requires_grad_(name.startswith("aligner."))
            model.eval()  # and the frozen layers run as they will serve: no dropout
        self.optimizer = torch.optim.Adam(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.adam_betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.state = TrainerState(batches_per_update=self.per_update)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.ckpt_dir = out / CHECKPOINT_DIR
        self.history: list[dict[str, Any]] = []

    def leave(self) -> None:
        """After the last update: drop DistributedDataParallel, whose reducer holds the process
        group, then leave the group (distributed.leave), which must go while Python is whole."""
        self.net = self.model
        leave(self.world)

    def autocast(self) -> AbstractContextManager[None]:
        if self.config.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.config.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def loss(
        self, batch: Batch, label_smoothing: float, net: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, int]:
        """Summed label-smoothed cross-entropy over non-pad target tokens, and their count;
        through `net` when given (validation: the model itself), else what training runs."""
        with self.autocast():
            logits = (net or self.net)(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
            reduction="sum",
        )
        return loss, batch.n_tgt_tokens

    def epoch(self, epoch: int) -> Iterator[list[Example]]:
        """The batches of an epoch, in order: streamed from the files (`stream`), or the
        in-memory corpus's token-budget batches in their shuffled order."""
        if self.stream is not None:
            return self.stream(epoch)
        return (
            [self.train_examples[i] for i in indices]
            for indices in epoch_batches(self.batches, self.config.seed, epoch)
        )

    def accumulating(self, last: bool) -> AbstractContextManager[None]:
        """Around one batch's backward: the processes' gradients are summed after the last
        batch of an update only (DistributedDataParallel.no_sync before it)."""
        if last or not isinstance(self.net, torch.nn.parallel.DistributedDataParallel):
            return nullcontext()
        return self.net.no_sync()

    def loss_tokens(self, batch: Batch) -> int:
        """The token count `training_loss` will divide by, known before it runs (R-Drop counts
        the doubled batch's)."""
        doubled = self.config.rdrop_alpha > 0 and not self.config.aligned
        return batch.n_tgt_tokens * (2 if doubled else 1)

    def training_loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        """The objective summed over target tokens, and their count.

        With R-Drop, the batch is stacked on itself and run in one pass, so the two copies see
        different dropout masks: the loss is both copies' label-smoothed cross-entropy plus
        alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2 per target token (the paper's L_NLL^1 +
        L_NLL^2 + alpha * L_KL), over the doubled batch's 2N target tokens.
        """
        config = self.config
        if config.train_aligner:  # a batch without links teaches nothing: a zero loss
            links = batch.alignment
            if links is None:
                links = torch.zeros(*batch.tgt_out.shape, batch.src.size(1), device=self.device)
            return self.aligner_loss(batch, links)
        if config.alignment_weight and batch.alignment is not None:
            return self.aligned_loss(batch, batch.alignment)
        if config.rdrop_alpha == 0:
            return self.loss(batch, config.label_smoothing)
        doubled = Batch(*(torch.cat([t, t]) for t in (batch.src, batch.tgt_in, batch.tgt_out)))
        with self.autocast():
            logits = self.net(doubled.src, doubled.tgt_in)  # (2B, T, V)
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

    def aligned_loss(self, batch: Batch, links: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Guided alignment: the label-smoothed cross-entropy plus alignment_weight times the
        cross-entropy of the alignment head's weights against `links` (B, T, S) (Garg et al.,
        2019), summed over target tokens (those without links add nothing)."""
        with self.autocast():
            logits, alignment = self.model.forward_aligned(batch.src, batch.tgt_in)
        cross_entropy = F.cross_entropy(
            logits.float().flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=self.config.label_smoothing,
            reduction="sum",
        )
        return cross_entropy + self.config.alignment_weight * _links_loss(links, alignment), (
            batch.n_tgt_tokens
        )

    def aligner_loss(self, batch: Batch, links: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The aligner's cross-entropy against `links` (B, T, S), its only objective: its row
        t aligns the token position t reads, tgt_in[t], so row t is scored against the links
        of tgt_out[t - 1] (the start token's row has none), summed over linked tokens."""
        src_mask = self.model.source_mask(batch.src)
        with torch.no_grad(), self.autocast():  # nothing below the aligner learns
            memory = self.model.encode(batch.src, src_mask)
        with self.autocast():  # the aligned layer is as far as it goes: no logits
            alignment = self.model.align(batch.tgt_in, memory, src_mask)
        read = torch.zeros_like(links)
        read[:, 1:] = links[:, :-1]
        return _links_loss(read, alignment), batch.n_tgt_tokens

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
        if self.state.batches_per_update != self.per_update:
            raise ValueError(
                f"--resume: the run took {self.state.batches_per_update} batches per update "
                f"(processes x accumulate), this one {self.per_update}: resume it with the "
                "same number of processes and --accumulate"
            )
        scaler_state = json.loads(metadata["grad_scaler"])
        if scaler_state:
            self.scaler.load_state_dict(scaler_state)
        # Rows logged after the saved update (before a crash) are replayed: drop them (the
        # writer does; the other processes keep no history).
        if self.world.main:
            self.history = rows_through(self.out / METRICS_FILE, self.state.update)

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

    # --- validation and metrics ------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        return validate(
            self.model,
            self.tokenizer,
            self.valid,
            # The model itself: rank 0 validates alone, outside the processes' collectives.
            lambda batch: self.loss(batch, label_smoothing=0.0, net=self.model),
            max_tokens=self.config.max_tokens,
            bleu_sentences=self.config.valid_bleu_sentences,
            device=self.device,
        )

    def record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        append_row(self.out / METRICS_FILE, row)

    # --- the loop ------------------------------------------------------------------------------

    def train(self) -> None:
        config, state = self.config, self.state
        self.model.train(not config.train_aligner)  # the aligner alone: no dropout (__init__)
        progress = tqdm(
            total=config.max_updates,
            initial=state.update,
            desc="train",
            dynamic_ncols=True,
            disable=not self.world.main,
        )
        world, per_update = self.world, self.per_update
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        while state.update < config.max_updates:
            batches = itertools.islice(self.epoch(state.epoch), state.batch_in_epoch, None)
            started = state.batch_in_epoch
            while state.update < config.max_updates:
                group = list(itertools.islice(batches, per_update))
                if len(group) < per_update:
                    break
                state.batch_in_epoch += per_update
                # Dropout, resumable; each process its own masks.
                torch.manual_seed(config.seed * 1_000_003 + state.update + 7_919 * world.rank)
                mine = group[world.rank * config.accumulate : (world.rank + 1) * config.accumulate]
                examples = [Batch.from_examples(batch).to(self.device) for batch in mine]
                total = world.sum(sum(self.loss_tokens(batch) for batch in examples))
                lr = learning_rate(state.update + 1, config)
                for param_group in self.optimizer.param_groups:
                    param_group["lr"] = lr
                self.optimizer.zero_grad(set_to_none=True)
                for j, batch in enumerate(examples):
                    # The processes' gradients are summed once, after the last batch.
                    last = j == len(examples) - 1
                    with self.accumulating(last):
                        loss, n_tokens = self.training_loss(batch)
                        # DistributedDataParallel averages over the processes: times their
                        # number, the update's gradient is the sum over all its tokens.
                        scaled = loss / total * world.size
                        self.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
                    window_loss += float(loss.detach())
                    window_tokens += n_tokens
                if config.clip_norm > 0:
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                state.update += 1
                progress.update(1)

                if state.update % config.log_every == 0 or state.update == config.max_updates:
                    elapsed = time.perf_counter() - window_start
                    loss_sum, tokens = world.sum(window_loss), world.sum(window_tokens)
                    row = {
                        "update": state.update,
                        "split": "train",
                        "loss": loss_sum / tokens,
                        "lr": lr,
                        "tokens_per_s": tokens / elapsed,
                        "seconds_per_update": elapsed / (config.log_every or 1),
                        "epoch": state.epoch,
                        "batches_per_update": per_update,  # processes x accumulate
                    }
                    if world.main:
                        self.record(row)
                    progress.set_postfix(
                        loss=f"{row['loss']:.3f}",
                        lr=f"{lr:.2e}",
                        tok_s=f"{row['tokens_per_s']:.0f}",
                    )
                    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
                if world.main and (
                    state.update % config.save_every == 0 or state.update == config.max_updates
                ):
                    self.save_checkpoint()
                if world.main and (
                    state.update % config.valid_every == 0 or state.update == config.max_updates
                ):
                    metrics = self.validate()
                    self.record({"update": state.update, "split": "valid", **metrics})
                    progress.write(
                        f"update {state.update}: valid nll {metrics['nll']:.3f} "
                        f"ppl {metrics['ppl']:.2f} bleu {metrics['bleu']:.2f}"
                    )
                    window_start = time.perf_counter()
            if state.update >= config.max_updates:
                break
            if started == 0 and state.batch_in_epoch == 0:  # a whole epoch, and no update
                raise ValueError(
                    f"an epoch of the training data has fewer batches than one update takes "
                    f"({world.size} processes x accumulate {config.accumulate})"
                )
            state.epoch += 1
            state.batch_in_epoch = 0
        progress.close()


def _links_loss(links: torch.Tensor, alignment: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of alignment rows (B, T, S) against link distributions (B, T, S), summed;
    rows without links add nothing."""
    # Masked source positions have weight ~0 and no link: clamp keeps 0 * log(0) at 0.
    return -(links * alignment.float().clamp(min=1e-9).log()).sum()
