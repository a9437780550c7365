"""Train the Transformer on parallel text.

    python -m model.train --src-train F --tgt-train F --src-valid F --tgt-valid F --out DIR
        [--preset tiny|base | --config FILE.json] [--max-updates N] [--max-tokens N]
        [--device cpu|cuda] [--seed S] [--resume] [--average-last K] [--init-from MODEL_DIR]
        [--alignments LINKS --alignment-weight W [--alignment-layer L] [--alignment-head H]]
        [--alignments LINKS --train-aligner [--alignment-layer L]] [--accumulate K]
    torchrun --nproc_per_node N -m model.train ...   (N processes: gloo on CPU, NCCL on CUDA)

DIR receives model.safetensors (the average of the last K checkpoints), config.json (model
config, training recipe, data files with their sha256), tokenizer.json, metrics.jsonl and
training_curve.png; DIR/checkpoints/ holds the periodic checkpoints and the resumable state.
--init-from starts from a trained model directory (its weights, architecture and tokenizer) to
continue or fine-tune it under this run's recipe. --alignments (python -m model.alignment) with
--alignment-weight trains one cross-attention head on a word aligner's links (guided alignment),
the head whose weights the service re-places markup through; --train-aligner instead trains a
dedicated alignment query alone on them, every other weight frozen (the model translates as
before). Under torchrun each process takes its own --accumulate batches of every update
(model/training/distributed.py), and rank 0 writes. Every input is checked before anything is
written.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from model.alignment import parse_links
from model.data import (
    DataError,
    Example,
    encode_pairs,
    language_of,
    read_lines,
    read_parallel,
    stream_batches,
    stream_pairs,
)
from model.tokenizer import TOKENIZER_FILE, load_tokenizer, train_tokenizer
from model.training.checkpoints import CHECKPOINT_DIR, STATE_FILE, average_checkpoints
from model.training.distributed import join
from model.training.history import PLOT_FILE, plot_history
from model.training.loop import Trainer
from model.training.recipe import TrainConfig, build_configs
from model.transformer import PRESETS, WEIGHTS_FILE, ModelConfig, Transformer, save_model
from service.bundle.manifest import sha256_file

log = logging.getLogger("model.train")

# A streamed corpus's BPE is trained on its first pairs, this many (both sides).
TOKENIZER_SAMPLE = 1_000_000


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
    p.add_argument(
        "--stream-buffer",
        type=int,
        help="stream the training files, this many pairs shuffled at a time (0: read them whole)",
    )
    p.add_argument(
        "--accumulate",
        type=int,
        help="batches per update in each process (gradient accumulation; default 1)",
    )
    p.add_argument(
        "--alignments",
        help="word links of the training pairs, one line per pair (python -m model.alignment)",
    )
    p.add_argument("--alignment-weight", type=float, help="guided alignment's loss weight (0: off)")
    p.add_argument("--alignment-layer", type=int, help="the decoder layer guided alignment trains")
    p.add_argument("--alignment-head", type=int, help="the head of that layer it trains")
    p.add_argument(
        "--train-aligner",
        action="store_const",
        const=True,
        help="train a dedicated alignment query alone on --alignments, all else frozen",
    )
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
    if config.stream_buffer:  # a corpus too large to hold: its line counts checked here
        train_lines = sum(1 for _ in stream_pairs(args.src_train, args.tgt_train))
        if not train_lines:
            raise DataError(f"empty corpus: {args.src_train} and {args.tgt_train} have no lines")
        src_train: list[str] = []
        tgt_train: list[str] = []
    else:
        src_train, tgt_train = read_parallel(args.src_train, args.tgt_train)
        train_lines = len(src_train)
    src_valid, tgt_valid = read_parallel(args.src_valid, args.tgt_valid)
    if config.train_aligner and args.init_from is None and not args.resume:
        raise DataError("--train-aligner trains the aligner of a trained model: give --init-from")
    if config.aligned != (args.alignments is not None):
        raise DataError(
            "--alignments goes with guided alignment (--alignment-weight > 0) "
            "or --train-aligner, and they with it"
        )
    alignments = None
    if args.alignments is not None:
        alignments = [parse_links(line) for line in read_lines(args.alignments)]
    state_file = out / CHECKPOINT_DIR / STATE_FILE
    if args.resume and not state_file.is_file():
        raise DataError(f"--resume: no training state at {state_file}")
    if not args.resume and out.exists() and any(out.iterdir()):
        raise DataError(f"{out} is not empty; pass --resume to continue or choose another --out")
    src_lang = args.src_lang or language_of(args.src_train)
    tgt_lang = args.tgt_lang or language_of(args.tgt_train)
    # Under torchrun: this rank's place, once every rank has checked the above (rank 0 alone
    # writes, from here on).
    world, device = join(device)
    world.barrier()

    # 2. Tokenizer: trained once on both sides of the training text (by rank 0; the others
    # read it), reused on resume; a run started from a trained model keeps that model's.
    if args.resume:
        tokenizer = load_tokenizer(out / TOKENIZER_FILE)
    elif args.init_from is not None:
        tokenizer = load_tokenizer(args.init_from / TOKENIZER_FILE)
    elif world.main:
        log.info("training a joint BPE of %d tokens", config.vocab_size)
        texts: Iterable[str] = src_train + tgt_train
        if config.stream_buffer:  # on the corpus's first pairs, both sides
            sample = itertools.islice(
                stream_pairs(args.src_train, args.tgt_train), TOKENIZER_SAMPLE
            )
            texts = itertools.chain.from_iterable(sample)
        tokenizer = train_tokenizer(texts, config.vocab_size)
        if world.size > 1:  # for the other ranks to read
            out.mkdir(parents=True, exist_ok=True)
            tokenizer.save(str(out / TOKENIZER_FILE))
    world.barrier()
    if not world.main and not args.resume and args.init_from is None:
        tokenizer = load_tokenizer(out / TOKENIZER_FILE)
    train_examples = encode_pairs(tokenizer, src_train, tgt_train, config.max_len, alignments)
    valid_examples = encode_pairs(tokenizer, src_valid, tgt_valid, config.max_len)
    if not train_examples and not config.stream_buffer:
        raise DataError(f"no usable training pairs in {args.src_train} / {args.tgt_train}")
    if not valid_examples:
        raise DataError(f"no usable validation pairs in {args.src_valid} / {args.tgt_valid}")
    model_config = ModelConfig(vocab_size=tokenizer.get_vocab_size(), **model_fields)
    if config.max_len > model_config.max_positions:
        raise DataError(f"max_len {config.max_len} > max_positions {model_config.max_positions}")

    torch.manual_seed(config.seed)
    model = Transformer(model_config)
    if args.init_from is not None and not args.resume:  # on resume the saved state has them
        weights = load_file(str(args.init_from / WEIGHTS_FILE))
        new_aligner = config.train_aligner and not any(k.startswith("aligner.") for k in weights)
        try:
            # A model trained without an aligner gets one, started from its aligned layer.
            missing, unexpected = model.load_state_dict(weights, strict=not new_aligner)
        except RuntimeError as e:
            raise DataError(f"--init-from: {args.init_from} does not match its config: {e}") from e
        if unexpected or any(not k.startswith("aligner.") for k in missing):
            raise DataError(
                f"--init-from: {args.init_from} does not match its config: "
                f"missing {missing}, unexpected {unexpected}"
            )
        if new_aligner:
            model.init_aligner()
    model = model.to(device)
    log.info(
        "%s -> %s: %s / %d valid pairs, %d parameters, %s on %s",
        src_lang,
        tgt_lang,
        f"{train_lines} train lines streamed"
        if config.stream_buffer
        else f"{len(train_examples)} train",
        len(valid_examples),
        model.num_parameters(),
        config.precision,
        device,
    )

    # 3. Train.
    if world.main:
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
        world,
        None
        if not config.stream_buffer
        else partial(_stream, args.src_train, args.tgt_train, tokenizer, config),
    )
    if args.resume:
        trainer.load_state()
        log.info("resumed at update %d", trainer.state.update)
    if trainer.state.update < config.max_updates:
        trainer.train()
    trainer.leave()
    if not world.main:
        return 0

    # 4. Final model: the average of the last K checkpoints.
    paths = [out / CHECKPOINT_DIR / name for name in trainer.state.checkpoints]
    paths = paths[-max(config.average_last, 1) :]
    model.load_state_dict(average_checkpoints(paths))
    final = trainer.validate()
    trainer.record({"update": trainer.state.update, "split": "valid_averaged", **final})
    log.info("averaged %d checkpoints: valid %s", len(paths), final)
    files: list[tuple[str, str, int]] = [
        ("src_train", args.src_train, train_lines),
        ("tgt_train", args.tgt_train, train_lines),
        ("src_valid", args.src_valid, len(src_valid)),
        ("tgt_valid", args.tgt_valid, len(tgt_valid)),
    ]
    if alignments is not None:
        files.append(("alignments", args.alignments, len(alignments)))
    data = {
        name: {"path": str(path), "sha256": sha256_file(Path(path)), "lines": lines}
        for name, path, lines in files
    }
    meta = {
        "training": dataclasses.asdict(config),
        "source_language": src_lang,
        "target_language": tgt_lang,
        "data": data,
        # Streamed: not counted (the batches were never all in memory).
        "train_pairs_used": None if config.stream_buffer else len(train_examples),
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


def _stream(
    src: str, tgt: str, tokenizer: Tokenizer, config: TrainConfig, epoch: int
) -> Iterator[list[Example]]:
    """An epoch's batches streamed from the training files (TrainConfig.stream_buffer)."""
    return stream_batches(
        stream_pairs(src, tgt), tokenizer, config.max_len, config.max_tokens,
        config.stream_buffer, config.seed, epoch,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
