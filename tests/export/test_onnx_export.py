"""export/onnx_export.py: what the manifest records, determinism, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export.onnx_export import export_bundle, export_graphs, main
from model.transformer import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ModelConfig,
    load_model,
)
from service.bundle import (
    CACHE_INDEX,
    DECODER_STEP_FILE,
    ENCODER_ATTENTION_MASK,
    ENCODER_FILE,
    INPUT_IDS,
    LOG_PROBS,
    MANIFEST_FILE,
    TOKENIZER_FILE,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    Dtype,
    cross_names,
    cross_value,
    load_bundle,
    past_key,
    past_names,
    present_key,
    present_value,
    sha256_file,
)


def _config(checkpoint: Path) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((checkpoint / CONFIG_FILE).read_text())["model"])


def test_manifest_describes_the_checkpoint(fp32_bundle: Path, tiny_checkpoint: Path) -> None:
    manifest = load_bundle(fp32_bundle).manifest
    config = _config(tiny_checkpoint)
    dims = manifest.model
    assert (dims.encoder_layers, dims.decoder_layers) == (
        config.n_encoder_layers,
        config.n_decoder_layers,
    )
    assert (dims.heads, dims.d_model, dims.d_head) == (config.h, config.d_model, config.d_k)
    assert (dims.vocab_size, dims.max_positions) == (config.vocab_size, config.max_positions)
    assert manifest.special_ids.model_dump() == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert (manifest.source_language, manifest.target_language) == ("en", "de")
    assert (manifest.dtype, manifest.opset) == ("fp32", 17)
    assert set(manifest.files) == {ENCODER_FILE, DECODER_STEP_FILE, TOKENIZER_FILE}
    assert (fp32_bundle / TOKENIZER_FILE).read_bytes() == (
        tiny_checkpoint / TOKENIZER_FILE
    ).read_bytes()
    provenance = manifest.provenance
    assert provenance.checkpoint == str(tiny_checkpoint.resolve())
    assert provenance.checkpoint_sha256 == sha256_file(tiny_checkpoint / WEIGHTS_FILE)
    assert provenance.bleu is None  # the tiny checkpoint records none
    commit = provenance.git_commit
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)
    # Fields added for imported Marian models stay out of this model's manifest, which reads
    # as it did before them.
    raw = json.loads((fp32_bundle / MANIFEST_FILE).read_text())
    assert "target_tokens" not in raw and "target_vocab_size" not in raw["model"]


def test_batch_source_and_past_axes_are_dynamic(fp32_bundle: Path) -> None:
    manifest = load_bundle(fp32_bundle).manifest
    h, dh, v = manifest.model.heads, manifest.model.d_head, manifest.model.vocab_size
    encoder, step = manifest.encoder, manifest.decoder_step
    assert encoder.inputs[0].shape == ["sentences", "source_length"]
    assert encoder.outputs[1].shape == ["sentences", h, "source_length", dh]
    assert step.inputs[0].shape == ["batch", 1]
    # One mask and cross key/value row per sentence, shared by its rows (beams).
    assert step.tensor(ENCODER_ATTENTION_MASK).shape == ["sentences", "source_length"]
    assert step.tensor(cross_value(1)).shape == ["sentences", h, "source_length", dh]
    # The past has its own row count: the graph gathers the batch's rows from it.
    assert step.tensor(past_key(0)).shape == ["past_batch", h, "past_length", dh]
    assert step.tensor(CACHE_INDEX).shape == ["batch"]
    assert step.tensor(present_value(1)).shape == ["batch", h, "present_length", dh]
    assert step.tensor(LOG_PROBS).shape == ["batch", v]
    assert step.tensor(LOG_PROBS).dtype == "float32"
    assert step.tensor(TOP_LOG_PROBS).shape == ["batch", "top_k"]
    assert step.tensor(TOP_IDS).dtype == "int64"


def test_decoder_step_gathers_its_past_and_returns_the_top_k(fp32_bundle: Path) -> None:
    """cache_index [2, 0] over a 3-row past gives what the host-side gather past[[2, 0]] gives;
    top_k candidates are log_probs' best, best first."""
    manifest = load_bundle(fp32_bundle).manifest
    dims, n = manifest.model, manifest.model.decoder_layers
    session = ort.InferenceSession(str(fp32_bundle / DECODER_STEP_FILE))
    rng = np.random.default_rng(0)
    past = {
        name: rng.normal(size=(3, dims.heads, 2, dims.d_head)).astype(np.float32)
        for name in past_names(n)
    }
    cross = {
        name: rng.normal(size=(2, dims.heads, 4, dims.d_head)).astype(np.float32)
        for name in cross_names(n)
    }
    common = {
        INPUT_IDS: np.array([[5], [9]], dtype=np.int64),
        ENCODER_ATTENTION_MASK: np.ones((2, 4), dtype=np.int64),
        **cross,
    }
    rows = np.array([2, 0], dtype=np.int64)
    names = [o.name for o in session.get_outputs()]
    gathered = session.run(None, {**common, CACHE_INDEX: rows, TOP_K: np.array([5]), **past})
    on_host = session.run(
        None,
        {
            **common,
            CACHE_INDEX: np.arange(2, dtype=np.int64),
            TOP_K: np.array([5]),
            **{name: value[rows] for name, value in past.items()},
        },
    )
    for name, a, b in zip(names, gathered, on_host, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    out = dict(zip(names, gathered, strict=True))
    order = np.argsort(-out[LOG_PROBS], axis=-1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out[TOP_IDS], order)
    np.testing.assert_array_equal(
        out[TOP_LOG_PROBS], np.take_along_axis(out[LOG_PROBS], order, axis=-1)
    )
    # The present is the gathered past plus this step's position.
    np.testing.assert_array_equal(out[present_key(0)][:, :, :2], past[past_key(0)][rows])


@pytest.mark.parametrize("dtype", ["fp32", "int8", "fp16"])
def test_export_is_deterministic(
    dtype: Dtype, tiny_checkpoint: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    first: Path = request.getfixturevalue(f"{dtype}_bundle")
    again = export_bundle(tiny_checkpoint, tmp_path, dtype=dtype)
    assert again.files == load_bundle(first).manifest.files
    # Nothing run-specific (time, output path) goes into the manifest either.
    assert (tmp_path / MANIFEST_FILE).read_text() == (first / MANIFEST_FILE).read_text()


def test_recorded_bleu_goes_into_provenance(tiny_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))
    config = json.loads((checkpoint / CONFIG_FILE).read_text())
    config["valid_after_averaging"] = {"nll": 2.0, "bleu": 37.5}
    (checkpoint / CONFIG_FILE).write_text(json.dumps(config))
    manifest = export_bundle(checkpoint, tmp_path / "bundle")
    assert manifest.provenance.bleu == 37.5


def test_export_leaves_the_model_in_eval_mode(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # torch.onnx.export restores the wrapper's (training) mode, and with it the model's.
    model = load_model(tiny_checkpoint)
    export_graphs(model, tmp_path, opset=17)
    assert not any(module.training for module in model.modules())


def test_cli_writes_a_loadable_bundle(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main(["--checkpoint", str(tiny_checkpoint), "--out", str(out), "--opset", "18"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["dtype"] == "fp32"
    assert load_bundle(out).manifest.opset == 18


def test_cli_reports_a_missing_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "b")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "b" / MANIFEST_FILE).exists()


def test_checkpoint_without_languages_is_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))
    config = json.loads((checkpoint / CONFIG_FILE).read_text())
    del config["target_language"]
    (checkpoint / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no target_language"):
        export_bundle(checkpoint, tmp_path / "bundle")
