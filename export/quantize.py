"""fp16 (GPU) and int8 (CPU) variants of the fp32 graphs, judged by BLEU against fp32.

    python -m export --checkpoint DIR --out BUNDLE --dtype fp16|int8      (builds a variant)
    python -m export.quantize --bundle BUNDLE --reference FP32_BUNDLE --src F --ref F
        [--n N] [--beam-size K] [--batch-size N] [--threads N] [--provider cpu|cuda]

Reduced precision cannot be token-exact with torch, so instead of export/parity.py's tolerance
the variants report what a user sees: sacreBLEU of both bundles decoded by ONNX Runtime on the
same sentences, the delta, the fraction of identical outputs, and the graph sizes. The last
stdout line is that JSON object.

- fp16: onnxruntime's float16 converter (a copy of onnxconverter-common's, which is not a
  dependency). log_probs and top_log_probs stay float32 outputs computed by a float32
  LogSoftmax and TopK, so scores summed over a beam do not lose precision; the cache and cross
  keys/values are float16 in and out, halving what a GPU step moves.
- int8: dynamic quantization of every MatMul with a constant weight (weights int8 per output
  channel, activations quantized on the fly); inputs and outputs stay float32.

Both conversions are deterministic: the same fp32 graph gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from onnx.external_data_helper import uses_external_data
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from export.parity import decode_texts, open_bundle
from model.data import DataError, read_parallel
from model.evaluate import score_translations
from service.bundle.manifest import (
    LOG_PROBS,
    TOP_LOG_PROBS,
    BundleError,
    Manifest,
    external_data_file,
)

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


def convert_graph(src: Path, dtype: str) -> onnx.ModelProto:
    """The `dtype` variant of the fp32 graph `src`, its weights in memory (`src` may keep them
    as external data: both conversions read them from beside it)."""
    if dtype == "fp16":
        # A path, not a loaded graph: the converter's shape inference then goes through files,
        # which works for graphs over protobuf's 2 GB limit.
        converted: onnx.ModelProto = convert_float_to_float16(
            str(src),
            keep_io_types=[LOG_PROBS, TOP_LOG_PROBS],
            op_block_list=[*DEFAULT_OP_BLOCK_LIST, "LogSoftmax", "TopK"],
        )
        _drop_fp16_round_trips(converted.graph)
        return converted
    if dtype == "int8":
        # A graph whose weights are in a file of their own (an exported one: the traced encoder
        # only for a model over 2 GB) stays so through both steps: protobuf cannot write a
        # graph over 2 GB in one.
        external = _has_external_data(src)
        with tempfile.TemporaryDirectory() as tmp:
            prepared, quantized = Path(tmp) / "prepared.onnx", Path(tmp) / "quantized.onnx"
            # Shape inference and constant folding first, as ONNX Runtime's quantizer recommends.
            quant_pre_process(
                src,
                prepared,
                skip_symbolic_shape=True,
                save_as_external_data=external,
                all_tensors_to_one_file=True,
                external_data_location=external_data_file(prepared.name),
            )
            # Per output channel: one scale per weight column. Per tensor, the 8,000-row tied
            # embedding shared a single scale and val BLEU fell 0.38; per channel it is within
            # +-0.15 of fp32 at the same size and, within noise, the same speed.
            quantize_dynamic(
                prepared,
                quantized,
                op_types_to_quantize=["MatMul"],
                weight_type=QuantType.QInt8,
                per_channel=True,
                use_external_data_format=external,
                # ONNX shape inference does not type the outputs of ONNX Runtime's contrib ops
                # (the decoder step's attention and layer norms): they are float32.
                extra_options={
                    "DefaultTensorType": onnx.TensorProto.FLOAT,
                    # The decoder step's alignment nodes sit in an If's branch (their weights
                    # in the outer graph): quantized like the rest.
                    "EnableSubgraph": True,
                },
            )
            return onnx.load(str(quantized))
    raise ValueError(f"no conversion to {dtype!r}; choose fp16 or int8")


def _has_external_data(path: Path) -> bool:
    """Whether the graph at `path` keeps any weight outside its file."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(uses_external_data(tensor) for tensor in graph.initializer)


