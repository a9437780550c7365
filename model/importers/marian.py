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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.importers.common import (
    ACTIVATIONS,
    IGNORED,
    NEUTRAL,
    Fields,
    UnsupportedCheckpoint,
    add_origin_arguments,
    both,
    build_parser,
    card,
    imported_from,
    integer,
    map_weights,
    read_json,
    read_weights,
    run,
    token_text,
    write_checkpoint,
)
from model.transformer import ModelConfig, Transformer
from service.bundle.manifest import BundleError, SentencePieceFiles, SpecialIds
from service.bundle.tokenizer import SentencePieceTokenizer

MODEL_TYPE = "marian"

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


@dataclass(frozen=True)
class _Tokenizer:
    files: SentencePieceFiles
    source_language: str | None
    target_language: str | None
    target_tokens: dict[str, str]  # language -> ">>xx<<" token, for multi-target models


_FIELDS = Fields(frozenset(_MAPPED), IGNORED, _REQUIRED, NEUTRAL)


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
    unk = token_text(tokenizer_config.get("unk_token")) or "<unk>"
    unk_id = read_json(source / "vocab.json", required=True).get(unk)
    if not isinstance(unk_id, int):
        raise UnsupportedCheckpoint(f"{source / 'vocab.json'} has no {unk}")
    config = _model_config(config_json, generation, source, unk_id)
    tokenizer = _tokenizer(source, tokenizer_config, config)
    weights_file, weights = read_weights(source)
    model = Transformer(config)
    model.load_state_dict(map_weights(model, weights, weights_file))

    languages = _languages(tokenizer, source_language, target_language)
    origin_record = imported_from(
        source, config_json, weights_file, license_id=license_id, origin=origin
    )
    meta: dict[str, Any] = {
        **languages,
        "tokenizer": tokenizer.files.model_dump(mode="json"),
        "imported_from": origin_record,
    }
    card = _card(out.name, model, meta, tokenizer.files)
    files = [(source / name, name) for name in tokenizer.files.files]
    write_checkpoint(out, model, meta, files, card)
    return {"model": config.to_dict(), **meta}


def _model_config(
    values: dict[str, Any], generation: dict[str, Any], source: Path, unk_id: int
) -> ModelConfig:
    path = source / "config.json"
    _FIELDS.check_both(values, generation, source)
    if values.get("model_type") != "marian":
        raise UnsupportedCheckpoint(f"{path}: model_type {values.get('model_type')!r}, not marian")
    architectures = values.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        raise UnsupportedCheckpoint(f"{path}: architectures {architectures}, not MarianMTModel")

    activation = values.get("activation_function", "gelu")  # MarianConfig's default
    if activation not in ACTIVATIONS:
        raise UnsupportedCheckpoint(
            f"{path}: activation_function {activation!r} is not supported "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    vocab_size = integer(values, "vocab_size", path)
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
    pad_id = integer(values, "pad_token_id", path)
    # transformers starts from the pad token when no start token is given
    start = {"decoder_start_token_id": pad_id, **values}
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=integer(values, "d_model", path),
            d_ff=both(values, "encoder_ffn_dim", "decoder_ffn_dim", path),
            h=both(values, "encoder_attention_heads", "decoder_attention_heads", path),
            n_encoder_layers=integer(values, "encoder_layers", path),
            n_decoder_layers=integer(values, "decoder_layers", path),
            max_positions=integer(values, "max_position_embeddings", path),
            norm="post",
            activation=ACTIVATIONS[activation],  # type: ignore[arg-type]
            positions="halves",
            scale_embedding=bool(values.get("scale_embedding", False)),
            target_vocab_size=None if shared else decoder_vocab,
            output_bias=True,
            pad_id=pad_id,
            bos_id=integer(start, "decoder_start_token_id", path),
            eos_id=integer(values, "eos_token_id", path),
            unk_id=unk_id,
            suppressed_ids=tuple(sorted({words[0] for words in bad_words})),
            renormalize_suppressed=bool(decoding.get("renormalize_logits", False)),
        )
    except ValueError as e:
        raise UnsupportedCheckpoint(f"{path}: {e}") from e


def _tokenizer(source: Path, values: dict[str, Any], config: ModelConfig) -> _Tokenizer:
    """The SentencePiece files, checked by loading them as the service will."""
    path = source / "tokenizer_config.json"
    if values.get("sp_model_kwargs"):
        raise UnsupportedCheckpoint(f"{path}: sp_model_kwargs {values['sp_model_kwargs']}")
    separate = bool(values.get("separate_vocabs", False))
    eos = token_text(values.get("eos_token")) or "</s>"
    unk = token_text(values.get("unk_token")) or "<unk>"
    pad = token_text(values.get("pad_token")) or "<pad>"
    extra = values.get("additional_special_tokens") or values.get("extra_special_tokens") or []
    added = (values.get("added_tokens_decoder") or {}).values()
    special = [
        eos,
        unk,
        pad,
        *map(token_text, extra),
        *(token_text(t) for t in added if t.get("special")),
    ]
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
    return card(name, "Marian", rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source-language", help="default: source_lang of tokenizer_config.json")
    parser.add_argument("--target-language", help="default: target_lang of tokenizer_config.json")
    add_origin_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    """The older command, `python -m model.import_marian`: Marian only, the same flags."""
    parser = build_parser(
        "python -m model.import_marian",
        "Import a Marian (OPUS-MT) checkpoint saved by transformers.",
        [add_arguments],
    )
    return run(import_checkpoint, parser.parse_args(argv))
