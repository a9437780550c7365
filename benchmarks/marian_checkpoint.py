"""A Marian (OPUS-MT-shaped) checkpoint with random weights, in transformers' format, offline.

SentencePiece models are trained on the given text (source and target side), a vocab.json joins
their pieces as OPUS-MT's does (</s> 0, <unk> 1, ..., <pad> last, which is also the decoder's
start token), and a MarianMTModel with random weights is saved next to its MarianTokenizer with
`save_pretrained`, with a generation_config.json like the published models' (bad_words_ids =
[[pad]], forced </s> at the maximum length). Nothing is downloaded. The tests build small ones
(tests/conftest.py); benchmarks/marian_bench.py builds a transformer-base-size one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import sentencepiece
import torch
from transformers import (
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    MarianTokenizer,
    PreTrainedModel,
)

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
LICENSE = "cc-by-4.0"  # what README.md's front matter says, as OPUS-MT model cards do


def train_sentencepiece(lines: Sequence[str], vocab_size: int, path: Path) -> Path:
    """A unigram SentencePiece model with OPUS-MT's normalisation (nmt_nfkc) at `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "spm"
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=str(prefix),
            vocab_size=vocab_size,
            model_type="unigram",
            normalization_rule_name="nmt_nfkc",
            character_coverage=1.0,
            num_threads=1,
            minloglevel=2,
        )
        path.write_bytes(prefix.with_suffix(".model").read_bytes())
    return path


def _pieces(model: Path) -> list[str]:
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def _vocab(pieces: Sequence[str], size: int | None) -> dict[str, int]:
    """</s> 0, <unk> 1, the pieces, filler tokens up to `size`, <pad> last."""
    tokens = list(dict.fromkeys([EOS, UNK, *pieces]))
    if size is not None:
        if size < len(tokens) + 1:
            raise ValueError(f"vocabulary of {size} < {len(tokens) + 1} tokens")
        tokens += [f"<filler_{i}>" for i in range(size - len(tokens) - 1)]
    return {token: i for i, token in enumerate([*tokens, PAD])}


def randomize(model: PreTrainedModel, generator: torch.Generator, *, eos: int, zero: int) -> None:
    """Weights whose translations depend on the source and stop at varied lengths.

    transformers' initialisation (std 0.02) leaves the output to the logits' bias: every source
    gets the same tokens, and no search ever ends. Unit-variance products, small embeddings
    (so the positions matter), a </s> (`eos`) embedding four times longer than the rest and a
    random final_logits_bias (Marian's) give different outputs per source; with some seeds (0
    for the tests' model) some end with </s> after a few tokens and others run to the length
    limit, in greedy and beam search alike. Token `zero` gets a zero embedding (the pad token:
    Marian's also starts the decoder, as Marian starts from a zero vector).
    """

    def normal(shape: torch.Size, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * std

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # the sinusoids (not saved: transformers rebuilds them)
                continue
            if "embed_tokens" in name or name.endswith("shared.weight"):
                parameter.copy_(normal(parameter.shape, 0.05))
                parameter[eos] *= 4.0
                parameter[zero] = 0.0
            elif "layer_norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + normal(parameter.shape, 0.2))
            elif parameter.dim() == 2:
                parameter.copy_(normal(parameter.shape, parameter.shape[1] ** -0.5))
            else:
                parameter.copy_(normal(parameter.shape, 0.1))
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(normal(bias.shape, 0.1))


# An OPUS-MT model's shape (transformer-base): 6 + 6 layers, d_model 512, 8 heads, d_ff 2048, a
# joint vocabulary of 32,000 tokens, 512 positions; 74M parameters with random weights.
BASE = dict(d_model=512, heads=8, d_ff=2048, layers=6, max_positions=512)
BASE_VOCAB_SIZE = 32000
BASE_SPM_VOCAB_SIZE = 6000  # SentencePiece pieces; the vocabulary is padded with filler tokens


def write_base(out: Path, source_lines: Sequence[str], target_lines: Sequence[str]) -> Path:
    """A transformer-base Marian checkpoint with random weights (benchmarks/marian_bench.py,
    benchmarks/gpu/run.sh)."""
    return write_checkpoint(
        out,
        source_lines,
        target_lines,
        spm_vocab_size=BASE_SPM_VOCAB_SIZE,
        vocab_size=BASE_VOCAB_SIZE,
        **BASE,  # type: ignore[arg-type]
    )


def write_checkpoint(
    out: Path,
    source_lines: Sequence[str],
    target_lines: Sequence[str],
    *,
    source_language: str = "en",
    target_language: str = "de",
    target_codes: Sequence[str] = (),
    separate_vocabs: bool = False,
    spm_vocab_size: int = 1000,
    vocab_size: int | None = None,
    d_model: int = 32,
    heads: int = 4,
    d_ff: int = 64,
    layers: int = 2,
    activation: str = "swish",
    max_positions: int = 128,
    seed: int = 0,
) -> Path:
    """Write the checkpoint into `out`. `target_codes` ("de", "fr") makes it multi-target:
    vocab.json gets a >>code<< token per target (MarianTokenizer's language codes)."""
    out.mkdir(parents=True, exist_ok=True)
    source_spm = train_sentencepiece(source_lines, spm_vocab_size, out / "source.spm")
    target_spm = train_sentencepiece(target_lines, spm_vocab_size, out / "target.spm")
    codes = [f">>{code}<<" for code in target_codes]
    target_vocab_file = None
    if separate_vocabs:
        source_vocab = _vocab(_pieces(source_spm), vocab_size)
        target_vocab = _vocab(_pieces(target_spm), vocab_size)
        target_vocab_file = out / "target_vocab.json"
        target_vocab_file.write_text(json.dumps(target_vocab, ensure_ascii=False))
    else:
        source_vocab = target_vocab = _vocab(
            [*codes, *_pieces(source_spm), *_pieces(target_spm)], vocab_size
        )
    (out / "vocab.json").write_text(json.dumps(source_vocab, ensure_ascii=False))
    tokenizer = MarianTokenizer(
        str(source_spm),
        str(target_spm),
        str(out / "vocab.json"),
        target_vocab_file=None if target_vocab_file is None else str(target_vocab_file),
        source_lang=source_language,
        target_lang=target_language,
        separate_vocabs=separate_vocabs,
    )
    pad = source_vocab[PAD]
    config = MarianConfig(
        vocab_size=len(source_vocab),
        decoder_vocab_size=len(target_vocab),
        share_encoder_decoder_embeddings=not separate_vocabs,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function=activation,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
    )
    model = MarianMTModel(config).eval()
    randomize(model, torch.Generator().manual_seed(seed), eos=0, zero=pad)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        decoder_start_token_id=pad,
        eos_token_id=0,
        pad_token_id=pad,
        forced_eos_token_id=0,
        max_length=max_positions,
        num_beams=4,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(f"---\nlicense: {LICENSE}\n---\n\n# random Marian model\n")
    return out
