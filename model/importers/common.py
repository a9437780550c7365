"""What every importer shares: its error, its interface, reading a checkpoint's JSON files and
weights, checking its config's fields, mapping transformers' BART-family tensor names (Marian,
M2M100 and NLLB share them) onto model/transformer.py's, writing the imported checkpoint, and
the command line around it (python -m model.import, and each family's older command)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from model.transformer import Transformer, save_model
from service.bundle.manifest import CARD_FILE, replace_directory, sha256_file

# transformers' activation_function names -> ModelConfig.activation.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
_SAFETENSORS, _SAFETENSORS_INDEX, _PICKLE = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
# transformers' tensor names, per layer, -> model/transformer.py's.
_ATTENTION = {"q_proj": "w_q", "k_proj": "w_k", "v_proj": "w_v", "out_proj": "w_o"}
_ENCODER_LAYER = {
    **{f"self_attn.{theirs}": f"self_attn.{ours}" for theirs, ours in _ATTENTION.items()},
    "self_attn_layer_norm": "sublayer.0.norm",
    "fc1": "feed_forward.w_1",
    "fc2": "feed_forward.w_2",
    "final_layer_norm": "sublayer.1.norm",
}
_DECODER_LAYER = {
    **{f"self_attn.{theirs}": f"self_attn.{ours}" for theirs, ours in _ATTENTION.items()},
    "self_attn_layer_norm": "sublayer.0.norm",
    **{f"encoder_attn.{theirs}": f"cross_attn.{ours}" for theirs, ours in _ATTENTION.items()},
    "encoder_attn_layer_norm": "sublayer.1.norm",
    "fc1": "feed_forward.w_1",
    "fc2": "feed_forward.w_2",
    "final_layer_norm": "sublayer.2.norm",
}
# The stacks' final norms of a pre-norm model (M2M100, NLLB).
_FINAL_NORMS = {
    "encoder_norm": "model.encoder.layer_norm",
    "decoder_norm": "model.decoder.layer_norm",
}
_POSITIONS = (
    "model.encoder.embed_positions.weight",
    "model.decoder.embed_positions.weight",
    "model.encoder.embed_positions.weights",
    "model.decoder.embed_positions.weights",
)


class UnsupportedCheckpoint(ValueError):
    """The checkpoint cannot be imported; the message names the file, field or tensor."""


class Importer(Protocol):
    """One model family: a module with these three names (model/importers/marian.py)."""

    MODEL_TYPE: str  # the model_type of the checkpoint's config.json

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The family's flags, besides --from, --out and --force."""

    def import_checkpoint(self, source: Path, out: Path, *, force: bool = ...) -> dict[str, Any]:
        """Import `source` into `out` (replacing it only with `force`), with the family's
        options as keywords (their argparse dests); returns the written config.json. Raises
        UnsupportedCheckpoint or FileNotFoundError before writing anything."""


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """A JSON object file; {} for a missing optional one."""
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnsupportedCheckpoint(f"{path}: not JSON: {e}") from e
    if not isinstance(value, dict):
        raise UnsupportedCheckpoint(f"{path}: not a JSON object")
    return value


def build_parser(
    prog: str,
    description: str,
    family_arguments: Sequence[Callable[[argparse.ArgumentParser], None]],
) -> argparse.ArgumentParser:
    """--from, --out, the flags of one family (or, for the overview --help, of all: a flag two
    families share is listed once, conflict_handler="resolve"), --force."""
    p = argparse.ArgumentParser(prog=prog, description=description, conflict_handler="resolve")
    p.add_argument("--from", dest="source", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--out", required=True, type=Path, help="checkpoint to write")
    for add_arguments in family_arguments:
        add_arguments(p)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    return p


def run(import_checkpoint: Callable[..., dict[str, Any]], args: argparse.Namespace) -> int:
    """Import as the parsed flags say; print one JSON line, or the error (exit status 2)."""
    options = {k: v for k, v in vars(args).items() if k not in ("source", "out")}
    try:
        written = import_checkpoint(args.source, args.out, **options)
    except (FileNotFoundError, UnsupportedCheckpoint) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"checkpoint": str(args.out), "model": written["model"]}))
    return 0


# Decoding rules the service does not implement: accepted at their neutral value only (every
# family).
NEUTRAL = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
}
# Training, bookkeeping and search settings (the service's own decoding options replace the
# latter: beam size, lengths, length penalty; it never forces </s> at the maximum length).
IGNORED = frozenset({
    "_name_or_path", "_num_labels", "_commit_hash", "_attn_implementation", "_from_model_config",
    "transformers_version", "dropout", "attention_dropout", "activation_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "init_std", "classif_dropout", "classifier_dropout",
    "gradient_checkpointing", "use_cache", "id2label", "label2id", "num_labels", "torch_dtype",
    "dtype", "bos_token_id", "sep_token_id", "return_dict", "output_hidden_states",
    "output_attentions", "output_scores", "return_dict_in_generate", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "problem_type",
    "output_past", "max_length", "max_new_tokens", "min_length", "min_new_tokens", "num_beams",
    "early_stopping", "length_penalty", "num_return_sequences", "do_sample", "temperature",
    "top_k", "top_p", "typical_p", "forced_eos_token_id", "remove_invalid_values", "max_time",
    "extra_pos_embeddings", "unk_token_id",
})  # fmt: skip


