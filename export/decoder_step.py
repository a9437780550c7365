"""The decoder-step graph, built node by node from a model's weights (bundle format 7).

The encoder is traced from the torch model (export/onnx_export.py): it runs once per batch and
its graph shape matters little. The decoder step runs once per generated token, so its graph is
written out here, for the few fused kernels ONNX Runtime has for exactly this work:

- com.microsoft.MultiHeadAttention for self-attention over a static cache: the new key/value is
  written at position T of a (R, H, C, Dh) buffer that is both the past input and the present
  output (in place when both are bound to one buffer), and `cache_indirection` tells each beam
  which beam's row holds each earlier position, so beam search never copies the cache
  (FasterTransformer's scheme; on CUDA, the decoder-masked attention kernel);
- com.microsoft.MultiHeadAttention for cross-attention, with a sentence's G beams as the G
  queries of one attention over its one copy of the encoder keys/values;
- com.microsoft.SkipLayerNormalization for every add & norm (residual, sub-layer bias and layer
  norm in one kernel; with pre-norm it also returns the residual sum the next sub-layer adds to);
- one token per row and a residual stream kept as (R, d_model), so every reshape has a constant
  shape except the one into (N, G, d_model) for cross-attention, computed once per step;
- on the CPU's graph ("indirection" cache), the alignment's nodes inside an If on the input
  `alignment_wanted`: a step for plain text skips them (a step of the shipped model 1.06-1.09x
  faster). The CUDA graph computes them inline (a control-flow node ends CUDA graph
  capture).

The torch model (model/transformer.py) stays the reference: export/parity.py holds this graph to
its log-probs and tokens, and the shipped checkpoint's graph is checked against it in the tests.
Every tensor name comes from service/bundle/manifest.py.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from model.transformer import Aligner, DecoderLayer, Transformer
from service.bundle.manifest import (
    ALIGNMENT,
    ALIGNMENT_WANTED,
    ATTENDED_AXIS,
    BEAM_AXIS,
    BEAM_ROWS,
    CACHE_INDIRECTION,
    CAPACITY_AXIS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOG_PROBS,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    ROW_AXIS,
    SELF_ATTENTION_MASK,
    SENTENCE_AXIS,
    SHORTLIST,
    SHORTLIST_AXIS,
    SHORTLIST_MASK,
    SOURCE_AXIS,
    TOP_IDS,
    TOP_K,
    TOP_K_AXIS,
    TOP_LOG_PROBS,
    DecoderCache,
    cross_key,
    cross_value,
    decoder_step_io,
    past_key,
    past_value,
    present_key,
    present_value,
)

MS_DOMAIN = "com.microsoft"
OPSET = 17  # the lowest this graph needs (LayerNormalization as one node)
GATHER_OPSET = 24  # TensorScatter
IR_VERSION = 8

_FLOAT_TYPES: dict[str, tuple[type[np.floating[Any]], int]] = {
    "fp32": (np.float32, TensorProto.FLOAT),
    "fp16": (np.float16, TensorProto.FLOAT16),
}


class _Graph:
    """Nodes and initializers in the order they are added; names are unique by construction."""

    def __init__(self, float_type: type[np.floating[Any]]) -> None:
        self.float_type = float_type
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def weight(self, name: str, tensor: torch.Tensor) -> str:
        """A float initializer in the graph's float type."""
        array = tensor.detach().to(torch.float32).cpu().numpy().astype(self.float_type)
        return self.constant(name, array)

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def matmul(self, x: str, name: str, weight: torch.Tensor) -> str:
        """x @ weight, for a torch Linear's (out, in) weight."""
        (out,) = self.op("MatMul", [x, self.weight(name, weight.t())])
        return out

    def linear(self, x: str, name: str, linear: nn.Linear) -> str:
        """A torch Linear: x @ W^T + b (ONNX Runtime fuses the two nodes)."""
        (out,) = self.op(
            "Add",
            [
                self.matmul(x, f"{name}.weight", linear.weight),
                self.weight(f"{name}.bias", linear.bias),
            ],
        )
        return out

    @contextlib.contextmanager
    def when(self, condition: str, output: str) -> Iterator[str]:
        """`output` computed only when the bool input `condition` is true: the nodes added
        within go into an If's then-branch, which writes the name yielded (their initializers
        stay in the graph, which a branch reads from its outer scope); else `output` is an
        empty (0, 0) float32 tensor."""
        outer, self.nodes = self.nodes, []
        written = f"{output}.when"
        try:
            yield written
            then_nodes = self.nodes
        finally:
            self.nodes = outer
        empty = f"{output}.otherwise"
        branches = {
            "then_branch": helper.make_graph(
                then_nodes,
                f"{output}_then",
                [],
                [helper.make_tensor_value_info(written, TensorProto.FLOAT, None)],
            ),
            "else_branch": helper.make_graph(
                [
                    helper.make_node(
                        "Constant",
                        [],
                        [empty],
                        value=helper.make_tensor(empty, TensorProto.FLOAT, [0, 0], []),
                    )
                ],
                f"{output}_else",
                [],
                [helper.make_tensor_value_info(empty, TensorProto.FLOAT, None)],
            ),
        }
        self.op("If", [condition], [output], **branches)

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: int | Sequence[str] = 1,
        *,
        domain: str = "",
        **attributes: Any,
    ) -> list[str]:
        self._count += 1
        name = f"{op_type}_{self._count}"
        names = [f"{name}.{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(
            helper.make_node(op_type, list(inputs), list(names), name, domain=domain, **attributes)
        )
        return list(names)


