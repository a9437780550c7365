"""export/onnx_export.py: what the manifest records, determinism, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export.onnx_export import export_bundle, export_graphs, main
from model.transformer import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ModelConfig,
    load_model,
)
from service.bundle.manifest import (
    ALIGNMENT_WANTED,
    BEAM_ROWS,
    CACHE_INDIRECTION,
    CARD_FILE,
    DECODER_STEP_FILE,
    ENCODER_ATTENTION_MASK,
    ENCODER_FILE,
    INPUT_IDS,
    LOG_PROBS,
    MANIFEST_FILE,
    PAST_SEQUENCE_LENGTH,
    POSITION,
    SELF_ATTENTION_MASK,
    TOKENIZER_FILE,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    Dtype,
    cross_names,
    cross_value,
    external_data_file,
    load_bundle,
    past_key,
    past_names,
    present_value,
    sha256_file,
)
from tests.export.helpers import run_step


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
    graphs = (ENCODER_FILE, DECODER_STEP_FILE)
    assert set(manifest.files) == {*graphs, *map(external_data_file, graphs), TOKENIZER_FILE}
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
    # Nor do a card and a license that the checkpoint does not have.
    assert "card" not in raw and "license" not in raw


def test_sentence_beam_source_and_capacity_axes_are_dynamic(fp32_bundle: Path) -> None:
    manifest = load_bundle(fp32_bundle).manifest
    h, dh, v = manifest.model.heads, manifest.model.d_head, manifest.model.vocab_size
    encoder, step = manifest.encoder, manifest.decoder_step
    assert encoder.inputs[0].shape == ["sentences", "source_length"]
    assert encoder.outputs[1].shape == ["sentences", h, "source_length", dh]
    assert step.inputs[0].shape == ["sentences", "beams"]
    # One mask and cross key/value row per sentence, shared by its rows (beams).
    assert step.tensor(ENCODER_ATTENTION_MASK).shape == ["sentences", "source_length"]
    assert step.tensor(ENCODER_ATTENTION_MASK).dtype == "int32"
    assert step.tensor(cross_value(1)).shape == ["sentences", h, "source_length", dh]
    # A static cache: the same shape in and out, indexed through the indirection.
    assert step.tensor(past_key(0)).shape == ["rows", h, "capacity", dh]
    assert step.tensor(present_value(1)).shape == ["rows", h, "capacity", dh]
    assert step.tensor(CACHE_INDIRECTION).shape == ["sentences", "beams", "capacity"]
    assert step.tensor(POSITION).shape == ["rows"]
    assert step.tensor(PAST_SEQUENCE_LENGTH).shape == [1]  # read on the host
    assert step.tensor(SELF_ATTENTION_MASK).shape == ["rows", "attended"]
    assert step.tensor(LOG_PROBS).shape == ["rows", v]
    assert step.tensor(LOG_PROBS).dtype == "float32"
    assert step.tensor(TOP_LOG_PROBS).shape == ["rows", "top_k"]
    assert step.tensor(TOP_IDS).dtype == "int64"


def test_decoder_step_writes_in_place_and_reads_through_the_indirection(
    fp32_bundle: Path,
) -> None:
    """Beams whose indirection names another beam's row see what they would see with that
    row's keys/values copied into their own; the step writes position T of each row and nothing
    else; top_k candidates are log_probs' best, best first."""
    manifest = load_bundle(fp32_bundle).manifest
    dims, n = manifest.model, manifest.model.decoder_layers
    session = ort.InferenceSession(str(fp32_bundle / DECODER_STEP_FILE))
    rng = np.random.default_rng(0)
    sentences, beams, capacity, t = 2, 3, 6, 4
    shape = (sentences * beams, dims.heads, capacity, dims.d_head)  # (R, H, C, Dh)
    cache = {name: rng.normal(size=shape).astype(np.float32) for name in past_names(n)}
    feeds = {
        INPUT_IDS: np.array([[5, 9, 7], [11, 5, 8]], dtype=np.int64),  # (N, G)
        POSITION: np.full(sentences * beams, t, dtype=np.int64),
        PAST_SEQUENCE_LENGTH: np.array([t], dtype=np.int32),
        SELF_ATTENTION_MASK: np.ones((sentences * beams, t + 1), dtype=np.int32),
        ENCODER_ATTENTION_MASK: np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.int32),
        TOP_K: np.array([5], dtype=np.int64),
        ALIGNMENT_WANTED: np.array([True]),
        **{
            name: rng.normal(size=(sentences, dims.heads, 4, dims.d_head)).astype(np.float32)
            for name in cross_names(n)
        },
    }
    # Beam 0 of sentence 0 reads positions 1 and 3 from beam 2's row; the others their own.
    indirection = np.broadcast_to(np.arange(beams)[None, :, None], (sentences, beams, capacity))
    indirection = np.ascontiguousarray(indirection, dtype=np.int32)
    indirection[0, 0, [1, 3]] = 2
    through = {name: value.copy() for name, value in cache.items()}
    out = run_step(session, {**feeds, CACHE_INDIRECTION: indirection}, through, n)
    copied = {name: value.copy() for name, value in cache.items()}
    for value in copied.values():
        value[0, :, [1, 3]] = value[2, :, [1, 3]]
    own = np.ascontiguousarray(np.broadcast_to(np.arange(beams)[None, :, None], indirection.shape))
    expected = run_step(session, {**feeds, CACHE_INDIRECTION: own.astype(np.int32)}, copied, n)
    for name in out:
        np.testing.assert_allclose(out[name], expected[name], atol=1e-5, err_msg=name)
    for name, value in through.items():
        unchanged = [p for p in range(capacity) if p != t]
        np.testing.assert_array_equal(value[:, :, unchanged], cache[name][:, :, unchanged])
        assert not np.array_equal(value[:, :, t], cache[name][:, :, t]), name
    order = np.argsort(-out[LOG_PROBS], axis=-1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out[TOP_IDS], order)
    np.testing.assert_array_equal(
        out[TOP_LOG_PROBS], np.take_along_axis(out[LOG_PROBS], order, axis=-1)
    )


