"""The Transformer encoder-decoder of Vaswani et al. (2017), "Attention Is All You Need".

Written bottom-up in the paper's names: scaled dot-product attention, multi-head attention,
position-wise feed-forward, sinusoidal positional encoding, encoder and decoder layers, and the
model with `encode()`, `decode()` (teacher forcing, for training) and `decode_step()` (one token
per sequence plus a key/value cache, for inference and the ONNX export).

Shapes: B batch, S source length, T target length, H heads, Dh = d_model / H, V vocabulary.
Masks are boolean and broadcastable to (B, H, T_query, T_key); True means "may attend".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The special-token ids of this project's tokenizer (model/tokenizer.py), and the defaults of
# ModelConfig's special ids; an imported model (model/importers/marian.py) sets its own.
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3

NormPlacement = Literal["post", "pre"]
Activation = Literal["relu", "swish", "gelu"]
# Where the sinusoids go: "interleaved" as in the paper (sin on even features, cos on odd ones),
# "halves" with every sine first and every cosine second (tensor2tensor, Marian); "fairseq" as
# halves, with fairseq's frequencies 10000^(-j / (d_model/2 - 1)) (M2M100, NLLB).
PositionLayout = Literal["interleaved", "halves", "fairseq"]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters; saved next to the weights and the only source of truth."""

    vocab_size: int
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_positions: int = 256
    norm: NormPlacement = "post"
    # The residual branches' last weights (attention w_v and w_o, the feed-forward's w_2) start
    # at this multiple of their Xavier initialisation. 0.5 keeps a post-norm encoder from
    # mapping a sentence's tokens onto one vector early in training, after which it does not
    # learn to align (benchmarks/RESULTS.md, issue 16); 1.0 is the plain initialisation.
    branch_init_scale: float = 1.0
    # The fields below default to this project's own models; model/importers/marian.py sets them
    # for Marian (OPUS-MT) checkpoints.
    activation: Activation = "relu"  # of the feed-forward's hidden layer; swish = x * sigmoid(x)
    positions: PositionLayout = "interleaved"
    # The position of a sequence's first token (fairseq's models: padding_idx + 1 = 2).
    position_offset: int = 0
    scale_embedding: bool = True  # embeddings times sqrt(d_model), section 3.4
    # None: one joint vocabulary, one matrix for the source and target embeddings and the output
    # projection. Otherwise the decoder has its own embedding of this many tokens, which the
    # output projection shares.
    target_vocab_size: int | None = None
    output_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID  # the decoder's start token (Marian starts from its pad token)
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    # Target tokens a translation never contains (Marian: the pad token, also its start token):
    # their log-prob is -inf in decode_step, after the log-softmax, as transformers applies a
    # checkpoint's bad_words_ids; with renormalize_suppressed, before it (transformers'
    # renormalize_logits), so that the other tokens' probabilities sum to 1.
    suppressed_ids: tuple[int, ...] = ()
    renormalize_suppressed: bool = False
    # The cross-attention that aligns target tokens to source tokens (markup is re-placed through
    # it: service/text/): a decoder layer, and one of its heads (the one guided alignment trains
    # on an aligner's links, Garg et al. 2019) or None for the mean of its heads. A None layer is
    # the penultimate one (`aligned_layer`).
    alignment_layer: int | None = None
    alignment_head: int | None = None
    # A dedicated alignment query instead (Transformer.aligner): its own projection of the
    # aligned layer's cross-attention input, over that layer's keys (all heads as one d_model
    # product). It feeds nothing else, so training it alone (model/train.py --train-aligner)
    # leaves every translation as it was; its row at each step aligns the token that step
    # reads (the previous step's choice), which knows the word it aligns.
    aligner: bool = False
    # The aligner's hidden ReLU layer, this wide, beside its projection (Aligner); 0: none, the
    # projection alone.
    aligner_hidden: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.h != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by h ({self.h})")
        for name, allowed in (
            ("norm", NormPlacement),
            ("activation", Activation),
            ("positions", PositionLayout),
        ):
            if getattr(self, name) not in get_args(allowed):
                raise ValueError(
                    f"{name} must be one of {get_args(allowed)}, got {getattr(self, name)!r}"
                )
        target_vocab = self.decoder_vocab_size
        for name, limit in (
            ("pad_id", min(self.vocab_size, target_vocab)),
            ("unk_id", self.vocab_size),
            ("bos_id", target_vocab),
            ("eos_id", min(self.vocab_size, target_vocab)),
        ):
            if not 0 <= getattr(self, name) < limit:
                raise ValueError(
                    f"{name} {getattr(self, name)} is outside the vocabulary ({limit} tokens)"
                )
        if not all(0 <= i < target_vocab for i in self.suppressed_ids):
            raise ValueError(f"suppressed_ids {self.suppressed_ids} outside the target vocabulary")
        if self.eos_id in self.suppressed_ids:
            raise ValueError("eos_id cannot be suppressed: no translation could end")
        if self.position_offset < 0:
            raise ValueError(f"position_offset must be at least 0, got {self.position_offset}")
        if self.positions == "fairseq" and (self.d_model % 2 or self.d_model < 4):
            raise ValueError(f"fairseq positions need an even d_model >= 4, got {self.d_model}")
        if not 0 < self.branch_init_scale < math.inf:
            raise ValueError(f"branch_init_scale must be positive, got {self.branch_init_scale}")
        if not 0 <= self.aligned_layer < self.n_decoder_layers:
            raise ValueError(
                f"alignment_layer {self.alignment_layer} is not a decoder layer "
                f"(0..{self.n_decoder_layers - 1})"
            )
        if self.alignment_head is not None and not 0 <= self.alignment_head < self.h:
            raise ValueError(
                f"alignment_head {self.alignment_head} is not a head (0..{self.h - 1})"
            )
        if self.aligner and self.alignment_head is not None:
            raise ValueError("an aligner aligns through its own query: no alignment_head with it")
        if self.aligner_hidden < 0 or (self.aligner_hidden and not self.aligner):
            raise ValueError(
                f"aligner_hidden {self.aligner_hidden}: the width of an aligner's hidden layer "
                "(0 for none; an aligner only)"
            )

    @property
    def aligned_layer(self) -> int:
        """The decoder layer whose cross-attention aligns: alignment_layer, else the penultimate
        (of the shipped model's layers, its heads' mean agrees best with a word aligner)."""
        if self.alignment_layer is not None:
            return self.alignment_layer
        return max(self.n_decoder_layers - 2, 0)

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    @property
    def decoder_vocab_size(self) -> int:
        """Tokens the decoder reads and writes: the target vocabulary, else the joint one."""
        return self.vocab_size if self.target_vocab_size is None else self.target_vocab_size

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        values = dict(values)
        if "suppressed_ids" in values:  # a JSON list; the frozen config holds a tuple
            values["suppressed_ids"] = tuple(values["suppressed_ids"])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]