@dataclass(frozen=True)
class Fields:
    """A family's config.json and generation_config.json fields, by what the import does with
    them. A field in none of these tables is refused: it might change what the model computes."""

    mapped: frozenset[str]  # read into the model's config
    ignored: frozenset[str]  # training, bookkeeping and search settings
    required: dict[str, Any]  # accepted at this value only: others describe another model
    neutral: dict[str, Any]  # decoding rules the service does not implement, at their no-op

    def check(self, values: dict[str, Any], path: Path) -> None:
        for key, value in values.items():
            if key in self.mapped or key in self.ignored:
                continue
            if key in self.required and value == self.required[key]:
                continue
            if key in self.neutral and value == self.neutral[key]:
                continue
            if key in self.required or key in self.neutral:
                expected = self.required.get(key, self.neutral.get(key))
                raise UnsupportedCheckpoint(
                    f"{path}: {key} = {value!r} is not supported (only {expected!r})"
                )
            raise UnsupportedCheckpoint(f"{path}: unknown field {key!r}; it cannot be mapped")

    def check_both(self, values: dict[str, Any], generation: dict[str, Any], source: Path) -> None:
        """config.json's and generation_config.json's fields, and their special ids agreeing
        (transformers reads generation_config.json's first)."""
        self.check(values, source / "config.json")
        self.check(generation, source / "generation_config.json")
        for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
            if key in generation and generation[key] != values.get(key):
                raise UnsupportedCheckpoint(
                    f"{source / 'generation_config.json'}: {key} {generation[key]!r} differs "
                    f"from config.json's {values.get(key)!r}"
                )


def both(values: dict[str, Any], encoder_key: str, decoder_key: str, path: Path) -> int:
    """One integer for both stacks (their layers' width, heads)."""
    if values.get(encoder_key) != values.get(decoder_key):
        raise UnsupportedCheckpoint(
            f"{path}: {encoder_key} {values.get(encoder_key)} and {decoder_key} "
            f"{values.get(decoder_key)} differ; one value for both stacks is supported"
        )
    return integer(values, encoder_key, path)


def integer(values: dict[str, Any], key: str, path: Path) -> int:
    value = values.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedCheckpoint(f"{path}: {key} must be one integer, got {value!r}")
    return value


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def read_weights(source: Path) -> tuple[Path, dict[str, Tensor]]:
    """(the file the weights came from, name -> float32 tensor), without running pickle code:
    safetensors (one file or shards), or a .bin through torch.load(weights_only=True)."""
    from safetensors.torch import load_file

    if (source / _SAFETENSORS).is_file():
        path = source / _SAFETENSORS
        tensors = load_file(path)
    elif (source / _SAFETENSORS_INDEX).is_file():
        path = source / _SAFETENSORS_INDEX
        shards = sorted(set(read_json(path, required=True).get("weight_map", {}).values()))
        tensors = {}
        for shard in shards:
            tensors.update(load_file(source / shard))
    elif (source / _PICKLE).is_file():
        path = source / _PICKLE
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for a file it refuses
            raise UnsupportedCheckpoint(f"{path}: not readable as plain tensors: {e}") from e
        if not isinstance(tensors, dict) or not all(
            isinstance(t, Tensor) for t in tensors.values()
        ):
            raise UnsupportedCheckpoint(f"{path}: not a dictionary of tensors")
    else:
        raise FileNotFoundError(f"{source} has no {_SAFETENSORS} or {_PICKLE}")
    return path, {k: t.float() if t.is_floating_point() else t for k, t in tensors.items()}


