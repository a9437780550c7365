"""export/parity.py: ONNX Runtime matches torch output for output and token for token."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from export.onnx_export import export_bundle
from export.parity import (
    TOLERANCE,
    OrtBundle,
    OrtStepper,
    check_parity,
    encode_sources,
    main,
    open_bundle,
)
from model.data import pad
from model.search import generate
from model.transformer import BOS_ID, DecoderCache, Transformer, load_model, padding_mask
from service.bundle.manifest import (
    ALIGNMENT_WANTED,
    CACHE_INDIRECTION,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOG_PROBS,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    SELF_ATTENTION_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    cross_names,
    past_key,
    past_names,
)
from tests.conftest import REPO
from tests.export.helpers import run_step


def _sources(ort_bundle: OrtBundle, lines: list[str]) -> list[list[int]]:
    sources, _ = encode_sources(ort_bundle, lines)
    return sources


@pytest.mark.parametrize(
    ("bundle_name", "checkpoint_name"),
    [
        ("fp32_bundle", "tiny_checkpoint"),
        ("eos_bundle", "eos_checkpoint"),
        ("eos_gather_bundle", "eos_checkpoint"),
    ],
)
def test_parity_on_real_sentences(
    bundle_name: str, checkpoint_name: str, val_src: list[str], request: pytest.FixtureRequest
) -> None:
    ort_bundle = open_bundle(request.getfixturevalue(bundle_name))
    model = load_model(request.getfixturevalue(checkpoint_name))
    sources = _sources(ort_bundle, val_src)
    assert len(sources) >= 15  # only a few val sentences exceed the tiny max_positions

    report = check_parity(model, ort_bundle, sources)

    assert report.ok, report.failures
    assert report.tokens_equal
    assert report.max_abs_diff <= TOLERANCE
    assert set(report.max_abs_diff_by_tensor) == {
        *ort_bundle.bundle.manifest.encoder.output_names,
        *ort_bundle.bundle.manifest.decoder_step.output_names,
    }


def test_eos_bundle_exercises_finished_rows(
    eos_checkpoint: Path, eos_bundle: Path, val_src: list[str]
) -> None:
    """Parity on eos_bundle covers rows leaving a live batch only if searches stop at
    different steps; with random weights (fp32_bundle) they all run to max_positions."""
    sources = _sources(open_bundle(eos_bundle), val_src)
    model = load_model(eos_checkpoint)
    for beam_size in (1, 4):
        hyps = [h[0] for h in generate(model, sources, beam_size=beam_size)]
        assert len({len(h.ids) for h in hyps if h.finish_reason == "eos"}) > 1


def _step_inputs(
    model: Transformer, sentences: int, group: int, source: int, past: int
) -> tuple[torch.Tensor, torch.Tensor, DecoderCache]:
    """A padded source, `group` rows per sentence, each with one token and a random past of
    the given length."""
    config = model.config
    generator = torch.Generator().manual_seed(sentences * 1000 + group * 100 + source * 10 + past)
    src = torch.randint(4, config.vocab_size, (sentences, source), generator=generator)
    src[-1, (source + 1) // 2 :] = 0  # padding in the last sentence
    cross = model.init_cache(model.encode(src, padding_mask(src)))
    rows = sentences * group
    shape = (rows, config.h, past, config.d_k)  # (B, H, T, Dh)
    n = config.n_decoder_layers
    self_k = [torch.randn(shape, generator=generator) for _ in range(n)]
    self_v = [torch.randn(shape, generator=generator) for _ in range(n)]
    tokens = torch.randint(4, config.vocab_size, (rows,), generator=generator)
    return src, tokens, DecoderCache(self_k, self_v, cross.cross_k, cross.cross_v)


def _flat(keys: list[torch.Tensor], values: list[torch.Tensor]) -> list[np.ndarray]:
    return [t.numpy() for pair in zip(keys, values, strict=True) for t in pair]


@pytest.mark.parametrize(
    ("sentences", "group", "source", "past"),
    [(1, 1, 1, 0), (3, 1, 7, 0), (3, 2, 7, 5), (1, 4, 9, 1), (4, 5, 2, 11), (2, 1, 5, 3)],
)
@torch.inference_mode()
def test_decoder_step_for_any_shape(
    fp32_bundle: Path, tiny_checkpoint: Path, sentences: int, group: int, source: int, past: int
) -> None:
    """No shape is baked into the built graph, `group` rows per sentence read that sentence's
    cross keys/values, and the key/value each row writes at position `past` is torch's."""
    ort_bundle = open_bundle(fp32_bundle)
    model = load_model(tiny_checkpoint)
    n = model.config.n_decoder_layers
    src, tokens, cache = _step_inputs(model, sentences, group, source, past)
    batch = sentences * group
    expected, grown = model.decode_step(tokens, cache, padding_mask(src))
    # Against attention over one copy of the sentence's keys/values per row (group 1).
    copies = cache.select(torch.arange(batch), torch.arange(batch) // group)
    per_row, _ = model.decode_step(tokens, copies, padding_mask(src).repeat_interleave(group, 0))
    assert (expected - per_row).abs().max().item() < 1e-5

    capacity = past + 3  # positions after the step's are never read
    buffers = {}
    for name, value in zip(past_names(n), _flat(cache.self_k, cache.self_v), strict=True):
        buffers[name] = np.zeros((batch, value.shape[1], capacity, value.shape[3]), np.float32)
        buffers[name][:] = 1e3  # garbage that would show if read
        buffers[name][:, :, :past] = value
    feeds = {
        INPUT_IDS: tokens.reshape(sentences, group).numpy(),
        POSITION: np.full(batch, past, dtype=np.int64),
        PAST_SEQUENCE_LENGTH: np.array([past], dtype=np.int32),
        SELF_ATTENTION_MASK: np.ones((batch, past + 1), dtype=np.int32),
        ENCODER_ATTENTION_MASK: (src != 0).int().numpy(),
        CACHE_INDIRECTION: np.ascontiguousarray(
            np.broadcast_to(
                np.arange(group, dtype=np.int32)[None, :, None], (sentences, group, capacity)
            )
        ),
        TOP_K: np.array([3], dtype=np.int64),
        ALIGNMENT_WANTED: np.array([True]),
        **dict(zip(cross_names(n), _flat(cache.cross_k, cache.cross_v), strict=True)),
    }
    out = run_step(ort_bundle.decoder_step, feeds, buffers, n)
    assert out[TOP_LOG_PROBS].shape == (batch, 3)
    assert out[LOG_PROBS].shape == (batch, model.config.vocab_size)
    np.testing.assert_allclose(out[LOG_PROBS], expected.numpy(), rtol=0, atol=TOLERANCE)
    for name, wanted in zip(past_names(n), _flat(grown.self_k, grown.self_v), strict=True):
        np.testing.assert_allclose(buffers[name][:, :, : past + 1], wanted, rtol=0, atol=TOLERANCE)


@torch.inference_mode()
def test_first_step_with_an_empty_cache(fp32_bundle: Path, tiny_checkpoint: Path) -> None:
    ort_bundle = open_bundle(fp32_bundle)
    model = load_model(tiny_checkpoint)
    src = pad([[5, 6, 7, 8, 2], [9, 10, 2]])  # (2, 5), padded
    mask = (src != 0).long().numpy()
    encoded = ort_bundle.encode(src.numpy(), mask)
    stepper = OrtStepper(ort_bundle, encoded, mask, max_decoding_length=4)
    assert stepper.state.cache(past_key(0)).shape == (2, model.config.h, 0, model.config.d_k)

    tokens = torch.full((2,), BOS_ID)
    actual = stepper.step(tokens)
    memory = model.encode(src, padding_mask(src))
    expected, cache = model.decode_step(tokens, model.init_cache(memory), padding_mask(src))
    assert torch.allclose(actual, expected, rtol=0, atol=TOLERANCE)
    written = torch.from_numpy(stepper.state.cache(past_key(0)))
    assert torch.allclose(written, cache.self_k[0], rtol=0, atol=TOLERANCE)


def test_parity_catches_a_different_model(
    fp32_bundle: Path, tiny_checkpoint: Path, val_src: list[str]
) -> None:
    """The check must be able to fail, and it collects every failure instead of stopping."""
    ort_bundle = open_bundle(fp32_bundle)
    model = load_model(tiny_checkpoint)
    with torch.no_grad():
        model.decoder_layers[0].feed_forward.w_1.bias += 0.05  # the decoder only
    report = check_parity(model, ort_bundle, _sources(ort_bundle, val_src)[:6])

    assert not report.ok
    assert report.max_abs_diff_by_tensor["memory"] <= TOLERANCE  # the encoder still agrees
    assert report.max_abs_diff_by_tensor[LOG_PROBS] > TOLERANCE
    assert any(f.startswith("decoder_step 0 (past length 0): log_probs") for f in report.failures)
    assert any(f.startswith("decoder_step 3 ") for f in report.failures)


def test_cli_prints_a_json_summary(
    fp32_bundle: Path, tiny_checkpoint: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--checkpoint", str(tiny_checkpoint), "--bundle", str(fp32_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--n", "8"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] is True
    assert summary["tokens_equal"] is True
    assert summary["max_abs_diff"] <= TOLERANCE
    assert summary["failures"] == []


def test_cli_fails_for_another_checkpoint(
    fp32_bundle: Path, eos_checkpoint: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--checkpoint", str(eos_checkpoint), "--bundle", str(fp32_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--n", "4"]
    assert main(argv) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] is False
    assert any("exported from other weights" in f for f in summary["failures"])


def test_cli_refuses_reduced_precision(
    int8_bundle: Path, tiny_checkpoint: Path, multi30k: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--checkpoint", str(tiny_checkpoint), "--bundle", str(int8_bundle)]
    argv += ["--src", str(multi30k / "val.en.gz"), "--n", "4"]
    assert main(argv) == 2
    assert "python -m export.quantize" in capsys.readouterr().err


@pytest.mark.parametrize("cache", ["indirection", "gather"])
def test_the_shipped_model_gives_torchs_tokens_on_val(
    cache: str, multi30k: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The decoder step built for the shipped weights, driven by the service's cache handling,
    gives torch's greedy and beam-4 tokens on real sentences, with either cache."""
    checkpoint = REPO / "checkpoints" / "multi30k-en-de"
    export_bundle(checkpoint, tmp_path / "bundle", cache=cache)
    argv = ["--checkpoint", str(checkpoint), "--bundle", str(tmp_path / "bundle")]
    argv += ["--src", str(multi30k / "val.en.gz"), "--n", "24", "--threads", "2"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tokens_equal"] is True
    assert summary["max_abs_diff"] <= TOLERANCE