# Architecture presets; the vocabulary size comes from the trained tokenizer.
PRESETS: dict[str, dict[str, object]] = {
    # Transformer-Tiny as in Wu et al. (2021) for Multi30k.
    "tiny": dict(d_model=128, d_ff=256, h=4, n_encoder_layers=4, n_decoder_layers=4, dropout=0.3),
    # The paper's base model.
    "base": dict(d_model=512, d_ff=2048, h=8, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1),
    # The paper's big model (its English-German dropout).
    "big": dict(d_model=1024, d_ff=4096, h=16, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3),
}


def preset_config(name: str, vocab_size: int, **overrides: object) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return ModelConfig(vocab_size=vocab_size, **{**PRESETS[name], **overrides})  # type: ignore[arg-type]


def sinusoidal_encoding(
    max_positions: int, d_model: int, layout: PositionLayout = "interleaved", offset: int = 0
) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same) for positions
    offset .. offset + max_positions - 1; with layout "halves" the sines fill features
    0 .. d_model/2 - 1 and the cosines the rest, and "fairseq" does so with the frequencies
    10000^(-j / (d_model/2 - 1)), j < d_model/2 (fairseq's and transformers' M2M100)."""
    position = torch.arange(offset, offset + max_positions, dtype=torch.float64).unsqueeze(1)
    if layout == "fairseq":
        half = d_model // 2
        frequencies = torch.exp(
            torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1))
        )
        angles = position * frequencies  # (P, d_model / 2)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = position / div  # (P, ceil(d_model / 2))
    sines, cosines = torch.sin(angles), torch.cos(angles[:, : d_model // 2])
    if layout == "halves":
        return torch.cat([sines, cosines], dim=1).float()  # (P, d_model)
    pe = torch.zeros(max_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = sines
    pe[:, 1::2] = cosines
    return pe.float()  # (P, d_model)


def padding_mask(ids: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """(B, L) token ids -> (B, 1, 1, L) mask, False on padding."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """(1, 1, L, L) mask: position t may attend to positions <= t only."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V; returns the output and the attention weights."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if mask is not None:
        # A finite minimum instead of -inf keeps fully padded query rows free of NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (B, H, Tq, Tk)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights  # (B, H, Tq, Dh)


class MultiHeadAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.h, self.d_k = config.h, config.d_k
        self.w_q = nn.Linear(config.d_model, config.d_model)
        self.w_k = nn.Linear(config.d_model, config.d_model)
        self.w_v = nn.Linear(config.d_model, config.d_model)
        self.w_o = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.attention_dropout)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.d_k).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `x` (B, T, d_model), each (B, H, T, Dh); cacheable."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Attention of queries from `x` (B, Tq, d_model) over precomputed k, v (N, H, Tk, Dh):
        the projected output (B, Tq, d_model) and the weights (N, H, G * Tq, Tk).

        B = N * G: rows n*G .. n*G + G - 1 of x all attend over k[n], v[n] (the G beams of a
        sentence share its cross-attention keys/values), and the mask broadcasts to
        (N, H, G * Tq, Tk). Queries do not interact, so this equals attending row by row over G
        copies of k and v, without the copies, and with one product of G * Tq query rows per
        sentence and head instead of G products of Tq rows. G = 1 is ordinary attention.
        """
        b, t, d_model = x.shape
        q = self.split_heads(self.w_q(x).reshape(k.size(0), -1, d_model))  # (N, H, G*Tq, Dh)
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
        out = out.transpose(1, 2).reshape(b, t, d_model)  # (B, Tq, d_model)
        projected: Tensor = self.w_o(out)
        return projected, weights

    def joint_weights(self, q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
        """Attention weights of already projected queries q (B, Tq, d_model) over all heads'
        keys k (N, H, Tk, Dh) taken as one d_model-wide product: (N, 1, G * Tq, Tk), grouped
        as `attend` groups (B = N * G); mask broadcasts to (N, 1, G * Tq, Tk)."""
        n, heads, length, d_k = k.shape
        keys = k.transpose(1, 2).reshape(n, 1, length, heads * d_k)  # (N, 1, Tk, d_model)
        queries = q.reshape(n, 1, -1, heads * d_k)  # (N, 1, G*Tq, d_model)
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(heads * d_k)
        return scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "swish": F.silu,
    "gelu": F.gelu,  # the exact (erf) one
}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, or with swish / gelu in place of max(0, .)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(config.d_model, config.d_ff)
        self.w_2 = nn.Linear(config.d_ff, config.d_model)
        self.activation = _ACTIVATIONS[config.activation]
        self.dropout = nn.Dropout(config.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.w_2(self.dropout(self.activation(self.w_1(x))))
        return out


class Residual(nn.Module):
    """Add & norm around a sub-layer: post-norm LayerNorm(x + Dropout(f(x))) as in the paper,
    or pre-norm x + Dropout(f(LayerNorm(x)))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def inner(self, x: Tensor) -> Tensor:
        """What the sub-layer sees."""
        if not self.pre_norm:
            return x
        normed: Tensor = self.norm(x)
        return normed

    def outer(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """Combine the residual stream with the sub-layer's output."""
        y: Tensor = x + self.dropout(sublayer_out)
        if self.pre_norm:
            return y
        normed: Tensor = self.norm(y)
        return normed


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config)
        self.sublayer = nn.ModuleList([Residual(config) for _ in range(2)])

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        r = cast(Residual, self.sublayer[0])  # (nn.ModuleList's items are typed as Modules)
        y = r.inner(x)
        k, v = self.self_attn.project_kv(y)
        x = r.outer(x, self.self_attn.attend(y, k, v, src_mask)[0])
        r = cast(Residual, self.sublayer[1])
        return r.outer(x, self.feed_forward(r.inner(x)))


