"""Import an M2M100 or NLLB-200 checkpoint from transformers' format into this project's.

    python -m model.import --from DIR --out checkpoints/NAME [--license ID] [--origin URL]
        [--force]

(config.json's model_type "m2m_100" picks this module: NLLB-200 is transformers'
M2M100ForConditionalGeneration with its own tokenizer.)

DIR is what transformers' `save_pretrained` writes for the model and its tokenizer (and what
`huggingface-cli download facebook/nllb-200-distilled-600M --local-dir DIR` fetches):
config.json, model.safetensors (or pytorch_model.bin), optionally generation_config.json and
the model repository's README.md (its license field), and the tokenizer's files:
- M2M100 (M2M100Tokenizer): sentencepiece.bpe.model, vocab.json and tokenizer_config.json. The
  language tokens ("__de__") follow vocab.json's ids, in tokenizer_config.json's order, and
  "madeup" words fill the model's vocabulary; the import writes vocab.json with all of them, so
  that every id has a piece;
- NLLB-200 (NllbTokenizer): tokenizer.json (transformers' own conversion of its SentencePiece
  model, with the language codes "deu_Latn" as special tokens) and tokenizer_config.json.

The model is this project's Transformer with: pre-norm and a final layer norm per stack,
embeddings times sqrt(d_model) (scale_embedding), fairseq's sinusoids (halves, frequencies
10000^(-j / (d/2 - 1))) from position pad + 1 = 2, the checkpoint's activation (ReLU), one
vocabulary tied to the output projection, and its special ids (<s> 0, <pad> 1, </s> 2, the
decoder's start token </s>). Dropout and layerdrop are training settings, ignored.

It is multilingual: the source starts with its language's token, and the decoder is forced to
start with the target's (transformers' forced_bos_token_id): config.json's `source_tokens`
(language -> token) and `decoder_prefixes` (language -> tokens), which the export copies into
the manifest and the service applies per request (several targets in one batch). Languages are
the tokenizer's codes ("de" for M2M100, "deu_Latn" for NLLB).

Anything else (another architecture, a config field or tensor this mapping does not know, an
NLLB tokenizer in its legacy order) exits with status 2 naming it, before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import tempfile
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
    card,
    imported_from,
    integer,
    map_weights,
    read_json,
    read_weights,
    token_text,
    write_checkpoint,
)
from model.transformer import ModelConfig, Transformer
from service.bundle.manifest import (
    BundleError,
    SentencePieceFiles,
    SpecialIds,
    TokenizersFile,
)
from service.bundle.tokenizer import load_tokenizer_files

MODEL_TYPE = "m2m_100"
_SPM, _VOCAB, _TOKENIZERS = "sentencepiece.bpe.model", "vocab.json", "tokenizer.json"
_M2M100_LANGUAGE = re.compile(r"__([a-z]{2,3})__")  # "__de__"
_NLLB_LANGUAGE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # "deu_Latn"
# M2M100Tokenizer's language codes by its `language_codes` setting, in the order of their ids
# after vocab.json (transformers' FAIRSEQ_LANGUAGE_CODES): what a tokenizer_config.json that
# does not list its language tokens means.
_M2M100_CODES = {
    "m2m100": [
        "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy",
        "da", "de", "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu",
        "ha", "he", "hi", "hr", "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka",
        "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr",
        "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd",
        "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr",
        "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo", "zh", "zu",
    ],
    "wmt21": ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"],
}  # fmt: skip

_MAPPED = frozenset({
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function",
    "max_position_embeddings", "scale_embedding", "pad_token_id", "eos_token_id",
    "decoder_start_token_id", "bos_token_id", "architectures", "model_type",
})  # fmt: skip
_REQUIRED = {
    "is_encoder_decoder": True,
    "is_decoder": False,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
    "tie_encoder_decoder": False,
    "pruned_heads": {},
}
# The service forces the requested target's token itself: a checkpoint's own is not used.
_FIELDS = Fields(
    _MAPPED,
    IGNORED | {"forced_bos_token_id"},
    _REQUIRED,
    {key: value for key, value in NEUTRAL.items() if key != "forced_bos_token_id"},
)


@dataclass(frozen=True)
class _Tokenizer:
    files: SentencePieceFiles | TokenizersFile
    copied: list[tuple[Path, str]]  # (source file, name in the checkpoint)
    languages: dict[str, str]  # language code -> its token
    unk_id: int


def import_checkpoint(
    source: Path,
    out: Path,
    *,
    license_id: str | None = None,
    origin: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Import the M2M100 or NLLB checkpoint in `source` into `out`; returns the written
    config.json. Raises UnsupportedCheckpoint (or FileNotFoundError) before writing anything."""
    if out.exists() and not force:
        raise UnsupportedCheckpoint(f"{out} exists; pass --force to replace it")
    config_json = read_json(source / "config.json", required=True)
    generation = read_json(source / "generation_config.json", required=False)
    tokenizer_config = read_json(source / "tokenizer_config.json", required=True)
    staging = Path(tempfile.mkdtemp(prefix="m2m100-import-"))
    try:
        config = _model_config(config_json, generation, source)
        tokenizer = _tokenizer(source, tokenizer_config, config, staging)
        config = dataclasses.replace(config, unk_id=tokenizer.unk_id)
        weights_file, weights = read_weights(source)
        model = Transformer(config)
        model.load_state_dict(map_weights(model, weights, weights_file))
        origin_record = {
            **imported_from(
                source, config_json, weights_file, license_id=license_id, origin=origin
            ),
            "tokenizer_class": tokenizer_config.get("tokenizer_class"),
        }
        meta: dict[str, Any] = {
            "source_language": "mul",
            "target_language": "mul",
            "source_tokens": tokenizer.languages,
            "decoder_prefixes": {code: [token] for code, token in tokenizer.languages.items()},
            "tokenizer": tokenizer.files.model_dump(mode="json"),
            "imported_from": origin_record,
        }
        card = _card(out.name, model, meta)
        write_checkpoint(out, model, meta, tokenizer.copied, card)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"model": config.to_dict(), **meta}