def map_weights(model: Transformer, weights: dict[str, Tensor], path: Path) -> dict[str, Tensor]:
    """transformers' BART-family tensors (MarianMTModel, M2M100ForConditionalGeneration) -> the
    state dict of `model`, every tensor used once and shaped as the config implies: the layers,
    the embeddings (tied copies must be equal), a pre-norm model's final norms, and Marian's
    final_logits_bias; sinusoidal position tables a checkpoint carries must be the model's."""
    config = model.config
    names: dict[str, str] = {}  # ours -> theirs
    for stack, count, table in (
        ("encoder", config.n_encoder_layers, _ENCODER_LAYER),
        ("decoder", config.n_decoder_layers, _DECODER_LAYER),
    ):
        for i in range(count):
            for theirs, ours in table.items():
                for kind in ("weight", "bias"):
                    names[f"{stack}_layers.{i}.{ours}.{kind}"] = (
                        f"model.{stack}.layers.{i}.{theirs}.{kind}"
                    )
    if config.norm == "pre":
        for ours, theirs in _FINAL_NORMS.items():
            for kind in ("weight", "bias"):
                names[f"{ours}.{kind}"] = f"{theirs}.{kind}"
    mapped = {ours: _take(weights, theirs, path) for ours, theirs in names.items()}
    # Tied copies: every one present must hold the same matrix.
    if config.target_vocab_size is None:
        tied = ["model.shared.weight", "model.encoder.embed_tokens.weight"]
        tied += ["model.decoder.embed_tokens.weight", "lm_head.weight"]
        tables = {"embedding.weight": tied}
    else:
        tables = {
            "embedding.weight": ["model.encoder.embed_tokens.weight"],
            "target_embedding.weight": ["model.decoder.embed_tokens.weight", "lm_head.weight"],
        }
    for ours, candidates in tables.items():
        present = [name for name in candidates if name in weights]
        if not present:
            raise UnsupportedCheckpoint(f"{path}: no {' or '.join(candidates)}")
        for name in present[1:]:
            if not torch.equal(weights[name], weights[present[0]]):
                raise UnsupportedCheckpoint(
                    f"{path}: {name} differs from {present[0]}: untied embeddings are not supported"
                )
        mapped[ours] = weights[present[0]]
        for name in present:
            del weights[name]
    if config.output_bias:
        bias = weights.pop("final_logits_bias", None)
        mapped["output_bias"] = (
            torch.zeros(config.decoder_vocab_size) if bias is None else bias.reshape(-1)
        )
    for name in _POSITIONS:  # transformers recomputes them; a checkpoint may carry them
        positions = weights.pop(name, None)
        if positions is None:
            continue
        rows = positions[config.position_offset : config.position_offset + config.max_positions]
        if not torch.allclose(rows, model.positional_encoding, rtol=0, atol=1e-6):
            raise UnsupportedCheckpoint(
                f"{path}: {name} is not the sinusoidal table (learned positions are not supported)"
            )
    if weights:
        raise UnsupportedCheckpoint(f"{path}: tensors the mapping does not know: {sorted(weights)}")
    expected = model.state_dict()
    for ours, tensor in mapped.items():
        if tensor.shape != expected[ours].shape:
            theirs = names.get(ours, ours)
            raise UnsupportedCheckpoint(
                f"{path}: {theirs} has shape {tuple(tensor.shape)}; config.json implies "
                f"{tuple(expected[ours].shape)}"
            )
    return mapped


def _take(weights: dict[str, Tensor], name: str, path: Path) -> Tensor:
    if name not in weights:
        raise UnsupportedCheckpoint(f"{path}: no tensor {name}")
    return weights.pop(name)


def readme_license(path: Path) -> str | None:
    """The `license:` of a model repository's README front matter, if it has one."""
    if not path.is_file():
        return None
    match = re.match(r"---\n(.*?)\n---", path.read_text(encoding="utf-8", errors="replace"), re.S)
    if match is None:
        return None
    found = re.search(r"^license:\s*(\S+)\s*$", match.group(1), re.M)
    return found.group(1).strip("\"'") if found else None


def write_checkpoint(
    out: Path,
    model: Transformer,
    meta: dict[str, Any],
    files: Iterable[tuple[Path, str]],
    card: str,
) -> None:
    """The imported checkpoint: model.safetensors and config.json (save_model, with `meta`),
    `files` (source path, name in the checkpoint) and MODEL_CARD.md, written to a temporary
    directory beside `out` and moved into place whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would stay with the checkpoint
    try:
        save_model(model, tmp, meta)
        for source, name in files:
            shutil.copyfile(source, tmp / name)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
        replace_directory(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed


def card(name: str, family: str, rows: Sequence[tuple[str, str]], terms: str = "") -> str:
    """An imported checkpoint's MODEL_CARD.md: what it is (`rows`), whose terms apply (with
    `terms` added, e.g. a licence's restriction), and how to serve it."""
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""# {name}: imported {family} model

Imported with `python -m model.import`. The weights and their terms are the origin's: check
its license before serving or redistributing them{terms}. Quality is the origin's too; nothing
here was retrained or evaluated.

| | |
|---|---|
{table}

Serve it:

```bash
python -m export --checkpoint checkpoints/{name} --out bundles/{name}
python -m service --bundle bundles/{name}
```
"""


def add_origin_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the weights came from and under which licence, when the folder does not say."""
    parser.add_argument("--license", dest="license_id", help="default: the license in README.md")
    parser.add_argument("--origin", help="where the model came from, e.g. its hub URL")


def imported_from(
    source: Path,
    config_json: dict[str, Any],
    weights_file: Path,
    *,
    license_id: str | None,
    origin: str | None,
) -> dict[str, Any]:
    """config.json's record of where an imported model came from: the folder, the origin
    (--origin, else transformers' _name_or_path), the licence (--license, else the README's),
    the weights file and its sha256, and the transformers version that saved it."""
    return {
        "directory": str(source.resolve()),
        "origin": origin or config_json.get("_name_or_path"),
        "license": license_id or readme_license(source / "README.md"),
        "weights": weights_file.name,
        "weights_sha256": sha256_file(weights_file),
        "transformers_version": config_json.get("transformers_version"),
    }