def test_a_row_that_joined_later_attends_to_its_own_positions_only(fp32_bundle: Path) -> None:
    """Step-level batching's clock: a row that joined the batch at cache position s, masked
    before s (self_attention_mask) at position T - s, computes what it computes alone with its
    positions s .. T - 1 at 0 .. T - s - 1, whatever the positions before s hold."""
    manifest = load_bundle(fp32_bundle).manifest
    dims, n = manifest.model, manifest.model.decoder_layers
    session = ort.InferenceSession(str(fp32_bundle / DECODER_STEP_FILE))
    rng = np.random.default_rng(2)
    capacity, t, s = 8, 6, 4
    shape = (1, dims.heads, capacity, dims.d_head)
    cache = {name: rng.normal(size=shape).astype(np.float32) for name in past_names(n)}
    common = {
        INPUT_IDS: np.array([[7]], dtype=np.int64),
        POSITION: np.array([t - s], dtype=np.int64),
        ENCODER_ATTENTION_MASK: np.array([[1, 1, 1]], dtype=np.int32),
        CACHE_INDIRECTION: np.zeros((1, 1, capacity), dtype=np.int32),
        TOP_K: np.array([4], dtype=np.int64),
        ALIGNMENT_WANTED: np.array([True]),
        **{
            name: rng.normal(size=(1, dims.heads, 3, dims.d_head)).astype(np.float32)
            for name in cross_names(n)
        },
    }
    joined = {name: value.copy() for name, value in cache.items()}
    mask = (np.arange(t + 1) >= s).astype(np.int32)[None, :]
    late = run_step(
        session,
        {**common, PAST_SEQUENCE_LENGTH: np.array([t], np.int32), SELF_ATTENTION_MASK: mask},
        joined,
        n,
    )
    alone = {name: np.zeros_like(value) for name, value in cache.items()}
    for name, value in alone.items():
        value[:, :, : t - s] = cache[name][:, :, s:t]
    expected = run_step(
        session,
        {
            **common,
            PAST_SEQUENCE_LENGTH: np.array([t - s], np.int32),
            SELF_ATTENTION_MASK: np.ones((1, t - s + 1), np.int32),
        },
        alone,
        n,
    )
    for name in late:
        np.testing.assert_allclose(late[name][:, :4], expected[name][:, :4], atol=1e-5)
    for name in cache:  # the same key/value written, at T and at T - s
        np.testing.assert_allclose(joined[name][:, :, t], alone[name][:, :, t - s], atol=1e-6)