def _drop_fp16_round_trips(graph: onnx.GraphProto) -> None:
    """Cast(to float32)(Cast(to float16)(x)) -> Cast(to float32)(x).

    The converter computes LogSoftmax in float32 but then casts its output to float16 and back
    for the float32 graph output, rounding log_probs to float16 for nothing. Reading x directly
    is type-correct whatever x's type, and only removes that rounding.
    """

    def cast_to(node: onnx.NodeProto) -> int | None:
        if node.op_type != "Cast":
            return None
        return next(int(a.i) for a in node.attribute if a.name == "to")

    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        source = producer.get(node.input[0]) if node.input else None
        if (
            cast_to(node) == onnx.TensorProto.FLOAT
            and source is not None
            and cast_to(source) == onnx.TensorProto.FLOAT16
        ):
            node.input[0] = source.input[0]
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [n for n in graph.node if cast_to(n) is not None and n.output[0] not in used]
    for node in unused:
        graph.node.remove(node)


def graph_bytes(manifest: Manifest) -> int:
    """Size of the two graphs with their external data: what a dtype changes (the tokenizer is
    the same)."""
    graphs = (manifest.encoder.file, manifest.decoder_step.file)
    files = [name for graph in graphs for name in (graph, external_data_file(graph))]
    return sum(manifest.files[name].size for name in files if name in manifest.files)


@dataclass(frozen=True)
class _Run:
    dtype: str
    graph_bytes: int
    scores: dict[str, float]
    tokens: list[list[int]]


def compare_bleu(
    bundle: Path,
    reference: Path,
    src: Sequence[str],
    ref: Sequence[str],
    *,
    beam_size: int = 4,
    batch_size: int = 32,
    threads: int = 1,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> dict[str, object]:
    """Decode `src` with `bundle` and with the fp32 `reference` bundle; BLEU of each vs `ref`."""
    if len(src) != len(ref):
        raise ValueError(f"{len(src)} source lines but {len(ref)} references")
    bundles = [open_bundle(d, threads=threads, providers=providers) for d in (bundle, reference)]
    candidate_manifest, reference_manifest = (b.bundle.manifest for b in bundles)
    if reference_manifest.dtype != "fp32":
        raise ValueError(f"the reference {reference} is {reference_manifest.dtype}, not fp32")
    if (
        candidate_manifest.provenance.checkpoint_sha256
        != reference_manifest.provenance.checkpoint_sha256
    ):
        raise ValueError(f"{bundle} and {reference} were exported from different checkpoints")
    runs: list[_Run] = []
    for ort_bundle in bundles:
        manifest = ort_bundle.bundle.manifest
        texts, tokens, kept = decode_texts(
            ort_bundle, src, beam_size=beam_size, batch_size=batch_size
        )
        scores = score_translations(texts, [ref[i] for i in kept], manifest.target_language)
        runs.append(_Run(manifest.dtype, graph_bytes(manifest), scores, tokens))
    candidate, fp32 = runs
    identical = sum(a == b for a, b in zip(candidate.tokens, fp32.tokens, strict=True))
    return {
        "dtype": candidate.dtype,
        "bleu": round(candidate.scores["bleu"], 2),
        "bleu_fp32": round(fp32.scores["bleu"], 2),
        "bleu_delta": _delta(candidate.scores["bleu"], fp32.scores["bleu"]),
        "bleu_lc_tok_delta": _delta(candidate.scores["bleu_lc_tok"], fp32.scores["bleu_lc_tok"]),
        "identical_fraction": round(identical / max(len(fp32.tokens), 1), 4),
        "graph_bytes": candidate.graph_bytes,
        "graph_bytes_fp32": fp32.graph_bytes,
        "n_sentences": len(fp32.tokens),
        "skipped_too_long": len(src) - len(fp32.tokens),
        "beam_size": beam_size,
    }


def _delta(value: float, reference: float) -> float:
    return round(value - reference, 2) + 0.0  # + 0.0 turns a rounded -0.0 into 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.quantize",
        description="BLEU of a fp16/int8 bundle against its fp32 bundle, both in ONNX Runtime.",
    )
    p.add_argument(
        "--bundle",
        required=True,
        type=Path,
        help="the variant: an fp16 or int8 bundle, or one with a shortlist",
    )
    p.add_argument(
        "--reference", required=True, type=Path, help="the fp32 bundle (without a shortlist)"
    )
    p.add_argument("--src", required=True, help="source sentences, plain or .gz")
    p.add_argument("--ref", required=True, help="reference translations, plain or .gz")
    p.add_argument("--n", type=int, default=200, help="first N sentences (default 200)")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    p.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    torch.set_num_threads(args.threads)
    try:
        src, ref = read_parallel(args.src, args.ref)
        result = compare_bleu(
            args.bundle,
            args.reference,
            src[: args.n],
            ref[: args.n],
            beam_size=args.beam_size,
            batch_size=args.batch_size,
            threads=args.threads,
            providers=PROVIDERS[args.provider],
        )
    except (BundleError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
