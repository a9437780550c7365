"""Import a Marian (OPUS-MT) checkpoint from transformers' format into this project's.

    python -m model.import --from DIR --out checkpoints/NAME [--source-language CODE]
        [--target-language CODE] [--license ID] [--origin URL] [--force]

(config.json's model_type "marian" picks this module; the older `python -m model.import_marian`
takes the same flags.)

DIR is what transformers' `save_pretrained` writes for a MarianMTModel and its MarianTokenizer
(and what `huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir DIR` fetches):
config.json, model.safetensors (or pytorch_model.bin), source.spm, target.spm, vocab.json
(target_vocab.json with separate vocabularies), tokenizer_config.json, and optionally
generation_config.json and the model repository's README.md (its license field).

A Marian model is this project's Transformer (post-norm, sinusoidal positions, embeddings times
sqrt(d_model), tied output projection) with these differences, each a ModelConfig field:
- the feed-forward activation (OPUS-MT: swish);
- the sinusoids' layout: all sines, then all cosines (transformers' MarianSinusoidal-
  PositionalEmbedding), not interleaved;
- a bias on the output logits (final_logits_bias);
- special ids from its vocab.json: eos 0, unk 1, and pad = the decoder's start token (the last
  id); the pad token is never generated (the checkpoint's bad_words_ids, with or without its
  renormalize_logits);
- a separate target vocabulary and embedding when share_encoder_decoder_embeddings is false;
- and its own max positions (512) and embedding scale flag.
Anything else (another architecture, a config field or tensor this mapping does not know, a
decoding rule the service does not implement) exits with status 2 naming it, before anything
is written. Weights are read from safetensors without pickle, or from a .bin with
torch.load(weights_only=True).

OUT receives model.safetensors and config.json (as model/transformer.py's save_model writes
them; config.json also names the languages, the tokenizer files and where the model came from),
the tokenizer files, and MODEL_CARD.md. It is written to a temporary directory beside OUT and
moved into place whole.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.importers.common import UnsupportedCheckpoint, build_parser, read_json, run
from model.transformer import ModelConfig, Transformer, save_model
from service.bundle.manifest import (
    CARD_FILE,
    BundleError,
    SentencePieceFiles,
    SpecialIds,
    replace_directory,
    sha256_file,
)
from service.bundle.tokenizer import SentencePieceTokenizer

MODEL_TYPE = "marian"
_SAFETENSORS, _SAFETENSORS_INDEX, _PICKLE = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}

# config.json and generation_config.json fields, by what the import does with them. A field in
# none of these tables is refused: it might change what the model computes.
_MAPPED = {
    "vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers",
    "num_hidden_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
    "decoder_ffn_dim", "activation_function", "max_position_embeddings", "scale_embedding",
    "share_encoder_decoder_embeddings", "pad_token_id", "eos_token_id", "decoder_start_token_id",
    "bad_words_ids", "renormalize_logits", "architectures", "model_type",
}  # fmt: skip
# Fields whose other values describe a model that is not Marian's (several of them are BART
# flags that transformers' MarianMTModel ignores: a checkpoint setting them would not run as
# trained there either).
_REQUIRED = {
    "is_encoder_decoder": True,
    "is_decoder": False,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
    "tie_encoder_decoder": False,
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
    "pruned_heads": {},
}
# Decoding rules the service does not implement: accepted at their neutral value only.
_NEUTRAL = {
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
_IGNORED = {
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
}  # fmt: skip

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
_POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


@dataclass(frozen=True)
class _Tokenizer:
    files: SentencePieceFiles
    source_language: str | None
    target_language: str | None
    target_tokens: dict[str, str]  # language -> ">>xx<<" token, for multi-target models


def import_checkpoint(
    source: Path,
    out: Path,
    *,
    source_language: str | None = None,
    target_language: str | None = None,
    license_id: str | None = None,
    origin: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Import the Marian checkpoint in `source` into `out`; returns the written config.json.
    Raises UnsupportedCheckpoint (or FileNotFoundError) before writing anything."""
    if out.exists() and not force:
        raise UnsupportedCheckpoint(f"{out} exists; pass --force to replace it")
    config_json = read_json(source / "config.json", required=True)
    generation = read_json(source / "generation_config.json", required=False)
    tokenizer_config = read_json(source / "tokenizer_config.json", required=False)
    unk = _token(tokenizer_config.get("unk_token")) or "<unk>"
    unk_id = read_json(source / "vocab.json", required=True).get(unk)
    if not isinstance(unk_id, int):
        raise UnsupportedCheckpoint(f"{source / 'vocab.json'} has no {unk}")
    config = _model_config(config_json, generation, source, unk_id)
    tokenizer = _tokenizer(source, tokenizer_config, config)
    weights_file, weights = _read_weights(source)
    model = Transformer(config)
    model.load_state_dict(_map_weights(model, weights, weights_file))

    languages = _languages(tokenizer, source_language, target_language)
    license_id = license_id or _readme_license(source / "README.md")
    imported_from = {
        "directory": str(source.resolve()),
        "origin": origin or config_json.get("_name_or_path"),
        "license": license_id,
        "weights": weights_file.name,
        "weights_sha256": sha256_file(weights_file),
        "transformers_version": config_json.get("transformers_version"),
    }
    meta: dict[str, Any] = {
        **languages,
        "tokenizer": tokenizer.files.model_dump(mode="json"),
        "imported_from": imported_from,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would stay with the checkpoint
    try:
        save_model(model, tmp, meta)
        for name in tokenizer.files.files:
            shutil.copyfile(source / name, tmp / name)
        card = _card(out.name, model, meta, tokenizer.files)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
        replace_directory(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return {"model": config.to_dict(), **meta}


def _check_fields(values: dict[str, Any], path: Path) -> None:
    for key, value in values.items():
        if key in _MAPPED or key in _IGNORED:
            continue
        if key in _REQUIRED and value == _REQUIRED[key]:
            continue
        if key in _NEUTRAL and value == _NEUTRAL[key]:
            continue
        if key in _REQUIRED or key in _NEUTRAL:
            expected = _REQUIRED.get(key, _NEUTRAL.get(key))
            raise UnsupportedCheckpoint(
                f"{path}: {key} = {value!r} is not supported (only {expected!r})"
            )
        raise UnsupportedCheckpoint(f"{path}: unknown field {key!r}; it cannot be mapped")


def _model_config(
    values: dict[str, Any], generation: dict[str, Any], source: Path, unk_id: int
) -> ModelConfig:
    path = source / "config.json"
    _check_fields(values, path)
    _check_fields(generation, source / "generation_config.json")
    for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
        if key in generation and generation[key] != values.get(key):
            raise UnsupportedCheckpoint(
                f"{source / 'generation_config.json'}: {key} {generation[key]!r} differs from "
                f"config.json's {values.get(key)!r}"
            )
    if values.get("model_type") != "marian":
        raise UnsupportedCheckpoint(f"{path}: model_type {values.get('model_type')!r}, not marian")
    architectures = values.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        raise UnsupportedCheckpoint(f"{path}: architectures {architectures}, not MarianMTModel")

    def pair(encoder_key: str, decoder_key: str) -> int:
        if values.get(encoder_key) != values.get(decoder_key):
            raise UnsupportedCheckpoint(
                f"{path}: {encoder_key} {values.get(encoder_key)} and {decoder_key} "
                f"{values.get(decoder_key)} differ; one value for both stacks is supported"
            )
        return _int(values, encoder_key, path)

    activation = values.get("activation_function", "gelu")  # MarianConfig's default
    if activation not in _ACTIVATIONS:
        raise UnsupportedCheckpoint(
            f"{path}: activation_function {activation!r} is not supported "
            f"(supported: {', '.join(_ACTIVATIONS)})"
        )
    vocab_size = _int(values, "vocab_size", path)
    decoder_vocab = values.get("decoder_vocab_size") or vocab_size
    shared = values.get("share_encoder_decoder_embeddings", True)
    if shared and decoder_vocab != vocab_size:
        raise UnsupportedCheckpoint(
            f"{path}: shared embeddings with vocab_size {vocab_size} but decoder_vocab_size "
            f"{decoder_vocab}"
        )
    layers = values.get("encoder_layers")
    if values.get("num_hidden_layers", layers) != layers:  # transformers' alias of encoder_layers
        raise UnsupportedCheckpoint(f"{path}: num_hidden_layers differs from encoder_layers")
    decoding = {**values, **generation}  # transformers reads generation_config.json first
    bad_words = decoding.get("bad_words_ids") or []
    if not all(isinstance(words, list) and len(words) == 1 for words in bad_words):
        raise UnsupportedCheckpoint(
            f"{path}: bad_words_ids {bad_words} bans sequences of tokens; only single tokens "
            "are supported"
        )
    pad_id = _int(values, "pad_token_id", path)
    # transformers starts from the pad token when no start token is given
    start = {"decoder_start_token_id": pad_id, **values}
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=_int(values, "d_model", path),
            d_ff=pair("encoder_ffn_dim", "decoder_ffn_dim"),
            h=pair("encoder_attention_heads", "decoder_attention_heads"),
            n_encoder_layers=_int(values, "encoder_layers", path),
            n_decoder_layers=_int(values, "decoder_layers", path),
            max_positions=_int(values, "max_position_embeddings", path),
            norm="post",
            activation=_ACTIVATIONS[activation],  # type: ignore[arg-type]
            positions="halves",
            scale_embedding=bool(values.get("scale_embedding", False)),
            target_vocab_size=None if shared else decoder_vocab,
            output_bias=True,
            pad_id=pad_id,
            bos_id=_int(start, "decoder_start_token_id", path),
            eos_id=_int(values, "eos_token_id", path),
            unk_id=unk_id,
            suppressed_ids=tuple(sorted({words[0] for words in bad_words})),
            renormalize_suppressed=bool(decoding.get("renormalize_logits", False)),
        )
    except ValueError as e:
        raise UnsupportedCheckpoint(f"{path}: {e}") from e


def _int(values: dict[str, Any], key: str, path: Path) -> int:
    value = values.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedCheckpoint(f"{path}: {key} must be one integer, got {value!r}")
    return value


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _tokenizer(source: Path, values: dict[str, Any], config: ModelConfig) -> _Tokenizer:
    """The SentencePiece files, checked by loading them as the service will."""
    path = source / "tokenizer_config.json"
    if values.get("sp_model_kwargs"):
        raise UnsupportedCheckpoint(f"{path}: sp_model_kwargs {values['sp_model_kwargs']}")
    separate = bool(values.get("separate_vocabs", False))
    eos = _token(values.get("eos_token")) or "</s>"
    unk = _token(values.get("unk_token")) or "<unk>"
    pad = _token(values.get("pad_token")) or "<pad>"
    extra = values.get("additional_special_tokens") or values.get("extra_special_tokens") or []
    added = (values.get("added_tokens_decoder") or {}).values()
    special = [eos, unk, pad, *map(_token, extra), *(_token(t) for t in added if t.get("special"))]
    for name in ("source.spm", "target.spm", "vocab.json", *(["target_vocab.json"] * separate)):
        if not (source / name).is_file():
            raise FileNotFoundError(f"{source / name} is missing")
    target_vocab_file = "target_vocab.json" if separate else "vocab.json"
    source_vocab = read_json(source / "vocab.json", required=True)
    target_vocab = read_json(source / target_vocab_file, required=True)
    for token, token_id, vocabularies in (
        (eos, config.eos_id, (source_vocab, target_vocab)),
        (pad, config.pad_id, (source_vocab, target_vocab)),
    ):
        if any(vocab.get(token) != token_id for vocab in vocabularies):
            raise UnsupportedCheckpoint(
                f"{source}: config.json gives {token} the id {token_id}, the vocabulary "
                f"{[vocab.get(token) for vocab in vocabularies]}"
            )
    files = SentencePieceFiles(
        source_model="source.spm",
        target_model="target.spm",
        source_vocab="vocab.json",
        target_vocab=target_vocab_file,
        special_tokens=[t for t in dict.fromkeys(special) if t is not None and t in target_vocab],
        clean_up_spaces=bool(values.get("clean_up_tokenization_spaces", False)),
    )
    special_ids = SpecialIds(
        pad=config.pad_id, bos=config.bos_id, eos=config.eos_id, unk=config.unk_id
    )
    try:
        SentencePieceTokenizer(
            source, files, special_ids, (config.vocab_size, config.decoder_vocab_size)
        )
    except BundleError as e:
        raise UnsupportedCheckpoint(str(e)) from e
    # MarianTokenizer's multi-target codes: >>xx<< tokens of a shared vocabulary.
    codes = [] if separate else [t for t in source_vocab if t.startswith(">>") and t.endswith("<<")]
    return _Tokenizer(
        files,
        values.get("source_lang"),
        values.get("target_lang"),
        {code[2:-2]: code for code in codes},
    )


def _languages(tokenizer: _Tokenizer, source: str | None, target: str | None) -> dict[str, Any]:
    source = source or tokenizer.source_language
    target = target or tokenizer.target_language
    if not source:
        raise UnsupportedCheckpoint(
            "tokenizer_config.json names no source_lang: pass --source-language CODE"
        )
    if tokenizer.target_tokens:
        # The service routes each request by its target to the token the source starts with.
        return {
            "source_language": source,
            "target_language": target or "mul",
            "target_tokens": tokenizer.target_tokens,
        }
    if not target:
        raise UnsupportedCheckpoint(
            "tokenizer_config.json names no target_lang: pass --target-language CODE"
        )
    return {"source_language": source, "target_language": target}


def _read_weights(source: Path) -> tuple[Path, dict[str, Tensor]]:
    """(the file the weights came from, name -> float32 tensor), without running pickle code."""
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


def _map_weights(model: Transformer, weights: dict[str, Tensor], path: Path) -> dict[str, Tensor]:
    """transformers' MarianMTModel tensors -> the state dict of `model`, every tensor used once
    and shaped as the config implies."""
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
    bias = weights.pop("final_logits_bias", None)
    mapped["output_bias"] = (
        torch.zeros(config.decoder_vocab_size) if bias is None else bias.reshape(-1)
    )
    for name in _POSITIONS:  # transformers recomputes them; a checkpoint may carry them
        positions = weights.pop(name, None)
        if positions is not None and not torch.allclose(
            positions, model.positional_encoding, rtol=0, atol=1e-6
        ):
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


def _readme_license(path: Path) -> str | None:
    """The `license:` of a model repository's README front matter, if it has one."""
    if not path.is_file():
        return None
    match = re.match(r"---\n(.*?)\n---", path.read_text(encoding="utf-8", errors="replace"), re.S)
    if match is None:
        return None
    found = re.search(r"^license:\s*(\S+)\s*$", match.group(1), re.M)
    return found.group(1).strip("\"'") if found else None


def _card(name: str, model: Transformer, meta: dict[str, Any], files: SentencePieceFiles) -> str:
    c, origin = model.config, meta["imported_from"]
    targets = ", ".join(
        f"{language} (`{token}`)" for language, token in meta.get("target_tokens", {}).items()
    )
    vocabulary = (
        f"joint, {c.vocab_size:,} tokens"
        if c.target_vocab_size is None
        else f"source {c.vocab_size:,} and target {c.target_vocab_size:,} tokens"
    )
    rows = [
        ("origin", origin["origin"] or "not recorded (pass --origin)"),
        ("imported from", f"`{origin['directory']}`, {origin['weights']} "
                          f"(sha256 {origin['weights_sha256']})"),
        ("license", origin["license"] or "not found in the source's README.md: check the origin"),
        ("languages", f"{meta['source_language']} → "
                      + (targets or meta["target_language"])),
        ("architecture", f"Marian transformer: {c.n_encoder_layers} + {c.n_decoder_layers} "
                         f"layers, d_model {c.d_model}, {c.h} heads, d_ff {c.d_ff}, "
                         f"{c.activation}, post-norm"),
        ("parameters", f"{model.num_parameters():,}"),
        ("vocabulary", f"{vocabulary}; SentencePiece `{files.source_model}` / "
                       f"`{files.target_model}`, ids from `{files.source_vocab}`"),
        ("special ids", f"pad and decoder start {c.pad_id}, eos {c.eos_id}, unk {c.unk_id}; "
                        f"never generated: {list(c.suppressed_ids)}"),
        ("max positions", str(c.max_positions)),
        ("transformers version", str(origin["transformers_version"])),
    ]  # fmt: skip
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""# {name}: imported Marian model

Imported with `python -m model.import`. The weights and their terms are the origin's:
check its license before serving or redistributing them. Quality is the origin's too; nothing
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source-language", help="default: source_lang of tokenizer_config.json")
    parser.add_argument("--target-language", help="default: target_lang of tokenizer_config.json")
    parser.add_argument("--license", dest="license_id", help="default: the license in README.md")
    parser.add_argument("--origin", help="where the model came from, e.g. its hub URL")


def main(argv: list[str] | None = None) -> int:
    """The older command, `python -m model.import_marian`: Marian only, the same flags."""
    parser = build_parser(
        "python -m model.import_marian",
        "Import a Marian (OPUS-MT) checkpoint saved by transformers.",
        [add_arguments],
    )
    return run(import_checkpoint, parser.parse_args(argv))