def build_decoder_step(
    model: Transformer,
    dtype: str = "fp32",
    *,
    cache: DecoderCache = "indirection",
    opset: int = OPSET,
    shortlist: bool = False,
) -> onnx.ModelProto:
    """The decoder-step graph of `model` in `dtype` ("fp32" or "fp16"; int8 is quantized from fp32
    by export/quantize.py) with this `cache` (service/bundle/manifest.py). In fp16 the weights, the
    activations, the cache and the cross keys/values are float16; the logits are cast to float32
    before LogSoftmax and TopK, so the scores a beam sums keep their precision. The gather cache
    needs opset 24 (TensorScatter): it is built at max(opset, 24). With `shortlist` the output
    projection covers the `shortlist` input's ids only (`_shortlisted`). Not checked here: onnx's
    checker takes a graph over 2 GB from its file only (export/onnx_export.py checks it there)."""
    if opset < OPSET:
        raise ValueError(f"the decoder step needs opset {OPSET} or later, got {opset}")
    if cache == "gather":
        opset = max(opset, GATHER_OPSET)
    if dtype not in _FLOAT_TYPES:
        raise ValueError(f"no decoder step in {dtype!r}; choose one of {sorted(_FLOAT_TYPES)}")
    float_type, onnx_float = _FLOAT_TYPES[dtype]
    config = model.config
    d_model, heads = config.d_model, config.h
    g = _Graph(float_type)

    # Embedding: (N, G) ids -> (R, d_model); the output projection reads the same matrix
    # (weight tying): the joint embedding, or the decoder's own with a separate target
    # vocabulary. On the CPU the ids gather rows of it as (V, d_model), and the projection
    # multiplies by a (d_model, V) copy, which ONNX Runtime repacks for its MatMul kernel and
    # then drops: with the weights in external data, which ONNX Runtime maps into memory, the
    # rows no sentence reads stay on disk (an NLLB-200 model's 256,206 x 1,024, 1 GB in fp32,
    # held once instead of twice). A shortlist's graph (on any device) has only the (V, d_model)
    # weight: its projection gathers the rows of its ids at every step. The gather cache's
    # graph without one (CUDA's, where nothing is repacked) stores the matrix once, as
    # (d_model, V), and gathers the ids along its axis 1.
    by_rows = shortlist or cache == "indirection"
    if by_rows:
        embedding = g.weight("embedding", model.decoder_embedding.weight)  # (V, d_model)
    if not shortlist:
        embedding_t = g.weight("embedding_t", model.decoder_embedding.weight.t())  # (d_model, V)
    rows_by_model = g.constant("shape.rows_d_model", np.array([-1, d_model], np.int64))
    rows_one_qkv = g.constant("shape.rows_1_qkv", np.array([-1, 1, 3 * d_model], np.int64))
    split_qkv = g.constant("split.qkv", np.array([d_model] * 3, np.int64))
    # (N, G, d_model), for cross-attention: the one shape computed at run time, once per step.
    d_model_vector = g.constant("shape.d_model", np.array([d_model], np.int64))
    (sentences_beams,) = g.op("Shape", [INPUT_IDS])
    (grouped_shape,) = g.op("Concat", [sentences_beams, d_model_vector], axis=0)

    if by_rows:
        (x,) = g.op("Gather", [embedding, INPUT_IDS])  # (N, G, d_model)
    else:
        (x,) = g.op("Gather", [embedding_t, INPUT_IDS], axis=1)  # (d_model, N, G)
        (x,) = g.op("Transpose", [x], perm=[1, 2, 0])  # (N, G, d_model)
    if config.scale_embedding:
        scale = g.constant("embedding_scale", np.array(math.sqrt(d_model), float_type))
        (x,) = g.op("Mul", [x, scale])
    (x,) = g.op("Reshape", [x, rows_by_model])  # (R, d_model)
    encoding = g.weight("positional_encoding", model.get_buffer("positional_encoding"))
    (position,) = g.op("Gather", [encoding, POSITION])  # (R, d_model)
    (x,) = g.op("Add", [x, position])

    if cache == "gather":
        cache_mask = _cache_mask(g, config.max_positions)
        d_head = d_model // heads
        # (R, 1, d_model) -> (R, H, 1, Dh) in one Reshape: with one position, the head-major
        # order is the order the projection wrote (no Transpose, a kernel less on CUDA).
        by_heads = g.constant("shape.rows_h_1_dh", np.array([-1, heads, 1, d_head], np.int64))

    # Every add & norm in order; with pre-norm, the stack's final norm comes last.
    pre_norm = config.norm == "pre"
    layers = _decoder_layers(model)
    norms = [
        _layer_norm(g, f"decoder.{i}.norm.{s}", layer.sublayer[s].norm)
        for i, layer in enumerate(layers)
        for s in range(3)
    ]
    if pre_norm:
        if not isinstance(model.decoder_norm, nn.LayerNorm):
            raise TypeError("a pre-norm model must end its decoder with a LayerNorm")
        norms.append(_layer_norm(g, "decoder.norm", model.decoder_norm))
        gamma, beta, epsilon = norms[0]
        (inner,) = g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=epsilon)
    else:
        inner = x  # what the sub-layer reads: the stream itself, or its pre-norm

    def add_and_norm(sublayer_out: str, bias: str, index: int) -> None:
        """residual + sub-layer + bias, normalised: post-norm by this sub-layer's norm (the
        stream is the normalised sum), pre-norm by the next one's (the stream is the sum)."""
        nonlocal x, inner
        if pre_norm:
            gamma, beta, epsilon = norms[index + 1]
            outputs = g.op(
                "SkipLayerNormalization",
                [sublayer_out, x, gamma, beta, bias],
                4,
                domain=MS_DOMAIN,
                epsilon=epsilon,
            )
            inner, x = outputs[0], outputs[3]
        else:
            gamma, beta, epsilon = norms[index]
            (x,) = g.op(
                "SkipLayerNormalization",
                [sublayer_out, x, gamma, beta, bias],
                domain=MS_DOMAIN,
                epsilon=epsilon,
            )
            inner = x

    for i, layer in enumerate(layers):
        prefix = f"decoder.{i}"
        attn, cross, ff = layer.self_attn, layer.cross_attn, layer.feed_forward
        # Self-attention over the static cache, written in place at position T.
        w_qkv = torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]).t()  # (d, 3d)
        b_qkv = torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias])  # (3d,)
        (qkv,) = g.op("MatMul", [inner, g.weight(f"{prefix}.self.qkv.weight", w_qkv)])
        bias = g.weight(f"{prefix}.self.qkv.bias", b_qkv)
        if cache == "gather":  # the indirection's attention kernel adds the bias itself
            (qkv,) = g.op("Add", [qkv, bias])
        (qkv,) = g.op("Reshape", [qkv, rows_one_qkv])  # (R, 1, 3 d_model)
        q, k, v = g.op("Split", [qkv, split_qkv], 3, axis=2)  # each (R, 1, d_model)
        if cache == "indirection":
            attended = _attend_through_indirection(g, i, q, k, v, bias, heads)
        else:
            attended = _attend_over_gathered(g, i, q, k, v, cache_mask, by_heads, heads)
        (attended,) = g.op("Reshape", [attended, rows_by_model])  # (R, d_model)
        out = g.matmul(attended, f"{prefix}.self.o.weight", attn.w_o.weight)
        add_and_norm(out, g.weight(f"{prefix}.self.o.bias", attn.w_o.bias), 3 * i)

        # Cross-attention: each sentence's G rows query its one copy of the encoder keys/values.
        query = g.linear(inner, f"{prefix}.cross.q", cross.w_q)  # (R, d_model)
        (query,) = g.op("Reshape", [query, grouped_shape])  # (N, G, d_model)
        (attended,) = g.op(
            "MultiHeadAttention",
            [query, cross_key(i), cross_value(i), "", ENCODER_ATTENTION_MASK],
            domain=MS_DOMAIN,
            num_heads=heads,
        )  # (N, G, d_model)
        if i == config.aligned_layer:
            alignment = (inner, query, cross_key(i), sentences_beams, opset)
            if cache == "gather":  # inline: a control-flow node would end CUDA graph capture
                _alignment(g, model, *alignment, ALIGNMENT)
            else:  # the CPU's graph: only for the steps that ask (markup, return_alignments)
                with g.when(ALIGNMENT_WANTED, ALIGNMENT) as rows:
                    _alignment(g, model, *alignment, rows)
        (attended,) = g.op("Reshape", [attended, rows_by_model])  # (R, d_model)
        out = g.matmul(attended, f"{prefix}.cross.o.weight", cross.w_o.weight)
        add_and_norm(out, g.weight(f"{prefix}.cross.o.bias", cross.w_o.bias), 3 * i + 1)

        # Position-wise feed-forward.
        hidden = _activation(g, config.activation, g.linear(inner, f"{prefix}.ff.1", ff.w_1))
        out = g.matmul(hidden, f"{prefix}.ff.2.weight", ff.w_2.weight)
        add_and_norm(out, g.weight(f"{prefix}.ff.2.bias", ff.w_2.bias), 3 * i + 2)

    if shortlist:
        _shortlisted(g, model, inner, embedding, sentences_beams, dtype)
        return _model(g, model, onnx_float, opset, cache, shortlist)
    (logits,) = g.op("MatMul", [inner, embedding_t])  # (R, V)
    if model.output_bias is not None:
        (logits,) = g.op("Add", [logits, g.weight("output_bias", model.output_bias)])
    if dtype != "fp32":
        (logits,) = g.op("Cast", [logits], to=TensorProto.FLOAT)
    _log_softmax_top_k(g, model, logits, cache)
    return _model(g, model, onnx_float, opset, cache)


