"""A checkpoint of model/transformer.py as a CTranslate2 model, for the benchmark only.

    python -m benchmarks.ct2_convert --checkpoint DIR --out CT2_DIR

CTranslate2 ships no converter for this model, so this one fills `ctranslate2.specs` directly.
What has to line up with model/transformer.py:
- norm placement: `pre_norm` follows ModelConfig.norm; pre-norm adds each stack's final
  LayerNorm (encoder_norm / decoder_norm), post-norm has none; LayerNorm epsilon 1e-5 (torch's
  default, CTranslate2's is 1e-6);
- positions: the model's interleaved sin/cos table is given as explicit encodings (CTranslate2's
  built-in sinusoids concatenate the sin and cos halves instead), added after the embedding is
  scaled by sqrt(d_model);
- attention: separate q, k, v Linear layers with bias, fused as CTranslate2 expects: [q; k; v]
  for self-attention, q and [k; v] for cross-attention;
- one shared embedding for source, target and the bias-free output projection;
- the source carries </s> itself (the engine appends it; add_source_eos stays off).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.converters.utils import fuse_linear
from ctranslate2.specs import common_spec, transformer_spec
from torch import nn

from model.tokenizer import SPECIAL_TOKENS, load_tokenizer
from model.transformer import BOS_ID, EOS_ID, UNK_ID, Transformer, load_model

LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, used by every norm of the model


def _linear(spec: Any, layer: nn.Linear) -> None:
    spec.weight = layer.weight.detach().float().numpy()
    if layer.bias is not None:
        spec.bias = layer.bias.detach().float().numpy()


def _fused(spec: Any, layers: list[nn.Linear]) -> None:
    parts = [common_spec.LinearSpec() for _ in layers]
    for part, layer in zip(parts, layers, strict=True):
        _linear(part, layer)
    fuse_linear(spec, parts)


def _norm(spec: Any, norm: nn.Module) -> None:
    spec.gamma = norm.weight.detach().float().numpy()
    spec.beta = norm.bias.detach().float().numpy()


def build_spec(model: Transformer, vocabulary: list[str]) -> transformer_spec.TransformerSpec:
    config = model.config
    pre_norm = config.norm == "pre"
    spec = transformer_spec.TransformerSpec.from_config(
        (config.n_encoder_layers, config.n_decoder_layers),
        config.h,
        pre_norm=pre_norm,
        activation=common_spec.Activation.RELU,
    )
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.unk_token = SPECIAL_TOKENS[UNK_ID]
    spec.config.bos_token = SPECIAL_TOKENS[BOS_ID]
    spec.config.eos_token = SPECIAL_TOKENS[EOS_ID]
    spec.config.decoder_start_token = SPECIAL_TOKENS[BOS_ID]

    embedding = model.embedding.weight.detach().float().numpy()  # (V, d_model), shared
    positions = model.positional_encoding.float().numpy()  # (max_positions, d_model)
    for stack in (spec.encoder, spec.decoder):
        embeddings = stack.embeddings[0] if stack is spec.encoder else stack.embeddings
        embeddings.weight = embedding
        stack.position_encodings.encodings = np.ascontiguousarray(positions)
    if pre_norm:
        _norm(spec.encoder.layer_norm, model.encoder_norm)
        _norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = embedding

    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers, strict=True):
        attn = layer.self_attn
        _fused(layer_spec.self_attention.linear[0], [attn.w_q, attn.w_k, attn.w_v])
        _linear(layer_spec.self_attention.linear[1], attn.w_o)
        _norm(layer_spec.self_attention.layer_norm, layer.sublayer[0].norm)
        _feed_forward(layer_spec.ffn, layer, 1)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers, strict=True):
        attn = layer.self_attn
        _fused(layer_spec.self_attention.linear[0], [attn.w_q, attn.w_k, attn.w_v])
        _linear(layer_spec.self_attention.linear[1], attn.w_o)
        _norm(layer_spec.self_attention.layer_norm, layer.sublayer[0].norm)
        cross = layer.cross_attn
        _linear(layer_spec.attention.linear[0], cross.w_q)
        _fused(layer_spec.attention.linear[1], [cross.w_k, cross.w_v])
        _linear(layer_spec.attention.linear[2], cross.w_o)
        _norm(layer_spec.attention.layer_norm, layer.sublayer[1].norm)
        _feed_forward(layer_spec.ffn, layer, 2)

    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    return spec


def _feed_forward(spec: Any, layer: nn.Module, sublayer: int) -> None:
    _linear(spec.linear_0, layer.feed_forward.w_1)
    _linear(spec.linear_1, layer.feed_forward.w_2)
    _norm(spec.layer_norm, layer.sublayer[sublayer].norm)


class CheckpointConverter(Converter):  # type: ignore[misc]
    """ctranslate2's Converter (validate, optimize, save) over `build_spec`."""

    def __init__(self, checkpoint: str | Path) -> None:
        self.checkpoint = Path(checkpoint)

    def _load(self) -> transformer_spec.TransformerSpec:
        model = load_model(self.checkpoint)
        tokenizer = load_tokenizer(self.checkpoint)
        vocabulary = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
        return build_spec(model, vocabulary)


def convert(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the CTranslate2 model of `checkpoint` to `out` (replaced if present), float32
    weights: the benchmark quantizes at load time with compute_type."""
    return Path(CheckpointConverter(checkpoint).convert(str(out), force=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ct2_convert", description=__doc__)
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    print(convert(args.checkpoint, args.out), f"(ctranslate2 {ctranslate2.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