def test_the_gather_step_reorders_by_beam_rows_and_masks_later_positions(
    gather_bundle: Path,
) -> None:
    """beam_rows gives what the rows copied on the host would give; the step writes position T
    of each row (over its gathered past) and nothing else; positions after T, whatever finite
    values they hold, change nothing."""
    manifest = load_bundle(gather_bundle).manifest
    assert manifest.decoder_cache == "gather"
    dims, n = manifest.model, manifest.model.decoder_layers
    session = ort.InferenceSession(str(gather_bundle / DECODER_STEP_FILE))
    rng = np.random.default_rng(1)
    sentences, beams, capacity, t = 2, 2, 6, 3
    rows = sentences * beams
    cache = {
        name: rng.normal(size=(rows, dims.heads, capacity, dims.d_head)).astype(np.float32)
        for name in past_names(n)
    }
    feeds = {
        INPUT_IDS: np.array([[5, 9], [11, 5]], dtype=np.int64),
        POSITION: np.full(rows, t, dtype=np.int64),
        ENCODER_ATTENTION_MASK: np.array([[1, 1, 1], [1, 1, 0]], dtype=np.int32),
        TOP_K: np.array([4], dtype=np.int64),
        **{
            name: rng.normal(size=(sentences, dims.heads, 3, dims.d_head)).astype(np.float32)
            for name in cross_names(n)
        },
    }
    beam_rows = np.array([1, 1, 2, 3], dtype=np.int64)  # sentence 0's beams both continue beam 1
    gathered = {name: value.copy() for name, value in cache.items()}
    out = run_step(session, {**feeds, BEAM_ROWS: beam_rows}, gathered, n)
    on_host = {name: value[beam_rows].copy() for name, value in cache.items()}
    for value in on_host.values():
        value[:, :, t + 1 :] = 1e3  # masked: never attended
    expected = run_step(session, {**feeds, BEAM_ROWS: np.arange(rows)}, on_host, n)
    for name in out:
        np.testing.assert_allclose(out[name], expected[name], atol=1e-5, err_msg=name)
    for name, value in gathered.items():
        np.testing.assert_array_equal(value[:, :, :t], cache[name][beam_rows, :, :t])
        np.testing.assert_array_equal(value[:, :, t], on_host[name][:, :, t])
        np.testing.assert_array_equal(value[:, :, t + 1 :], cache[name][beam_rows, :, t + 1 :])


def test_the_gather_step_scatters_each_new_key_and_value_straight_from_its_projection(
    gather_bundle: Path,
) -> None:
    """The key and value a step writes into the cache are the projection's, split and reshaped
    to (rows, heads, 1, d_head) by one Reshape each: no Transpose between (a kernel a layer more
    on CUDA, issue 58). The step's results are held to torch's by tests/export/test_parity.py."""
    layers = load_bundle(gather_bundle).manifest.model.decoder_layers
    graph = onnx.load(str(gather_bundle / DECODER_STEP_FILE), load_external_data=False).graph
    producer = {output: node for node in graph.node for output in node.output}
    scatters = [node for node in graph.node if node.op_type == "TensorScatter"]
    assert len(scatters) == 2 * layers
    for scatter in scatters:
        reshape = producer[scatter.input[1]]
        assert reshape.op_type == "Reshape", reshape.op_type
        assert producer[reshape.input[0]].op_type == "Split"


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


@pytest.mark.parametrize(
    "recorded",
    [{"license": "CC-BY-4.0"}, {"imported_from": {"license": "CC-BY-4.0"}}],
    ids=["license", "an import's license"],
)
def test_the_model_card_and_license_go_into_the_bundle(
    recorded: dict[str, object], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """What /status shows of a model comes from its bundle: a serving image has no checkpoint."""
    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))
    config = json.loads((checkpoint / CONFIG_FILE).read_text())
    (checkpoint / CONFIG_FILE).write_text(json.dumps({**config, **recorded}))
    (checkpoint / CARD_FILE).write_text("# tiny\n\nRandom weights.\n", encoding="utf-8")
    export_bundle(checkpoint, tmp_path / "bundle")
    manifest = load_bundle(tmp_path / "bundle").manifest  # the card's hash verified
    assert (manifest.card, manifest.license) == (CARD_FILE, "CC-BY-4.0")
    assert CARD_FILE in manifest.files
    assert (tmp_path / "bundle" / CARD_FILE).read_text() == "# tiny\n\nRandom weights.\n"


def test_export_leaves_the_model_in_eval_mode(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # torch.onnx.export restores the wrapper's (training) mode, and with it the model's.
    model = load_model(tiny_checkpoint)
    export_graphs(model, tmp_path, 17, "fp32", "indirection")
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