def _shortlisted(
    g: _Graph, model: Transformer, inner: str, embedding: str, sentences_beams: str, dtype: str
) -> None:
    """The outputs over a vocabulary shortlist: the projection onto the `shortlist` ids' rows
    of the embedding (gathered at every step: V' x d_model copied, against V x d_model
    multiplied per row without), each sentence's `shortlist_mask` added to its rows' logits,
    the log-softmax and top k over what is left, and the top positions mapped back to ids. The
    suppressed ids are never in a shortlist (service/inference/shortlist.py), so they need no
    mask here; ties go to the lower id, as the shortlist is ascending."""
    (rows,) = g.op("Gather", [embedding, SHORTLIST])  # (V', d_model)
    projection = [inner, rows]
    if model.output_bias is not None:
        (bias,) = g.op("Gather", [g.weight("output_bias", model.output_bias), SHORTLIST])
        projection.append(bias)
    (logits,) = g.op("Gemm", projection, transB=1)  # (R, V')
    if dtype != "fp32":
        (logits,) = g.op("Cast", [logits], to=TensorProto.FLOAT)
    # (R, V') -> (N, G, V'), plus each sentence's mask (N, 1, V'), and back.
    minus_one = g.constant("shape.minus_one", np.array([-1], np.int64))
    (grouped,) = g.op("Concat", [sentences_beams, minus_one], axis=0)
    (by_rows,) = g.op("Shape", [logits])
    (logits,) = g.op("Reshape", [logits, grouped])
    one = g.constant("shortlist.axis", np.array([1], np.int64))
    (mask,) = g.op("Unsqueeze", [SHORTLIST_MASK, one])
    (logits,) = g.op("Add", [logits, mask])
    (logits,) = g.op("Reshape", [logits, by_rows])
    g.op("LogSoftmax", [logits], [LOG_PROBS], axis=-1)
    (_, positions) = g.op("TopK", [LOG_PROBS, TOP_K], [TOP_LOG_PROBS, "top_k.positions"], axis=-1)
    g.op("Gather", [SHORTLIST, positions], [TOP_IDS])


