"""Checkpoint -> ONNX bundle: encoder.onnx, decoder_step.onnx, tokenizer.json, manifest.json.

    python -m export --checkpoint DIR --out BUNDLE [--dtype fp32|fp16|int8] [--opset N]

The bundle layout and every tensor name come from `service/bundle.py` (the serving side owns the
contract). Two graphs, no merged decoder: the encoder runs once per request and also returns the
cross-attention keys/values of every decoder layer; the decoder step takes one token per row and
the self-attention cache, whose length T (0 on the first step) is the step's position, and
attends with all the rows (beams) of a sentence over that sentence's one copy of the cross
keys/values.

The graphs are traced with the TorchScript exporter (`dynamo=False`): on these two graphs it gives
clean dynamic batch, source and past axes. Tracing records one concrete run, so the dummy inputs
use a past length of 3 (never 0 or 1), a padded batch of 2 sentences with 3 rows each (6 rows,
gathered from 4 past rows), and 7 candidates per row; a constant specialised by the trace would
then show up as a shape error or a parity failure for other shapes (see export/parity.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, get_args

import onnx
import torch
from torch import Tensor, nn

from export.quantize import convert_graph
from model.tokenizer import load_tokenizer
from model.transformer import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DecoderCache,
    ModelConfig,
    Transformer,
    load_model,
)
from service.bundle import (
    ATTENTION_MASK,
    BATCH_AXIS,
    CACHE_INDEX,
    DECODER_STEP_FILE,
    ENCODER_ATTENTION_MASK,
    ENCODER_FILE,
    FORMAT_VERSION,
    INPUT_IDS,
    LOG_PROBS,
    MANIFEST_FILE,
    MEMORY,
    PAST_AXIS,
    PAST_BATCH_AXIS,
    PRESENT_AXIS,
    SENTENCE_AXIS,
    SOURCE_AXIS,
    TOKENIZER_FILE,
    TOP_IDS,
    TOP_K_AXIS,
    TOP_LOG_PROBS,
    BundleError,
    Dtype,
    GraphSpec,
    Manifest,
    ModelDims,
    Provenance,
    SentencePieceFiles,
    SpecialIds,
    TensorSpec,
    cross_names,
    decoder_step_io,
    encoder_io,
    file_entry,
    past_names,
    present_names,
    sha256_file,
    tokenizer_files,
)
from service.tokenizer import SentencePieceTokenizer

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17  # the first opset with LayerNormalization as one node
_REPO = Path(__file__).resolve().parents[1]

# Dummy shapes for tracing: all different and > 1, so no axis can be confused with another or
# folded into a constant.
_DUMMY_SENTENCES, _DUMMY_SOURCE, _DUMMY_PAST, _DUMMY_PAST_BATCH, _DUMMY_TOP_K = 2, 5, 3, 4, 7
# Three rows per sentence (6 in all) continue the four past rows, out of order and repeated.
_DUMMY_CACHE_INDEX = [3, 1, 1, 0, 2, 3]


def _source_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) boolean mask, as `padding_mask` builds from the ids."""
    return (attention_mask != 0)[:, None, None, :]


def _interleave(keys: list[Tensor], values: list[Tensor]) -> list[Tensor]:
    """[k0, v0, k1, v1, ...]: the order of `cross_names` / `present_names`."""
    return [t for pair in zip(keys, values, strict=True) for t in pair]


class EncoderGraph(nn.Module):
    """encode() + cross_kv() with flat tensor inputs and outputs, as an ONNX graph needs."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        src_mask = _source_mask(attention_mask)
        memory = self.model.encode(input_ids, src_mask)  # (B, S, d_model)
        keys, values = self.model.cross_kv(memory)  # each (B, H, S, Dh)
        return (memory, *_interleave(keys, values))


class DecoderStepGraph(nn.Module):
    """decode_step() with the DecoderCache flattened into named tensors."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        encoder_attention_mask: Tensor,
        cache_index: Tensor,
        top_k: Tensor,
        *caches: Tensor,
    ) -> tuple[Tensor, ...]:
        n = self.model.config.n_decoder_layers
        # In past_names / cross_names order; row b continues past row cache_index[b], which is
        # how finished rows leave and beams follow their back-pointers without a host copy.
        past = [t.index_select(0, cache_index) for t in caches[: 2 * n]]
        cross = caches[2 * n :]
        cache = DecoderCache(past[0::2], past[1::2], list(cross[0::2]), list(cross[1::2]))
        # decode_step reads the position from the past length, so the graph derives it too.
        log_probs, cache = self.model.decode_step(
            input_ids[:, 0], cache, _source_mask(encoder_attention_mask)
        )  # (B, V)
        # top_k[0] stays a graph value under tracing: the candidates per row are an input.
        # ONNX TopK returns ties lower index first, as the search's tie rule wants.
        # (torch's stubs want an int; the tracer takes the 0-d tensor and keeps it dynamic.)
        top_log_probs, top_ids = torch.topk(log_probs, top_k[0], dim=-1)  # type: ignore[arg-type]
        return (log_probs, top_log_probs, top_ids, *_interleave(cache.self_k, cache.self_v))


