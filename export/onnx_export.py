"""Checkpoint -> ONNX bundle: encoder.onnx, decoder_step.onnx, tokenizer.json, manifest.json
and each graph's weights beside it as external data, encoder.onnx.data and decoder_step.onnx.data.

    python -m export --checkpoint DIR --out BUNDLE [--dtype fp32|fp16|int8] [--opset N]

The bundle layout and every tensor name come from `service/bundle/manifest.py` (the serving side
owns the contract). Two graphs, no merged decoder: the encoder runs once per batch and also returns
the cross-attention keys/values of every decoder layer; the decoder step takes one token per row, a
static key/value cache it writes in place, and attends with all the rows (beams) of a sentence over
that sentence's one copy of the cross keys/values.

The encoder is traced with the TorchScript exporter (`dynamo=False`): on this graph it gives
clean dynamic batch and source axes. Tracing records one concrete run, so the dummy input is a
padded batch of 2 sentences of 5 tokens; a constant specialised by the trace would show up as a
shape error or a parity failure for other shapes (see export/parity.py). The decoder step is
built node by node from the weights (export/decoder_step.py), around ONNX Runtime's fused
attention and layer-norm kernels.
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

from export.decoder_step import build_decoder_step
from export.quantize import convert_graph
from export.shortlist import DEFAULT_FREQUENT, DEFAULT_PER_TOKEN, corpus_shortlist
from model.tokenizer import load_tokenizer
from model.transformer import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ModelConfig,
    Transformer,
    load_model,
)
from service.bundle.manifest import (
    ATTENTION_MASK,
    CARD_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FORMAT_VERSION,
    INPUT_IDS,
    MANIFEST_FILE,
    MEMORY,
    SENTENCE_AXIS,
    SHORTLIST_FILE,
    SOURCE_AXIS,
    TOKENIZER_FILE,
    AlignmentSpec,
    BundleError,
    DecoderCache,
    Dtype,
    GraphSpec,
    Manifest,
    ModelDims,
    Provenance,
    SentencePieceFiles,
    ShortlistSpec,
    SpecialIds,
    TensorSpec,
    Tokenization,
    TokenizersFile,
    cross_names,
    decoder_step_io,
    encoder_io,
    external_data_file,
    file_entry,
    sha256_file,
    tokenizer_files,
)
from service.bundle.tokenizer import load_tokenizer_files

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17  # the first opset with LayerNormalization as one node
_REPO = Path(__file__).resolve().parents[1]

# Every graph is written with its weights as external data (`save_graph`): ONNX Runtime maps
# external data into memory instead of copying it, so the pages no step reads stay on disk (the
# embedding rows of the ids no sentence uses; a weight ONNX Runtime repacks at load is not held
# twice either): an OPUS-MT-base-size model's process holds 324 MiB after loading against 507
# for the same graphs in one file each, the shipped model's 94 against 107
# (benchmarks/RESULTS.md, issue 35's sixth part). And protobuf cannot write a message over
# 2 GiB (NLLB-200 1.3B's graphs).
# Tensors smaller than this stay in the graph file (onnx's default).
_EXTERNAL_TENSOR_BYTES = 1024

# Dummy shapes for tracing: different and > 1, so neither axis can be confused with the other or
# folded into a constant.
_DUMMY_SENTENCES, _DUMMY_SOURCE = 2, 5


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


def _dummy_inputs(model: Transformer) -> tuple[Tensor, Tensor]:
    """Deterministic ids and a mask with a padded row."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(
        0, config.vocab_size, (_DUMMY_SENTENCES, _DUMMY_SOURCE), generator=generator
    )  # (N, S)
    mask = torch.ones_like(ids)  # (N, S)
    ids[1, -2:], mask[1, -2:] = config.pad_id, 0
    return ids, mask