def _alignment(
    g: _Graph,
    model: Transformer,
    inner: str,
    query: str,
    keys: str,
    sentences_beams: str,
    opset: int,
    output: str,
) -> None:
    """The `alignment` output (R, S) float32, written as `output`: the aligned layer's
    cross-attention weights (its alignment head's, or the heads' mean) for each row,
    recomputed from its query (N, G, d_model) and the sentence's keys (N, H, S, Dh), as the
    fused attention kernel does not return them; with an aligner (ModelConfig.aligner), the
    weights of its own query, made from the layer's cross-attention input `inner` (R, d_model),
    over all heads' keys as one product. About 20 small nodes at one layer, 6-8 % of a step of
    the shipped model: the CPU's graph runs them only when `alignment_wanted` is true."""
    config = model.config
    heads, d_head = config.h, config.d_k
    if model.aligner is not None:  # its own query, over the heads' keys side by side
        query = _aligner_query(g, inner, model.aligner)  # (R, d_model), grouped below
        heads, d_head = 1, config.d_model
    by_heads = g.constant("alignment.shape", np.array([heads, d_head], np.int64))
    (shape,) = g.op("Concat", [sentences_beams, by_heads], axis=0)  # [N, G, H or 1, Dh or d]
    (q,) = g.op("Reshape", [query, shape])
    (q,) = g.op("Transpose", [q], perm=[0, 2, 1, 3])  # (N, H or 1, G, Dh or d_model)
    if config.alignment_head is not None:  # that head alone: (N, 1, G, Dh), (N, 1, S, Dh)
        head = g.constant("alignment.head", np.array([config.alignment_head], np.int64))
        (q,) = g.op("Gather", [q, head], axis=1)
        (keys,) = g.op("Gather", [keys, head], axis=1)
    (k,) = g.op("Transpose", [keys], perm=[0, 1, 3, 2])  # (N, H or 1, Dh, S)
    if model.aligner is not None:  # (N, H, Dh, S) -> (N, 1, d_model, S): one product, no sum
        joined = g.constant("alignment.joined", np.array([0, 1, d_head, -1], np.int64))
        (k,) = g.op("Reshape", [k, joined])
    (scores,) = g.op("MatMul", [q, k])  # (N, H or 1, G, S)
    scale = g.constant("alignment.scale", np.array(1 / math.sqrt(d_head), g.float_type))
    (scores,) = g.op("Mul", [scores, scale])
    axes = g.constant("alignment.axes", np.array([1, 2], np.int64))
    (valid,) = g.op("Cast", [ENCODER_ATTENTION_MASK], to=TensorProto.BOOL)  # (N, S)
    (valid,) = g.op("Unsqueeze", [valid, axes])  # (N, 1, 1, S)
    masked = g.constant("alignment.masked", np.array(-1e4, g.float_type))  # fp16 holds it
    (scores,) = g.op("Where", [valid, scores, masked])
    (weights,) = g.op("Softmax", [scores], axis=-1)
    if config.alignment_head is None and model.aligner is None:  # the heads' mean: (N, 1, G, S)
        if opset >= 18:  # ReduceMean's axes became an input
            one = g.constant("alignment.head_axis", np.array([1], np.int64))
            (weights,) = g.op("ReduceMean", [weights, one], keepdims=1)
        else:
            (weights,) = g.op("ReduceMean", [weights], axes=[1], keepdims=1)
    if g.float_type != np.float32:
        (weights,) = g.op("Cast", [weights], to=TensorProto.FLOAT)
    g.op("Flatten", [weights], [output], axis=3)  # (N, 1, G, S) -> (R, S)


