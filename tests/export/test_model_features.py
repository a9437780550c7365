"""The decoder step carries every configurable part of the model (ModelConfig's Marian fields):
for each, a random model's bundle gives torch's outputs and tokens. The parts are built the same
way for both cache variants (export/decoder_step.py), so the variants take turns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

from export.onnx_export import export_bundle
from export.parity import check_parity, encode_sources, open_bundle
from model.tokenizer import TOKENIZER_FILE
from model.transformer import (
    CONFIG_FILE,
    PAD_ID,
    ModelConfig,
    Transformer,
    load_model,
    save_model,
)
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import DECODER_STEP_FILE, TOP_K
from service.inference.engine import Engine

FAVOURED = 7  # a token the output bias makes the likeliest everywhere; suppressed below
# name: (config fields, cache variant)
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "gelu": (dict(activation="gelu"), "indirection"),
    "swish, halves, unscaled embeddings": (
        dict(activation="swish", positions="halves", scale_embedding=False),
        "gather",
    ),
    "output bias, suppressed ids": (
        dict(output_bias=True, suppressed_ids=(PAD_ID, FAVOURED)),
        "indirection",
    ),
    "suppressed ids, gather": (
        dict(output_bias=True, suppressed_ids=(PAD_ID, FAVOURED)),
        "gather",
    ),
    "renormalized suppression": (
        dict(output_bias=True, suppressed_ids=(PAD_ID, FAVOURED), renormalize_suppressed=True),
        "gather",
    ),
    "aligner": (dict(aligner=True, alignment_layer=1), "indirection"),
    "aligner with a hidden layer": (
        dict(aligner=True, alignment_layer=1, aligner_hidden=16),
        "gather",
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_model_variant_exports_with_parity(
    variant: str, eos_checkpoint: Path, val_src: list[str], tmp_path: Path
) -> None:
    fields, cache = VARIANTS[variant]
    checkpoint, bundle = tmp_path / "checkpoint", tmp_path / "bundle"
    model = _variant(eos_checkpoint, fields, checkpoint)
    export_bundle(checkpoint, bundle, cache=cache)  # type: ignore[arg-type]
    ort_bundle = open_bundle(bundle)
    sources, _ = encode_sources(ort_bundle, val_src[:10])
    report = check_parity(model, ort_bundle, sources, batch_size=5)
    assert report.ok, report.failures
    assert report.tokens_equal
    if cache == "gather":
        _check_top_k_read_by_top_k_only(bundle)

    if model.config.aligner:
        _check_read_alignment(model, bundle, sources)
    if not model.config.suppressed_ids:
        return
    assert ort_bundle.bundle.manifest.model.suppressed_ids == model.config.suppressed_ids
    engine = Engine.load(bundle, device="cpu", intra_op_threads=1)
    for beam_size in (1, 4):
        options = DecodingOptions(beam_size=beam_size, num_hypotheses=min(beam_size, 2))
        tokens = [h.ids for hypotheses in engine.generate(sources, options) for h in hypotheses]
        assert all(ids for ids in tokens)
        assert not any(set(model.config.suppressed_ids) & set(ids) for ids in tokens)


def _check_top_k_read_by_top_k_only(bundle: Path) -> None:
    """The graph CUDA runs reads top_k only as TopK's k, which ONNX Runtime's CUDA kernel takes
    from the host. Arithmetic on it (k + s suppressed ids) was placed on the GPU and copied back
    for TopK: two Memcpy nodes a step, and no CUDA graph capture (seen on an H100)."""
    step = onnx.load(bundle / DECODER_STEP_FILE, load_external_data=False)
    readers = [(n.op_type, list(n.input).index(TOP_K)) for n in step.graph.node if TOP_K in n.input]
    assert readers and all(reader == ("TopK", 1) for reader in readers), readers


def _check_read_alignment(model: Transformer, bundle: Path, sources: list[list[int]]) -> None:
    """An aligner's row aligns the token a step reads: the engine gives token t the row of the
    step after the one that picked it, which is torch's teacher-forced row t + 1."""
    engine = Engine.load(bundle, device="cpu", intra_op_threads=1)
    for beam_size in (1, 4):
        options = DecodingOptions(beam_size=beam_size, num_hypotheses=1, alignments=True)
        for source, [best] in zip(sources, engine.generate(sources, options), strict=True):
            assert best.alignment is not None
            assert best.alignment.shape == (len(best.ids), len(source))
            # Cut by the length limit, the last token was never read: no row, no link.
            read = len(best.ids) - (best.finish_reason == "length")
            src = torch.tensor([source])
            tgt_in = torch.tensor([[model.config.bos_id, *best.ids[:read]]])
            with torch.no_grad():
                _, expected = model.forward_aligned(src, tgt_in)  # (1, read + 1, S)
            rows = torch.from_numpy(best.alignment)
            assert torch.allclose(rows[:read], expected[0, 1 : read + 1], atol=1e-4)
            assert not rows[read:].any()


def _variant(eos_checkpoint: Path, fields: dict[str, Any], out: Path) -> Transformer:
    """The eos checkpoint's weights (searches end at varied lengths) under a config with
    `fields`, and a random output bias that favours FAVOURED, saved to `out`."""
    meta = json.loads((eos_checkpoint / CONFIG_FILE).read_text())
    config = ModelConfig.from_dict({**meta.pop("model"), **fields})
    model = Transformer(config).eval()
    model.load_state_dict(load_model(eos_checkpoint).state_dict(), strict=False)
    if model.output_bias is not None:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            model.output_bias.copy_(torch.randn(config.vocab_size, generator=generator))
            model.output_bias[FAVOURED] = 30.0
    save_model(model, out, meta)
    shutil.copyfile(eos_checkpoint / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return model