def _dummy_inputs(model: Transformer) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """Deterministic source ids, a mask with a padded row, target tokens (3 rows a sentence),
    and a past of length _DUMMY_PAST with _DUMMY_PAST_BATCH rows (the decoder gathers
    len(_DUMMY_CACHE_INDEX) of them)."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(
        0, config.vocab_size, (_DUMMY_SENTENCES, _DUMMY_SOURCE), generator=generator
    )  # (N, S)
    mask = torch.ones_like(ids)  # (N, S)
    ids[1, -2:], mask[1, -2:] = config.pad_id, 0
    tokens = torch.randint(
        0, config.decoder_vocab_size, (len(_DUMMY_CACHE_INDEX), 1), generator=generator
    )  # (B, 1)
    past_shape = (_DUMMY_PAST_BATCH, config.h, _DUMMY_PAST, config.d_k)  # (P, H, T, Dh)
    past = [
        torch.randn(past_shape, generator=generator) for _ in range(2 * config.n_decoder_layers)
    ]
    return ids, mask, tokens, past


def export_graphs(model: Transformer, directory: Path, opset: int) -> None:
    """Trace the fp32 encoder and decoder-step graphs into `directory`."""
    n = model.config.n_decoder_layers
    ids, mask, tokens, past = _dummy_inputs(model)
    encoder = EncoderGraph(model).eval()
    decoder = DecoderStepGraph(model).eval()
    with torch.no_grad():
        encoded = encoder(ids, mask)
    enc_inputs, enc_outputs = encoder_io(n)
    enc_axes: dict[str, dict[int, str]] = {
        INPUT_IDS: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        ATTENTION_MASK: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        MEMORY: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        **{name: {0: SENTENCE_AXIS, 2: SOURCE_AXIS} for name in cross_names(n)},
    }
    dec_inputs, dec_outputs = decoder_step_io(n)
    dec_axes: dict[str, dict[int, str]] = {
        INPUT_IDS: {0: BATCH_AXIS},
        ENCODER_ATTENTION_MASK: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        CACHE_INDEX: {0: BATCH_AXIS},
        **{name: {0: PAST_BATCH_AXIS, 2: PAST_AXIS} for name in past_names(n)},
        **{name: {0: SENTENCE_AXIS, 2: SOURCE_AXIS} for name in cross_names(n)},
        LOG_PROBS: {0: BATCH_AXIS},
        TOP_LOG_PROBS: {0: BATCH_AXIS, 1: TOP_K_AXIS},
        TOP_IDS: {0: BATCH_AXIS, 1: TOP_K_AXIS},
        **{name: {0: BATCH_AXIS, 2: PRESENT_AXIS} for name in present_names(n)},
    }
    with warnings.catch_warnings():
        # The TorchScript exporter is chosen on purpose (see the module docstring); its
        # deprecation notices, from torch.onnx and its internals, are noise here.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        # The model's Python-side checks (max_positions in embed(), sqrt of the fixed head size)
        # are frozen by the trace, which is intended; specialised shapes are caught by parity.
        # (TracerWarning is public API that torch's stubs do not re-export.)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # type: ignore[attr-defined]
        for module, args, path, inputs, outputs, axes in (
            (encoder, (ids, mask), directory / ENCODER_FILE, enc_inputs, enc_outputs, enc_axes),
            (
                decoder,
                (
                    tokens,
                    mask,
                    torch.tensor(_DUMMY_CACHE_INDEX),
                    torch.tensor([_DUMMY_TOP_K]),
                    *past,
                    *encoded[1:],
                ),
                directory / DECODER_STEP_FILE,
                dec_inputs,
                dec_outputs,
                dec_axes,
            ),
        ):
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=opset,
            )
    # torch.onnx.export puts the wrapper back in its previous (training) mode on the way out,
    # and with it the model; keep it in eval mode for whoever uses it next.
    model.eval()


def _graph_spec(path: Path, inputs: list[str], outputs: list[str]) -> GraphSpec:
    """The manifest entry of a written graph, read back from the file itself."""
    graph = onnx.load(str(path), load_external_data=False).graph

    def specs(values: Any) -> list[TensorSpec]:
        out = []
        for value in values:
            tensor_type = value.type.tensor_type
            shape: list[int | str] = [
                d.dim_param if d.HasField("dim_param") else int(d.dim_value)
                for d in tensor_type.shape.dim
            ]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
            out.append(TensorSpec(name=value.name, dtype=dtype, shape=shape))
        return out

    spec = GraphSpec(file=path.name, inputs=specs(graph.input), outputs=specs(graph.output))
    if spec.input_names != inputs or spec.output_names != outputs:
        raise BundleError(
            f"{path}: exported graph has inputs {spec.input_names} and outputs "
            f"{spec.output_names}; the contract says {inputs} and {outputs}"
        )
    return spec


def _git_commit() -> str | None:
    """The code's commit, for provenance; None outside a git checkout or without git."""
    try:
        result = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _recorded_bleu(config: dict[str, Any]) -> float | None:
    """A BLEU the checkpoint records: top-level "bleu", else train.py's valid_after_averaging."""
    for value in (config.get("bleu"), (config.get("valid_after_averaging") or {}).get("bleu")):
        if isinstance(value, int | float):
            return float(value)
    return None