def _aligner_query(g: _Graph, inner: str, aligner: Aligner) -> str:
    """The aligner's query (R, d_model) of the aligned layer's cross-attention input `inner`:
    its projection, plus its hidden ReLU layer's output when it has one (Aligner)."""
    query = g.linear(inner, "aligner.q", aligner.w_q)
    if aligner.w_1 is None or aligner.w_2 is None:
        return query
    (hidden,) = g.op("Relu", [g.linear(inner, "aligner.1", aligner.w_1)])
    (query,) = g.op("Add", [query, g.linear(hidden, "aligner.2", aligner.w_2)])
    return query


def _activation(g: _Graph, name: str, x: str) -> str:
    """The feed-forward's hidden activation (ModelConfig.activation)."""
    if name == "relu":
        (y,) = g.op("Relu", [x])
    elif name == "swish":  # x * sigmoid(x)
        (gate,) = g.op("Sigmoid", [x])
        (y,) = g.op("Mul", [x, gate])
    elif name == "gelu":  # the exact one, with erf, as torch's default
        (y,) = g.op("Gelu", [x], domain=MS_DOMAIN)
    else:
        raise ValueError(f"no ONNX form for the activation {name!r}")
    return y


def _log_softmax_top_k(g: _Graph, model: Transformer, logits: str, cache: DecoderCache) -> None:
    """log_probs (R, V) float32 from the logits, and the top k of each row without the
    suppressed ids (ModelConfig.suppressed_ids; ONNX TopK puts equal values lower id first, as
    the search's tie rule wants).

    With renormalize_suppressed the suppressed logits are -inf before the log-softmax
    (transformers' renormalize_logits), so log_probs has them at -inf. Without (transformers'
    bad_words_ids, applied after the log-softmax), log_probs is the log-softmax of every token
    and the suppression is applied to the few candidates only: the top k + s of the row (s
    suppressed ids) hold its top k unsuppressed ones, so those k + s are taken, the suppressed
    among them set to -inf, and the top k of what is left kept. That spares a pass over the
    (R, V) log-probs at every step (at 128 rows x 32,000 tokens on 2 cores, 3.3 of the 14 ms
    that the log-softmax, mask and top-k took).

    The gather cache's graph (the one CUDA runs) masks the whole row instead and takes its top k
    at once: k + s would be int64 arithmetic on the top_k input, which ONNX Runtime places on
    the CUDA provider and copies back to the host for TopK's k, two Memcpy nodes at every step
    that also keep the session from capturing CUDA graphs (seen on an H100 with a
    transformer-base Marian bundle); on a GPU the (R, V) add costs microseconds. Both give the
    same top k: the unsuppressed ones, ties lower id first."""
    config = model.config
    if config.suppressed_ids:
        suppressed = np.zeros(config.decoder_vocab_size, np.float32)
        suppressed[list(config.suppressed_ids)] = -np.inf
        minus_inf = g.constant("suppressed", suppressed)  # (V,): -inf where suppressed, else 0
        if config.renormalize_suppressed:
            (logits,) = g.op("Add", [logits, minus_inf])
    g.op("LogSoftmax", [logits], [LOG_PROBS], axis=-1)
    if not config.suppressed_ids or config.renormalize_suppressed:
        g.op("TopK", [LOG_PROBS, TOP_K], [TOP_LOG_PROBS, TOP_IDS], axis=-1)
        return
    if cache == "gather":
        (masked,) = g.op("Add", [LOG_PROBS, minus_inf])
        g.op("TopK", [masked, TOP_K], [TOP_LOG_PROBS, TOP_IDS], axis=-1)
        return
    more = g.constant("top_k.suppressed", np.array([len(config.suppressed_ids)], np.int64))
    vocab = g.constant("top_k.vocab", np.array([config.decoder_vocab_size], np.int64))
    (wider,) = g.op("Add", [TOP_K, more])
    (wider,) = g.op("Min", [wider, vocab])  # k + s, at most V
    values, ids = g.op("TopK", [LOG_PROBS, wider], 2, axis=-1)  # (R, k + s) each
    (masks,) = g.op("Gather", [minus_inf, ids])  # (R, k + s): -inf on suppressed ids
    (values,) = g.op("Add", [values, masks])
    # Equal values keep their order (lower position first), so ties stay lower id first.
    _, positions = g.op("TopK", [values, TOP_K], [TOP_LOG_PROBS, "top_k.positions"], axis=-1)
    g.op("GatherElements", [ids, positions], [TOP_IDS], axis=-1)