def _model_config(values: dict[str, Any], generation: dict[str, Any], source: Path) -> ModelConfig:
    """The model's config; its unk id is the tokenizer's to say (`_tokenizer`)."""
    path = source / "config.json"
    _FIELDS.check_both(values, generation, source)
    architectures = values.get("architectures") or ["M2M100ForConditionalGeneration"]
    if "M2M100ForConditionalGeneration" not in architectures:
        raise UnsupportedCheckpoint(
            f"{path}: architectures {architectures}, not M2M100ForConditionalGeneration"
        )
    activation = values.get("activation_function", "relu")  # M2M100Config's default
    if activation not in ACTIVATIONS:
        raise UnsupportedCheckpoint(
            f"{path}: activation_function {activation!r} is not supported "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    pad_id = integer({"pad_token_id": 1, **values}, "pad_token_id", path)
    eos_id = integer({"eos_token_id": 2, **values}, "eos_token_id", path)
    try:
        return ModelConfig(
            vocab_size=integer(values, "vocab_size", path),
            d_model=integer(values, "d_model", path),
            d_ff=both(values, "encoder_ffn_dim", "decoder_ffn_dim", path),
            h=both(values, "encoder_attention_heads", "decoder_attention_heads", path),
            n_encoder_layers=integer(values, "encoder_layers", path),
            n_decoder_layers=integer(values, "decoder_layers", path),
            max_positions=integer(values, "max_position_embeddings", path),
            norm="pre",
            activation=ACTIVATIONS[activation],  # type: ignore[arg-type]
            positions="fairseq",
            position_offset=pad_id + 1,
            scale_embedding=bool(values.get("scale_embedding", True)),
            pad_id=pad_id,
            bos_id=integer(
                {"decoder_start_token_id": eos_id, **values}, "decoder_start_token_id", path
            ),
            eos_id=eos_id,
        )
    except ValueError as e:
        raise UnsupportedCheckpoint(f"{path}: {e}") from e


def _tokenizer(
    source: Path, values: dict[str, Any], config: ModelConfig, staging: Path
) -> _Tokenizer:
    """The tokenizer's files, with the language tokens, checked by loading them as the service
    will; the M2M100 vocabulary with every id is written into `staging`."""
    path = source / "tokenizer_config.json"
    if values.get("sp_model_kwargs"):
        raise UnsupportedCheckpoint(f"{path}: sp_model_kwargs {values['sp_model_kwargs']}")
    special_ids = SpecialIds(
        pad=config.pad_id, bos=config.bos_id, eos=config.eos_id, unk=config.unk_id
    )
    tokenizer: _Tokenizer
    if (source / _SPM).is_file() and (source / _VOCAB).is_file():
        tokenizer = _m2m100(source, values, config, staging)
    elif (source / _TOKENIZERS).is_file():
        tokenizer = _nllb(source, values, config)
    else:
        raise FileNotFoundError(
            f"{source} has neither {_SPM} and {_VOCAB} (M2M100) nor {_TOKENIZERS} (NLLB)"
        )
    if not tokenizer.languages:
        raise UnsupportedCheckpoint(f"{source}: the tokenizer has no language tokens")
    special_ids = special_ids.model_copy(update={"unk": tokenizer.unk_id})
    directory = staging if isinstance(tokenizer.files, SentencePieceFiles) else source
    try:
        load_tokenizer_files(
            directory, tokenizer.files, special_ids, (config.vocab_size, config.vocab_size)
        )
    except BundleError as e:
        raise UnsupportedCheckpoint(str(e)) from e
    return tokenizer


def _m2m100(source: Path, values: dict[str, Any], config: ModelConfig, staging: Path) -> _Tokenizer:
    path = source / "tokenizer_config.json"
    vocab = read_json(source / _VOCAB, required=True)
    unk = token_text(values.get("unk_token")) or "<unk>"
    if not isinstance(vocab.get(unk), int):
        raise UnsupportedCheckpoint(f"{source / _VOCAB} has no {unk}")
    # The language tokens: with their ids where the tokenizer saved them, else in the order of
    # its special tokens after vocab.json's ids (M2M100Tokenizer's numbering).
    added = {
        token_text(entry): int(i) for i, entry in (values.get("added_tokens_decoder") or {}).items()
    }
    languages = {t: i for t, i in added.items() if t and _M2M100_LANGUAGE.fullmatch(t)}
    if not languages:
        listed = values.get("additional_special_tokens") or values.get("extra_special_tokens") or []
        tokens = [t for t in map(token_text, listed) if t and _M2M100_LANGUAGE.fullmatch(t)]
        if not tokens:
            setting = values.get("language_codes", "m2m100")
            if setting not in _M2M100_CODES:
                raise UnsupportedCheckpoint(
                    f"{path}: language_codes {setting!r} is not supported (supported: "
                    f"{', '.join(_M2M100_CODES)})"
                )
            tokens = [f"__{code}__" for code in _M2M100_CODES[setting]]
        languages = {t: len(vocab) + i for i, t in enumerate(tokens)}
    full = dict(vocab)
    for token, token_id in languages.items():
        if token_id in full.values() and full.get(token) != token_id:
            raise UnsupportedCheckpoint(f"{path}: {token} has the id {token_id} of another token")
        full[token] = token_id
    taken = set(full.values())
    madeup = [i for i in range(config.vocab_size) if i not in taken]
    for n, token_id in enumerate(madeup):
        full[f"madeupword{n:04d}"] = token_id
    if sorted(full.values()) != list(range(config.vocab_size)):
        raise UnsupportedCheckpoint(
            f"{source}: {len(full)} tokens with ids up to {max(full.values())} do not fill the "
            f"model's vocabulary of {config.vocab_size}"
        )
    (staging / _VOCAB).write_text(json.dumps(full, ensure_ascii=False), encoding="utf-8")
    (staging / _SPM).write_bytes((source / _SPM).read_bytes())
    specials = [
        token_text(values.get(key)) or default
        for key, default in (("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"),
                             ("pad_token", "<pad>"))
    ]  # fmt: skip
    files = SentencePieceFiles(
        source_model=_SPM,
        target_model=_SPM,
        source_vocab=_VOCAB,
        target_vocab=_VOCAB,
        special_tokens=[*specials, *languages, *(f"madeupword{n:04d}" for n in range(len(madeup)))],
        clean_up_spaces=bool(values.get("clean_up_tokenization_spaces", False)),
    )
    return _Tokenizer(
        files,
        [(staging / _SPM, _SPM), (staging / _VOCAB, _VOCAB)],
        {_M2M100_LANGUAGE.fullmatch(t).group(1): t for t in languages},  # type: ignore[union-attr]
        vocab[unk],
    )


def _nllb(source: Path, values: dict[str, Any], config: ModelConfig) -> _Tokenizer:
    path = source / "tokenizer_config.json"
    if values.get("legacy_behaviour"):
        raise UnsupportedCheckpoint(
            f"{path}: legacy_behaviour = True (the language token after </s>) is not supported "
            "(only False)"
        )
    document = read_json(source / _TOKENIZERS, required=True)
    added = {entry["content"]: entry["id"] for entry in document.get("added_tokens", [])}
    languages = {t: t for t in added if _NLLB_LANGUAGE.fullmatch(t)}
    unk = token_text(values.get("unk_token")) or "<unk>"
    vocab = (document.get("model") or {}).get("vocab") or {}
    unk_id = added.get(unk, vocab.get(unk) if isinstance(vocab, dict) else None)
    if not isinstance(unk_id, int):
        raise UnsupportedCheckpoint(f"{source / _TOKENIZERS} has no {unk}")
    files = TokenizersFile(
        file=_TOKENIZERS,
        clean_up_spaces=bool(values.get("clean_up_tokenization_spaces", False)),
    )
    return _Tokenizer(files, [(source / _TOKENIZERS, _TOKENIZERS)], languages, unk_id)


def _card(name: str, model: Transformer, meta: dict[str, Any]) -> str:
    c, origin = model.config, meta["imported_from"]
    languages = ", ".join(sorted(meta["source_tokens"]))
    rows = [
        ("origin", origin["origin"] or "not recorded (pass --origin)"),
        ("imported from", f"`{origin['directory']}`, {origin['weights']} "
                          f"(sha256 {origin['weights_sha256']})"),
        ("license", origin["license"] or "not found in the source's README.md: check the origin"),
        ("languages", f"any to any of {len(meta['source_tokens'])}: {languages}"),
        ("architecture", f"M2M100 transformer: {c.n_encoder_layers} + {c.n_decoder_layers} "
                         f"layers, d_model {c.d_model}, {c.h} heads, d_ff {c.d_ff}, "
                         f"{c.activation}, pre-norm"),
        ("parameters", f"{model.num_parameters():,}"),
        ("tokenizer", f"{origin['tokenizer_class']}, {c.vocab_size:,} tokens"),
        ("special ids", f"pad {c.pad_id}, decoder start {c.bos_id}, eos {c.eos_id}, "
                        f"unk {c.unk_id}"),
        ("max positions", str(c.max_positions)),
        ("transformers version", str(origin["transformers_version"])),
    ]  # fmt: skip
    return card(name, "multilingual", rows, " (NLLB-200 is CC-BY-NC 4.0: not for commercial use)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_origin_arguments(parser)
