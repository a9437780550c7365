"""An M2M100- or NLLB-200-shaped checkpoint with random weights, in transformers' format, offline.

Both families are transformers' M2M100ForConditionalGeneration (config.json's model_type
"m2m_100"); they differ in their tokenizer, and each is written as its published checkpoints
are:
- M2M100: a SentencePiece model (sentencepiece.bpe.model) and a vocab.json in fairseq's order
  (<s> 0, <pad> 1, </s> 2, <unk> 3, then the pieces), the language tokens ("__de__") numbered
  after it, then "madeup" words up to the model's vocabulary (M2M100Tokenizer, language_codes
  "wmt21" unless others are given);
- NLLB-200: a `tokenizers` file (tokenizer.json: BPE over Metaspace, the 202 language codes
  "deu_Latn" as special tokens after the vocabulary, then <mask>), NllbTokenizer's.
The BPE/SentencePiece vocabulary is learnt from the given lines (put every script a test uses in
them), the weights are random (benchmarks/marian_checkpoint.py's `randomize`), and
generation_config.json is the published models' (decoder start </s>, no forced target: the
caller gives forced_bos_token_id). Nothing is downloaded. The tests build small ones
(tests/conftest.py); a benchmark can build an NLLB-600M-sized one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    M2M100Config,
    M2M100ForConditionalGeneration,
    M2M100Tokenizer,
    NllbTokenizer,
)

from benchmarks.marian_checkpoint import randomize, train_sentencepiece

Family = Literal["m2m100", "nllb"]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq's first four ids
PAD, EOS = 1, 2
MADEUP_WORDS = 8  # M2M100Tokenizer's num_madeup_words
NLLB_ADDED = 203  # NllbTokenizer's tokens after its vocabulary: 202 language codes and <mask>
LICENSE = {"m2m100": "mit", "nllb": "cc-by-nc-4.0"}  # what the published model cards say


def _nllb_tokenizer(lines: Sequence[str], vocab_size: int, size: int | None) -> NllbTokenizer:
    """NllbTokenizer over a BPE of `vocab_size` learnt from `lines` (fairseq's four specials
    first), with filler tokens after it to make `size` tokens in all (NLLB-200's 256,206)."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
    bpe.train_from_iterator(lines, trainer)
    state = json.loads(bpe.to_str())["model"]
    if size is not None:  # the language codes and <mask> come after the vocabulary
        vocab = state["vocab"]
        fillers = size - NLLB_ADDED - len(vocab)
        if fillers < 0:
            raise ValueError(f"{size} tokens < the {len(vocab) + NLLB_ADDED} the BPE has")
        vocab.update({f"<filler_{i}>": len(vocab) + i for i in range(fillers)})
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    return NllbTokenizer(vocab=state["vocab"], merges=merges, src_lang="eng_Latn")


def _m2m100_tokenizer(
    lines: Sequence[str], vocab_size: int, out: Path, language_codes: str
) -> M2M100Tokenizer:
    spm = train_sentencepiece(lines, vocab_size, out / "sentencepiece.bpe.model")
    with tempfile.TemporaryDirectory() as tmp:
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(spm))
        pieces = [
            processor.id_to_piece(i)
            for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))
        ]
        vocab = {token: i for i, token in enumerate(dict.fromkeys([*SPECIALS, *pieces]))}
        vocab_file = Path(tmp) / "vocab.json"
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False))
        return M2M100Tokenizer(
            str(vocab_file), str(spm), src_lang="en", language_codes=language_codes
        )


def write_checkpoint(
    out: Path,
    lines: Sequence[str],
    *,
    family: Family = "m2m100",
    language_codes: str = "wmt21",
    tokenizer_vocab_size: int = 1000,
    vocab_size: int | None = None,
    d_model: int = 32,
    heads: int = 4,
    d_ff: int = 64,
    layers: int = 2,
    max_positions: int = 128,
    seed: int = 0,
) -> Path:
    """Write the checkpoint into `out` (module docstring); `language_codes` is
    M2M100Tokenizer's ("wmt21": 8 languages, "m2m100": 100). `vocab_size` (NLLB only): the
    tokenizer's and model's size, filler tokens making up what the BPE did not learn."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer: M2M100Tokenizer | NllbTokenizer
    if family == "nllb":
        tokenizer = _nllb_tokenizer(lines, tokenizer_vocab_size, vocab_size)
        vocab_size = len(tokenizer)
    else:
        if vocab_size is not None:
            raise ValueError("vocab_size is for NLLB-shaped models")
        tokenizer = _m2m100_tokenizer(lines, tokenizer_vocab_size, out, language_codes)
        vocab_size = len(tokenizer.encoder) + len(tokenizer.lang_token_to_id) + MADEUP_WORDS
    config = M2M100Config(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
    )
    model = M2M100ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(seed), eos=EOS, zero=PAD)
    model.generation_config = GenerationConfig(
        bos_token_id=0,
        decoder_start_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        max_length=max_positions,
        num_beams=5,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        f"---\nlicense: {LICENSE[family]}\n---\n\n# random {family} model\n"
    )
    return out