def _attend_through_indirection(
    g: _Graph, i: int, q: str, k: str, v: str, bias: str, heads: int
) -> str:
    """ONNX Runtime's cache-sharing attention: the new key/value goes into the cache at
    past_sequence_length, earlier positions are read through the cache indirection (the CPU
    kernel; CUDA's lays the cache out differently from its first step on)."""
    (attended, _, _) = g.op(
        "MultiHeadAttention",
        [
            q,
            k,
            v,
            bias,
            SELF_ATTENTION_MASK,  # (R, T + 1): the positions of the row's own tokens
            "",  # attention_bias
            past_key(i),
            past_value(i),
            PAST_SEQUENCE_LENGTH,
            CACHE_INDIRECTION,
        ],
        [f"decoder.{i}.self.out", present_key(i), present_value(i)],
        domain=MS_DOMAIN,
        num_heads=heads,
    )  # (R, 1, d_model)
    return attended


def _attend_over_gathered(
    g: _Graph, i: int, q: str, k: str, v: str, mask: str, by_heads: str, heads: int
) -> str:
    """Standard operators only: the cache gathered by beam_rows, the new key/value scattered in
    at the step's position, attention over all C positions with the later ones masked. Every
    value the step reads is on the device, so it runs and replays the same on any provider."""
    presents = []
    for new, past, present in (
        (k, past_key(i), present_key(i)),
        (v, past_value(i), present_value(i)),
    ):
        (new,) = g.op("Reshape", [new, by_heads])  # (R, H, 1, Dh)
        (gathered,) = g.op("Gather", [past, BEAM_ROWS], axis=0)  # (R, H, C, Dh)
        g.op("TensorScatter", [gathered, new, POSITION], [present], axis=2)
        presents.append(present)
    (attended,) = g.op(
        "MultiHeadAttention", [q, *presents, "", mask], domain=MS_DOMAIN, num_heads=heads
    )  # (R, 1, d_model)
    return attended