def export_encoder(model: Transformer, path: Path, opset: int) -> None:
    """Trace the fp32 encoder graph into `path`."""
    n = model.config.n_decoder_layers
    ids, mask = _dummy_inputs(model)
    inputs, outputs = encoder_io(n)
    axes: dict[str, dict[int, str]] = {
        INPUT_IDS: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        ATTENTION_MASK: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        MEMORY: {0: SENTENCE_AXIS, 1: SOURCE_AXIS},
        **{name: {0: SENTENCE_AXIS, 2: SOURCE_AXIS} for name in cross_names(n)},
    }
    with warnings.catch_warnings():
        # The TorchScript exporter is chosen on purpose (see the module docstring); its
        # deprecation notices, from torch.onnx and its internals, are noise here.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        # The model's Python-side checks (max_positions in embed(), sqrt of the fixed head size)
        # are frozen by the trace, which is intended; specialised shapes are caught by parity.
        # (TracerWarning is public API that torch's stubs do not re-export.)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # type: ignore[attr-defined]
        torch.onnx.export(
            EncoderGraph(model).eval(),
            (ids, mask),
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


def save_graph(graph: onnx.ModelProto, path: Path) -> list[str]:
    """Write `graph` to `path` with its weights as external data in one file beside it
    (`external_data_file`); returns the names of both files. `graph`'s tensors lose their data
    on the way (onnx moves it out). A data file an earlier export left there is removed first:
    onnx would append to it, and a process serving the old one keeps it (a new file, not the
    old one rewritten under the pages it maps)."""
    data = path.with_name(external_data_file(path.name))
    data.unlink(missing_ok=True)
    onnx.save(
        graph,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=_EXTERNAL_TENSOR_BYTES,
    )
    # onnx creates the data file readable by its owner only; a bundle is read by whoever serves
    # it (an image's service user), as the graph is.
    shutil.copymode(path, data)
    return [path.name, data.name]


def export_graphs(
    model: Transformer,
    directory: Path,
    opset: int,
    dtype: Dtype,
    cache: DecoderCache,
    shortlist: bool = False,
) -> list[str]:
    """encoder.onnx and decoder_step.onnx of `model` in `dtype` into `directory`, the step with
    a shortlist's inputs or without them; returns the names of the files written (with the
    graphs' external data files, `save_graph`).

    fp16 converts the traced encoder and builds the decoder step in fp16; int8 quantizes both
    fp32 graphs (export/quantize.py; a shortlist's projection, whose weights are gathered at
    every step, stays fp32). The encoder is traced into a temporary directory: for a model over
    2 GB, torch writes every weight into a file of its own beside the graph."""
    with tempfile.TemporaryDirectory() as tmp:
        traced = Path(tmp) / ENCODER_FILE
        export_encoder(model, traced, opset)
        # One graph in memory at a time (NLLB-200 3.3B's are several GB each).
        encoder = onnx.load(str(traced)) if dtype == "fp32" else convert_graph(traced, dtype)
        files = save_graph(encoder, directory / ENCODER_FILE)
        del encoder
        float_type = "fp16" if dtype == "fp16" else "fp32"
        built = (Path(tmp) if dtype == "int8" else directory) / DECODER_STEP_FILE
        step = build_decoder_step(model, float_type, cache=cache, opset=opset, shortlist=shortlist)
        written = save_graph(step, built)
        del step
        # From the file: in memory, onnx's checker refuses a graph over 2 GB.
        onnx.checker.check_model(built)
        if dtype == "int8":
            written = save_graph(convert_graph(built, dtype), directory / DECODER_STEP_FILE)
        return [*files, *written]


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


def _recorded_license(config: dict[str, Any]) -> str | None:
    """The weights' license the checkpoint records: top-level "license", else the one an
    import took from its origin (model/importers/: imported_from.license)."""
    for value in (config.get("license"), (config.get("imported_from") or {}).get("license")):
        if isinstance(value, str) and value:
            return value
    return None


def _special_ids(config: ModelConfig) -> SpecialIds:
    return SpecialIds(pad=config.pad_id, bos=config.bos_id, eos=config.eos_id, unk=config.unk_id)


def _checkpoint_tokenizer(
    checkpoint: Path, meta: dict[str, Any], config: ModelConfig
) -> Tokenization:
    """The checkpoint's tokenizer as the manifest names it, checked against the model: this
    project's tokenizer.json, or the files an import recorded in config.json (SentencePiece
    files, or a tokenizers file with its options: model/importers/)."""
    if "tokenizer" not in meta:
        tokenizer = load_tokenizer(checkpoint / TOKENIZER_FILE)
        if tokenizer.get_vocab_size() != config.vocab_size:
            raise ValueError(
                f"{checkpoint / TOKENIZER_FILE} has {tokenizer.get_vocab_size()} tokens, the "
                f"model {config.vocab_size}"
            )
        return TOKENIZER_FILE
    recorded = meta["tokenizer"]
    files: TokenizersFile | SentencePieceFiles = (
        TokenizersFile.model_validate(recorded)
        if "file" in recorded
        else SentencePieceFiles.model_validate(recorded)
    )
    vocab_sizes = (config.vocab_size, config.decoder_vocab_size)
    load_tokenizer_files(checkpoint, files, _special_ids(config), vocab_sizes)  # loads: checks
    return files


def _language(meta: dict[str, Any], key: str, path: Path) -> str:
    """The service routes requests by these codes, so a bundle without them is useless."""
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path} has no {key}")
    return value


