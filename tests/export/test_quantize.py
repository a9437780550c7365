"""export/quantize.py: int8 and fp16 bundles load, decode close to fp32, and report BLEU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from export.parity import OrtStepper, encode_sources, open_bundle, ort_generate
from export.quantize import main
from model.data import pad
from model.transformer import BOS_ID
from service.bundle import LOG_PROBS, MEMORY, TOP_LOG_PROBS, cross_key, past_key, present_key


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "atol"),
    # Measured on the tiny model: int8 ~0.11, fp16 ~0.006 max abs diff on first-step log-probs.
    [("int8", "float32", 0.5), ("fp16", "float16", 0.05)],
)
def test_reduced_bundle_decodes_close_to_fp32(
    dtype: str,
    cache_dtype: str,
    atol: float,
    fp32_bundle: Path,
    val_src: list[str],
    request: pytest.FixtureRequest,
) -> None:
    reduced = open_bundle(request.getfixturevalue(f"{dtype}_bundle"))
    fp32 = open_bundle(fp32_bundle)
    manifest = reduced.bundle.manifest
    assert manifest.dtype == dtype
    step = manifest.decoder_step
    assert step.tensor(past_key(0)).dtype == cache_dtype
    assert step.tensor(present_key(0)).dtype == cache_dtype
    assert manifest.encoder.tensor(cross_key(0)).dtype == cache_dtype
    assert step.tensor(LOG_PROBS).dtype == "float32"  # scores keep full precision
    assert step.tensor(TOP_LOG_PROBS).dtype == "float32"

    sources, _ = encode_sources(reduced, val_src)
    src = pad(sources[:6]).numpy()
    mask = (src != 0).astype(np.int64)
    log_probs = {}
    for name, ort_bundle in (("reduced", reduced), ("fp32", fp32)):
        encoded = ort_bundle.encode(src, mask)
        stepper = OrtStepper(ort_bundle, encoded, mask, max_decoding_length=1)
        log_probs[name] = stepper.step(torch.full((len(src),), BOS_ID)).numpy()
    assert reduced.encode(src, mask)[MEMORY].dtype == np.dtype(cache_dtype)
    np.testing.assert_allclose(log_probs["reduced"], log_probs["fp32"], rtol=0, atol=atol)
    # Not rounded through float16 on the way out (the fp16 converter's own output casts did).
    rounded = log_probs["reduced"].astype(np.float16).astype(np.float32)
    assert (rounded != log_probs["reduced"]).mean() > 0.5

    hyps = ort_generate(reduced, sources, beam_size=4)
    assert len(hyps) == len(sources)
    vocab = manifest.model.vocab_size
    assert all(0 <= t < vocab for h in hyps for t in h[0].tokens)
    assert all(math.isfinite(h[0].score) for h in hyps)


def test_int8_graphs_are_smaller(int8_bundle: Path, fp32_bundle: Path) -> None:
    int8, fp32 = (open_bundle(b).bundle.manifest.files for b in (int8_bundle, fp32_bundle))
    for file in ("encoder.onnx", "decoder_step.onnx"):
        assert int8[file].size < fp32[file].size


def test_cli_reports_bleu_delta_and_sizes(
    int8_bundle: Path, fp32_bundle: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--bundle", str(int8_bundle), "--reference", str(fp32_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--ref", str(multi30k / "val.de.gz")]
    assert main([*argv, "--n", "10", "--beam-size", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["dtype"] == "int8"
    assert result["bleu_delta"] == pytest.approx(result["bleu"] - result["bleu_fp32"], abs=0.02)
    assert 0.0 <= result["identical_fraction"] <= 1.0
    assert result["graph_bytes"] < result["graph_bytes_fp32"]
    assert result["n_sentences"] + result["skipped_too_long"] == 10


def test_cli_compared_with_itself_is_identical(
    fp32_bundle: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--bundle", str(fp32_bundle), "--reference", str(fp32_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--ref", str(multi30k / "val.de.gz")]
    assert main([*argv, "--n", "5", "--beam-size", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bleu_delta"] == 0.0
    assert result["identical_fraction"] == 1.0


def test_cli_refuses_a_reduced_reference(
    int8_bundle: Path, fp16_bundle: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--bundle", str(int8_bundle), "--reference", str(fp16_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--ref", str(multi30k / "val.de.gz")]
    assert main(argv) == 2
    assert "is fp16, not fp32" in capsys.readouterr().err