def _cache_mask(g: _Graph, max_positions: int) -> str:
    """(R, C) int32: 1 where a cache position is at or before the step's, from `position` on the
    device (a constant range sliced to the cache's C positions, compared)."""
    positions = g.constant("cache.positions", np.arange(max_positions, dtype=np.int64)[None, :])
    zero, one = (g.constant(f"cache.{n}", np.array([n], np.int64)) for n in (0, 1))
    (capacity,) = g.op("Shape", [past_key(0)], start=2, end=3)  # [C]
    (positions,) = g.op("Slice", [positions, zero, capacity, one])  # (1, C)
    (step,) = g.op("Unsqueeze", [POSITION, one])  # (R, 1)
    (valid,) = g.op("LessOrEqual", [positions, step])  # (R, C)
    (mask,) = g.op("Cast", [valid], to=TensorProto.INT32)
    return mask


def _decoder_layers(model: Transformer) -> list[DecoderLayer]:
    layers = list(model.decoder_layers)
    if not all(isinstance(layer, DecoderLayer) for layer in layers):
        raise TypeError("the model's decoder layers are not DecoderLayers")
    return layers  # type: ignore[return-value]  # (checked above; ModuleList is untyped)


def _layer_norm(g: _Graph, name: str, norm: object) -> tuple[str, str, float]:
    if not isinstance(norm, nn.LayerNorm):
        raise TypeError(f"{name} is a {type(norm).__name__}, not a LayerNorm")
    return g.weight(f"{name}.weight", norm.weight), g.weight(f"{name}.bias", norm.bias), norm.eps