def _shortlist_target(meta: dict[str, Any], language: str | None, bilingual: str) -> str:
    """The language a shortlist's corpus translates into: one of a multilingual model's (its
    translations into the others keep every id), a bilingual model's own."""
    if meta.get("target_tokens"):
        raise ValueError(
            "a shortlist is counted for one target language; this model picks its target by a "
            "source token (target_tokens), which the shortlist does not follow"
        )
    languages: list[str] = list(meta.get("decoder_prefixes") or {}) or [bilingual]
    if language is None and len(languages) == 1:
        return languages[0]
    if language is None or language not in languages:
        raise ValueError(
            f"--shortlist-target: name the language of the shortlist's target text, one of "
            f"the model's ({', '.join(languages[:5])}{', ...' if len(languages) > 5 else ''}); "
            f"got {language}"
        )
    return language


def default_cache(dtype: Dtype) -> DecoderCache:
    """fp16 is for GPUs, whose attention kernels read the cache without an indirection."""
    return "gather" if dtype == "fp16" else "indirection"


def export_bundle(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dtype: Dtype = "fp32",
    cache: DecoderCache | None = None,
    opset: int = DEFAULT_OPSET,
    shortlist: tuple[Path, Path] | None = None,
    shortlist_frequent: int = DEFAULT_FREQUENT,
    shortlist_per_token: int = DEFAULT_PER_TOKEN,
    shortlist_target: str | None = None,
) -> Manifest:
    """Write a complete bundle for `checkpoint` into `out` and return its manifest. `cache`
    None takes `default_cache(dtype)`: "indirection" runs on the CPU only, "gather" anywhere.
    `shortlist` (source, target text): a vocabulary shortlist counted on that corpus
    (export/shortlist.py) with its `shortlist_frequent` and `shortlist_per_token` ids; its
    target side is in `shortlist_target` (a multilingual model's language; a bilingual one's by
    default).

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
    card = CARD_FILE if (checkpoint / CARD_FILE).is_file() else None
    files = [*tokenizer_files(tokenizer), *([card] if card else [])]

    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    (out / SHORTLIST_FILE).unlink(missing_ok=True)
    cache = default_cache(dtype) if cache is None else cache
    shortlist_spec = None
    if shortlist is not None:
        target = _shortlist_target(meta, shortlist_target, target_language)
        counted = corpus_shortlist(
            checkpoint,
            tokenizer,
            _special_ids(config),
            (config.vocab_size, config.decoder_vocab_size),
            shortlist,
            frequent=shortlist_frequent,
            per_token=shortlist_per_token,
            excluded=config.suppressed_ids,
        )
        counted.save(out / SHORTLIST_FILE)
        shortlist_spec = ShortlistSpec(
            file=SHORTLIST_FILE,
            frequent=shortlist_frequent,
            per_token=shortlist_per_token,
            corpus=f"{shortlist[0].name} / {shortlist[1].name}",
            target_language=target,
        )
    graphs = export_graphs(model, out, opset, dtype, cache, shortlist is not None)
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
            suppressed_ids=config.suppressed_ids,
        ),
        special_ids=_special_ids(config),
        source_language=source_language,
        target_language=target_language,
        target_tokens=meta.get("target_tokens", {}),
        source_tokens=meta.get("source_tokens", {}),
        decoder_prefixes=meta.get("decoder_prefixes", {}),
        alignment=AlignmentSpec(
            layer=config.aligned_layer, head=config.alignment_head, aligner=config.aligner
        ),
        card=card,
        license=_recorded_license(meta),
        shortlist=shortlist_spec,
        dtype=dtype,
        decoder_cache=cache,
        opset=opset,
        tokenizer=tokenizer,
        encoder=_graph_spec(out / ENCODER_FILE, *encoder_io(n)),
        decoder_step=_graph_spec(
            out / DECODER_STEP_FILE,
            *decoder_step_io(n, cache, alignment=True, shortlist=shortlist is not None),
        ),
        files={
            name: file_entry(out / name)
            for name in (*graphs, *files, *([] if shortlist_spec is None else [SHORTLIST_FILE]))
        },
        provenance=Provenance(
            checkpoint=str(checkpoint.resolve()),
            checkpoint_sha256=sha256_file(checkpoint / WEIGHTS_FILE),
            git_commit=_git_commit(),
            bleu=_recorded_bleu(meta),
            exporter=f"torch {torch.__version__} (TorchScript exporter for the encoder; the "
            f"decoder step built by export.decoder_step), onnx {onnx.__version__}",
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
    p.add_argument(
        "--cache",
        choices=get_args(DecoderCache),
        help="how the decoder step's cache follows beams: indirection (CPU only, the default "
        "for fp32 and int8) or gather (any device; the default for fp16, for GPUs)",
    )
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    p.add_argument(
        "--shortlist",
        nargs=2,
        type=Path,
        metavar=("SRC", "TGT"),
        help="a vocabulary shortlist counted on this line-aligned text (export/shortlist.py): "
        "the decoder step scores only the ids each sentence may produce; outputs change",
    )
    p.add_argument(
        "--shortlist-frequent",
        type=int,
        default=DEFAULT_FREQUENT,
        help=f"the most frequent target ids every sentence may produce (default "
        f"{DEFAULT_FREQUENT})",
    )
    p.add_argument(
        "--shortlist-per-token",
        type=int,
        default=DEFAULT_PER_TOKEN,
        help=f"target ids per source id (default {DEFAULT_PER_TOKEN})",
    )
    p.add_argument(
        "--shortlist-target",
        metavar="LANG",
        help="the language of the shortlist's target text (a multilingual model's; its "
        "translations into other languages keep the whole vocabulary)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        manifest = export_bundle(
            args.checkpoint,
            args.out,
            dtype=args.dtype,
            cache=args.cache,
            opset=args.opset,
            shortlist=args.shortlist,
            shortlist_frequent=args.shortlist_frequent,
            shortlist_per_token=args.shortlist_per_token,
            shortlist_target=args.shortlist_target,
        )
    except (FileNotFoundError, ValueError, BundleError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    log.info("exported %s (%s) to %s in %.1f s", args.checkpoint, args.dtype, args.out, seconds)
    summary = {
        "bundle": str(args.out),
        "dtype": manifest.dtype,
        "decoder_cache": manifest.decoder_cache,
        "opset": manifest.opset,
        "seconds": round(seconds, 3),
        "bytes": {name: entry.size for name, entry in manifest.files.items()},
    }
    print(json.dumps(summary))
    return 0