def _special_ids(config: ModelConfig) -> SpecialIds:
    return SpecialIds(pad=config.pad_id, bos=config.bos_id, eos=config.eos_id, unk=config.unk_id)


def _checkpoint_tokenizer(
    checkpoint: Path, meta: dict[str, Any], config: ModelConfig
) -> str | SentencePieceFiles:
    """The checkpoint's tokenizer as the manifest names it, checked against the model: this
    project's tokenizer.json, or the SentencePiece files config.json lists (an imported Marian
    model, see model/import_marian.py)."""
    if "tokenizer" not in meta:
        tokenizer = load_tokenizer(checkpoint / TOKENIZER_FILE)
        if tokenizer.get_vocab_size() != config.vocab_size:
            raise ValueError(
                f"{checkpoint / TOKENIZER_FILE} has {tokenizer.get_vocab_size()} tokens, the "
                f"model {config.vocab_size}"
            )
        return TOKENIZER_FILE
    files = SentencePieceFiles.model_validate(meta["tokenizer"])
    vocab_sizes = (config.vocab_size, config.decoder_vocab_size)
    SentencePieceTokenizer(checkpoint, files, _special_ids(config), vocab_sizes)  # loads: checks
    return files


def _language(meta: dict[str, Any], key: str, path: Path) -> str:
    """The service routes requests by these codes, so a bundle without them is useless."""
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path} has no {key}")
    return value


def export_bundle(
    checkpoint: str | Path, out: str | Path, *, dtype: Dtype = "fp32", opset: int = DEFAULT_OPSET
) -> Manifest:
    """Write a complete bundle for `checkpoint` into `out` and return its manifest.

    The manifest is removed first and written last, so an interrupted export never leaves a
    directory that loads as a bundle.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    model = load_model(checkpoint)
    config = model.config
    meta: dict[str, Any] = json.loads((checkpoint / CONFIG_FILE).read_text(encoding="utf-8"))
    source_language, target_language = (
        _language(meta, key, checkpoint / CONFIG_FILE)
        for key in ("source_language", "target_language")
    )
    tokenizer = _checkpoint_tokenizer(checkpoint, meta, config)
    files = tokenizer_files(tokenizer)

    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fp32_dir = out if dtype == "fp32" else Path(tmp)
        export_graphs(model, fp32_dir, opset)
        if dtype != "fp32":
            for file in (ENCODER_FILE, DECODER_STEP_FILE):
                convert_graph(fp32_dir / file, out / file, dtype)
    for name in files:
        shutil.copyfile(checkpoint / name, out / name)

    n = config.n_decoder_layers
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        model=ModelDims(
            encoder_layers=config.n_encoder_layers,
            decoder_layers=n,
            heads=config.h,
            d_model=config.d_model,
            d_head=config.d_k,
            vocab_size=config.vocab_size,
            max_positions=config.max_positions,
            target_vocab_size=config.target_vocab_size,
        ),
        special_ids=_special_ids(config),
        source_language=source_language,
        target_language=target_language,
        target_tokens=meta.get("target_tokens", {}),
        dtype=dtype,
        opset=opset,
        tokenizer=tokenizer,
        encoder=_graph_spec(out / ENCODER_FILE, *encoder_io(n)),
        decoder_step=_graph_spec(out / DECODER_STEP_FILE, *decoder_step_io(n)),
        files={name: file_entry(out / name) for name in (ENCODER_FILE, DECODER_STEP_FILE, *files)},
        provenance=Provenance(
            checkpoint=str(checkpoint.resolve()),
            checkpoint_sha256=sha256_file(checkpoint / WEIGHTS_FILE),
            git_commit=_git_commit(),
            bleu=_recorded_bleu(meta),
            exporter=f"torch {torch.__version__} (TorchScript exporter), onnx {onnx.__version__}",
        ),
    )
    tmp_manifest = out / (MANIFEST_FILE + ".tmp")
    tmp_manifest.write_text(manifest.to_json(), encoding="utf-8")
    tmp_manifest.replace(out / MANIFEST_FILE)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export", description="Export a checkpoint to an ONNX bundle."
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="config.json + model.safetensors + tokenizer.json (or an imported Marian model's "
        "SentencePiece files)",
    )
    p.add_argument(
        "--out", required=True, type=Path, help="bundle directory (created or overwritten)"
    )
    p.add_argument("--dtype", choices=get_args(Dtype), default="fp32")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        manifest = export_bundle(args.checkpoint, args.out, dtype=args.dtype, opset=args.opset)
    except (FileNotFoundError, ValueError, BundleError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    log.info("exported %s (%s) to %s in %.1f s", args.checkpoint, args.dtype, args.out, seconds)
    summary = {
        "bundle": str(args.out),
        "dtype": manifest.dtype,
        "opset": manifest.opset,
        "seconds": round(seconds, 3),
        "bytes": {name: entry.size for name, entry in manifest.files.items()},
    }
    print(json.dumps(summary))
    return 0