def _model(
    g: _Graph,
    model: Transformer,
    onnx_float: int,
    opset: int,
    decoder_cache: DecoderCache,
    shortlist: bool = False,
) -> onnx.ModelProto:
    config = model.config
    n = config.n_decoder_layers
    heads, d_head = config.h, config.d_k
    cache: list[int | str] = [ROW_AXIS, heads, CAPACITY_AXIS, d_head]
    source: list[int | str] = [SENTENCE_AXIS, heads, SOURCE_AXIS, d_head]
    types: dict[str, tuple[int, list[int | str]]] = {
        INPUT_IDS: (TensorProto.INT64, [SENTENCE_AXIS, BEAM_AXIS]),
        POSITION: (TensorProto.INT64, [ROW_AXIS]),
        PAST_SEQUENCE_LENGTH: (TensorProto.INT32, [1]),
        BEAM_ROWS: (TensorProto.INT64, [ROW_AXIS]),
        ENCODER_ATTENTION_MASK: (TensorProto.INT32, [SENTENCE_AXIS, SOURCE_AXIS]),
        CACHE_INDIRECTION: (TensorProto.INT32, [SENTENCE_AXIS, BEAM_AXIS, CAPACITY_AXIS]),
        SELF_ATTENTION_MASK: (TensorProto.INT32, [ROW_AXIS, ATTENDED_AXIS]),
        TOP_K: (TensorProto.INT64, [1]),
        ALIGNMENT_WANTED: (TensorProto.BOOL, [1]),
        SHORTLIST: (TensorProto.INT64, [SHORTLIST_AXIS]),
        SHORTLIST_MASK: (TensorProto.FLOAT, [SENTENCE_AXIS, SHORTLIST_AXIS]),
        LOG_PROBS: (
            TensorProto.FLOAT,
            [ROW_AXIS, SHORTLIST_AXIS if shortlist else config.decoder_vocab_size],
        ),
        TOP_LOG_PROBS: (TensorProto.FLOAT, [ROW_AXIS, TOP_K_AXIS]),
        TOP_IDS: (TensorProto.INT64, [ROW_AXIS, TOP_K_AXIS]),
        ALIGNMENT: (TensorProto.FLOAT, [ROW_AXIS, SOURCE_AXIS]),
    }
    for i in range(n):
        for name in (past_key(i), past_value(i), present_key(i), present_value(i)):
            types[name] = (onnx_float, cache)
        for name in (cross_key(i), cross_value(i)):
            types[name] = (onnx_float, source)
    inputs, outputs = decoder_step_io(n, decoder_cache, alignment=True, shortlist=shortlist)
    graph = helper.make_graph(
        g.nodes,
        "decoder_step",
        [helper.make_tensor_value_info(name, *types[name]) for name in inputs],
        [helper.make_tensor_value_info(name, *types[name]) for name in outputs],
        g.initializers,
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="transformer-mt export.decoder_step",
    )
    proto.ir_version = IR_VERSION if opset < GATHER_OPSET else 10  # opset 24 needs IR 10
    return proto