class Aligner(nn.Module):
    """The dedicated alignment query (ModelConfig.aligner) of the aligned layer's cross-attention
    input x: a projection, plus with `hidden` > 0 a ReLU layer's output beside it,
    q = x W_q + max(0, x W_1) W_2. The hidden layer starts at zero, so the aligner starts as
    its projection; it lets the query depend on the word it reads in ways a projection of the
    layer's state cannot (benchmarks/RESULTS.md, issue 29)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(d_model, d_model)
        self.w_1 = nn.Linear(d_model, hidden) if hidden else None
        self.w_2 = nn.Linear(hidden, d_model) if hidden else None

    def forward(self, x: Tensor) -> Tensor:
        q: Tensor = self.w_q(x)
        if self.w_1 is None or self.w_2 is None:
            return q
        out: Tensor = q + self.w_2(F.relu(self.w_1(x)))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config)
        self.sublayer = nn.ModuleList([Residual(config) for _ in range(3)])

    def forward(
        self,
        x: Tensor,
        tgt_mask: Tensor | None,
        cross_k: Tensor,
        cross_v: Tensor,
        src_mask: Tensor,
        past_k: Tensor | None = None,
        past_v: Tensor | None = None,
        aligner: Aligner | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (B, T, d_model) new positions; past_k/v (B, H, T_past, Dh) cached self-attention.

        Returns the layer output, the self-attention keys/values including the new positions,
        and the cross-attention weights (N, H, G * T, S), or with `aligner` the weights of its
        query over the same keys (N, 1, G * T, S) (ModelConfig.aligner).
        """
        r = cast(Residual, self.sublayer[0])  # (nn.ModuleList's items are typed as Modules)
        y = r.inner(x)
        k, v = self.self_attn.project_kv(y)  # (B, H, T, Dh)
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=2)  # (B, H, T_past + T, Dh)
            v = torch.cat([past_v, v], dim=2)
        x = r.outer(x, self.self_attn.attend(y, k, v, tgt_mask)[0])
        r = cast(Residual, self.sublayer[1])
        query = r.inner(x)
        attended, weights = self.cross_attn.attend(query, cross_k, cross_v, src_mask)
        if aligner is not None:
            weights = self.cross_attn.joint_weights(aligner(query), cross_k, src_mask)
        x = r.outer(x, attended)
        r = cast(Residual, self.sublayer[2])
        x = r.outer(x, self.feed_forward(r.inner(x)))
        return x, k, v, weights


@dataclass
class DecoderCache:
    """Per-layer decoder state for incremental decoding.

    self_k/self_v (R, H, T, Dh) hold one row per decoded sequence and grow by one position per
    step; cross_k/cross_v (N, H, S, Dh) hold one row per sentence, computed once from the
    encoder output. R = N * G: a sentence's G rows (its beams, sentence-major) share its cross
    keys/values (see `MultiHeadAttention.attend`).
    """

    self_k: list[Tensor]
    self_v: list[Tensor]
    cross_k: list[Tensor]
    cross_v: list[Tensor]

    @property
    def length(self) -> int:
        return self.self_k[0].size(2)

    def select(self, rows: Tensor, sentences: Tensor) -> DecoderCache:
        """Keep the sentences `sentences` and, for them, the self-attention rows `rows`, which
        must list each kept sentence's new rows together, in the order of `sentences` (a row
        may repeat: beam search's expansion)."""
        return dataclasses.replace(
            self.reorder_self(rows),
            cross_k=[t.index_select(0, sentences) for t in self.cross_k],
            cross_v=[t.index_select(0, sentences) for t in self.cross_v],
        )

    def reorder_self(self, rows: Tensor) -> DecoderCache:
        """Reorder beams by back-pointers: only the self-attention cache moves.

        Valid when `rows` maps each row to a row of the same sentence.
        """
        return DecoderCache(
            [t.index_select(0, rows) for t in self.self_k],
            [t.index_select(0, rows) for t in self.self_v],
            self.cross_k,
            self.cross_v,
        )


class Transformer(nn.Module):
    # Buffers (register_buffer below), declared for the type checker.
    positional_encoding: Tensor  # (max_positions, d_model)
    suppressed: Tensor  # (V,) bool: ids never generated

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # One joint vocabulary: the source and target embeddings and the output projection share
        # a single matrix (the paper's weight tying, section 3.4). With a separate target
        # vocabulary the decoder's embedding and the output projection share theirs.
        self.embedding = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.target_embedding = (
            None
            if config.target_vocab_size is None
            else nn.Embedding(config.target_vocab_size, config.d_model, padding_idx=config.pad_id)
        )
        if config.output_bias:
            self.output_bias = nn.Parameter(torch.zeros(config.decoder_vocab_size))
        else:
            self.register_parameter("output_bias", None)
        self.register_buffer(
            "positional_encoding",
            sinusoidal_encoding(
                config.max_positions, config.d_model, config.positions, config.position_offset
            ),
            persistent=False,
        )
        suppressed = torch.zeros(config.decoder_vocab_size, dtype=torch.bool)  # (V,)
        suppressed[list(config.suppressed_ids)] = True
        self.register_buffer("suppressed", suppressed, persistent=False)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(
            [EncoderLayer(config) for _ in range(config.n_encoder_layers)]
        )
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(config) for _ in range(config.n_decoder_layers)]
        )
        # Pre-norm leaves the residual stream un-normalised: a final norm per stack.
        self.encoder_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.aligner = Aligner(config.d_model, config.aligner_hidden) if config.aligner else None
        self.reset_parameters()

    @property
    def decoder_embedding(self) -> nn.Embedding:
        """The target side's embedding, also the output projection."""
        return self.embedding if self.target_embedding is None else self.target_embedding

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            for layer in [*self.encoder_layers, *self.decoder_layers]:
                attentions = [layer.self_attn, getattr(layer, "cross_attn", None)]
                for attention in filter(None, attentions):
                    attention.w_v.weight.mul_(self.config.branch_init_scale)
                    attention.w_o.weight.mul_(self.config.branch_init_scale)
                layer.feed_forward.w_2.weight.mul_(self.config.branch_init_scale)
        # Embeddings are multiplied by sqrt(d_model), so start them at scale d_model^-0.5.
        for embedding in dict.fromkeys([self.embedding, self.decoder_embedding]):
            nn.init.normal_(embedding.weight, mean=0.0, std=self.config.d_model**-0.5)
            with torch.no_grad():
                embedding.weight[self.config.pad_id].zero_()

    def init_aligner(self) -> None:
        """Start the aligner as the aligned layer's cross-attention query projection, so that
        it first attends as that layer's heads do together (its hidden layer adds nothing
        yet)."""
        if self.aligner is None:
            raise ValueError("the model has no aligner (ModelConfig.aligner)")
        layer = cast(DecoderLayer, self.decoder_layers[self.config.aligned_layer])
        self.aligner.w_q.load_state_dict(layer.cross_attn.w_q.state_dict())
        if self.aligner.w_2 is not None:
            with torch.no_grad():
                self.aligner.w_2.weight.zero_()
                self.aligner.w_2.bias.zero_()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, 1, 1, S) mask, False on padding."""
        return padding_mask(src, self.config.pad_id)

    def embed(self, ids: Tensor, offset: int | Tensor = 0, *, target: bool = False) -> Tensor:
        """(B, L) ids at positions offset..offset+L-1 -> (B, L, d_model), through the source
        embedding or (`target`) the decoder's."""
        length = ids.size(1)
        if isinstance(offset, int) and offset + length > self.config.max_positions:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions "
                f"{self.config.max_positions}"
            )
        pe = self.positional_encoding.narrow(0, offset, length)  # (L, d_model)
        embedding = self.decoder_embedding if target else self.embedding
        x = embedding(ids)  # (B, L, d_model)
        if self.config.scale_embedding:
            x = x * math.sqrt(self.config.d_model)
        out: Tensor = self.embed_dropout(x + pe)
        return out

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_mask (B, 1, 1, S) -> memory (B, S, d_model)."""
        x = self.embed(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        memory: Tensor = self.encoder_norm(x)
        return memory

    def cross_kv(self, memory: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Cross-attention keys and values of every decoder layer, each (B, H, S, Dh)."""
        layers = cast(list[DecoderLayer], list(self.decoder_layers))
        pairs = [layer.cross_attn.project_kv(memory) for layer in layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def output_logits(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., V), through the tied (decoder) embedding matrix."""
        logits = x @ self.decoder_embedding.weight.t()
        return logits if self.output_bias is None else logits + self.output_bias

    def next_token_log_probs(self, logits: Tensor) -> Tensor:
        """(..., V) logits -> log-probs for decoding, the suppressed ids at -inf: set after the
        log-softmax, the others keep their values (transformers' bad_words_ids); set before it
        (renormalize_suppressed), the others share the suppressed ids' probability."""
        logits = logits.float()
        if not self.config.suppressed_ids:
            return logits.log_softmax(dim=-1)
        if self.config.renormalize_suppressed:
            return logits.masked_fill(self.suppressed, -math.inf).log_softmax(dim=-1)
        return logits.log_softmax(dim=-1).masked_fill(self.suppressed, -math.inf)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoder: tgt_in (B, T) -> logits (B, T, V).

        Targets are right-padded, so the causal mask alone keeps every real position off the
        padding (and the start token may be the pad id: Marian's is).
        """
        return self.decode_aligned(tgt_in, memory, src_mask)[0]

    def decode_aligned(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """`decode`'s logits, and the alignment (B, T, S): row t is where position t looks in the
        source (`alignment`), aligning the token it predicts, tgt_out[t], or with an aligner
        the token it reads, tgt_in[t] (ModelConfig.aligner)."""
        x, alignment = self._decode_layers(tgt_in, memory, src_mask, self.config.n_decoder_layers)
        return self.output_logits(self.decoder_norm(x)), alignment

    def align(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """`decode_aligned`'s alignment alone, without the layers above the aligned one and
        the output projection (what training the aligner needs)."""
        return self._decode_layers(tgt_in, memory, src_mask, self.config.aligned_layer + 1)[1]

    def _decode_layers(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, layers: int
    ) -> tuple[Tensor, Tensor]:
        """The first `layers` decoder layers, teacher-forced: their output (B, T, d_model) and
        the alignment (B, T, S) (`decode_aligned`)."""
        tgt_mask = causal_mask(tgt_in.size(1), tgt_in.device)
        stack = cast(list[DecoderLayer], list(self.decoder_layers)[:layers])
        x = self.embed(tgt_in, target=True)
        alignment = memory.new_empty(0)
        for i, layer in enumerate(stack):
            ck, cv = layer.cross_attn.project_kv(memory)
            aligned = i == self.config.aligned_layer
            x, _, _, weights = layer(
                x, tgt_mask, ck, cv, src_mask, aligner=self.aligner if aligned else None
            )
            if aligned:
                alignment = self.alignment(weights)
        return x, alignment

    def alignment(self, weights: Tensor) -> Tensor:
        """The aligned layer's cross-attention weights (N, H, Tq, S) -> its alignment head's,
        or the heads' mean, (N, Tq, S); an aligner's (N, 1, Tq, S) are their own mean."""
        head = self.config.alignment_head
        return weights.mean(dim=1) if head is None else weights[:, head]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        src_mask = self.source_mask(src)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)

    def forward_aligned(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Logits (B, T, V) and alignment (B, T, S), teacher-forced (`decode_aligned`)."""
        src_mask = self.source_mask(src)
        return self.decode_aligned(tgt_in, self.encode(src, src_mask), src_mask)

    def init_cache(self, memory: Tensor) -> DecoderCache:
        """An empty self-attention cache (length 0) and the cross keys/values of `memory`."""
        b = memory.size(0)
        empty = memory.new_zeros(b, self.config.h, 0, self.config.d_k)  # (B, H, 0, Dh)
        n = self.config.n_decoder_layers
        cross_k, cross_v = self.cross_kv(memory)
        return DecoderCache([empty] * n, [empty] * n, cross_k, cross_v)

    def decode_step(
        self, tokens: Tensor, cache: DecoderCache, src_mask: Tensor
    ) -> tuple[Tensor, DecoderCache]:
        """One decoding step: tokens (R,) at position cache.length -> log-probs (R, V).

        Every row is at the same position (all sequences advance together); no target mask is
        needed because the single query may attend to all cached positions. `src_mask`
        (N, 1, 1, S) has one row per sentence, like the cache's cross keys/values.
        """
        x = self.embed(tokens[:, None], offset=cache.length, target=True)  # (B, 1, d_model)
        self_k, self_v = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, k, v, _ = layer(
                x,
                None,
                cache.cross_k[i],
                cache.cross_v[i],
                src_mask,
                cache.self_k[i],
                cache.self_v[i],
            )
            self_k.append(k)
            self_v.append(v)
        logits = self.output_logits(self.decoder_norm(x[:, 0]))  # (B, V)
        return self.next_token_log_probs(logits), DecoderCache(
            self_k, self_v, cache.cross_k, cache.cross_v
        )


# --- Checkpoint files: weights (safetensors, no pickle) + config.json ------------------------

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def save_model(model: Transformer, directory: str | Path, meta: dict[str, object]) -> None:
    """Write model.safetensors and config.json ({"model": config, **meta}), each atomically."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, directory / WEIGHTS_FILE)
    tmp = directory / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps({"model": model.config.to_dict(), **meta}, indent=2) + "\n")
    os.replace(tmp, directory / CONFIG_FILE)


def load_model(checkpoint_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild a model from a checkpoint directory (config.json + model.safetensors)."""
    from safetensors.torch import load_file

    directory = Path(checkpoint_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"checkpoint {directory} has no {name}")
    config = ModelConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text())["model"])
    model = Transformer(config)
    model.load_state_dict(load_file(directory / WEIGHTS_FILE, device=str(device)))
    return model.to(device).eval()
