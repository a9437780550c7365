"""model/importers/marian.py: random Marian checkpoints (tests/conftest.py) imported into this
project's format compute what transformers' MarianMTModel computes, and bad ones are refused
with exit status 2 before anything is written."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model.data import pad, read_lines
from model.importers.marian import main
from model.search import generate
from model.transformer import WEIGHTS_FILE, load_model
from service.bundle.manifest import CARD_FILE
from tests.transformers_reference import generate as reference_generate
from tests.transformers_reference import reference

torch.set_num_threads(1)
MAX_LENGTH = 40  # decoding steps in the search comparisons
CHECKPOINTS = ["marian", "marian_separate", "marian_multi", "marian_renormalized"]


@pytest.fixture(scope="module")
def val_pairs(multi30k: Path) -> list[tuple[str, str]]:
    src, tgt = read_lines(multi30k / "val.en.gz"), read_lines(multi30k / "val.de.gz")
    return list(zip(src[:20], tgt[:20], strict=True))


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_transformers_on_a_padded_batch(
    name: str, val_pairs: list[tuple[str, str]], request: pytest.FixtureRequest
) -> None:
    ref = reference(request.getfixturevalue(f"{name}_dir"))
    model = load_model(request.getfixturevalue(f"{name}_checkpoint"))
    sources = [s for s, _ in val_pairs[:8]]
    batch = ref.tokenizer(sources, return_tensors="pt", padding=True)
    targets = ref.tokenizer(text_target=[t for _, t in val_pairs[:8]])["input_ids"]
    start = model.config.bos_id
    decoder_in = pad([[start, *t[:-1]] for t in targets], pad_id=model.config.pad_id)  # (B, T)
    assert (batch["attention_mask"] == 0).any() and (decoder_in == model.config.pad_id).any()
    with torch.no_grad():
        expected = ref.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_in,
        ).logits
        actual = model(batch["input_ids"], decoder_in)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", CHECKPOINTS)
@pytest.mark.parametrize(("beam_size", "length_penalty"), [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_search_gives_the_tokens_and_scores_of_generate(
    name: str,
    beam_size: int,
    length_penalty: float,
    val_pairs: list[tuple[str, str]],
    request: pytest.FixtureRequest,
) -> None:
    """model.search over the imported model == transformers' generate (tests/
    transformers_reference.py has the conventions): tokens equal, beam scores within 1e-4."""
    ref = reference(request.getfixturevalue(f"{name}_dir"))
    model = load_model(request.getfixturevalue(f"{name}_checkpoint"))
    token = ">>fr<<" if name == "marian_multi" else None
    texts = [s for s, _ in val_pairs]
    expected = reference_generate(
        ref,
        texts,
        beam_size=beam_size,
        max_decoding_length=MAX_LENGTH,
        length_penalty=length_penalty,
        target_token=token,
    )
    sources = ref.tokenizer([t if token is None else f"{token} {t}" for t in texts])["input_ids"]
    actual = generate(
        model,
        sources,
        beam_size=beam_size,
        max_decoding_length=MAX_LENGTH,
        length_penalty=length_penalty,
    )
    assert [h[0].ids for h in actual] == [ids for ids, _ in expected]
    if beam_size > 1:
        for (_, score), hyps in zip(expected, actual, strict=True):
            assert hyps[0].score == pytest.approx(score, abs=1e-4)


def test_the_en_de_model_ends_searches_both_ways(
    marian_checkpoint: Path, val_pairs: list[tuple[str, str]], marian_dir: Path
) -> None:
    """The comparisons above cover hypotheses ended by </s> and by the length limit."""
    model = load_model(marian_checkpoint)
    sources = reference(marian_dir).tokenizer([s for s, _ in val_pairs])["input_ids"]
    for beam_size in (1, 4):
        nbest = generate(model, sources, beam_size=beam_size, max_decoding_length=MAX_LENGTH)
        reasons = [hyps[0].finish_reason for hyps in nbest]
        assert reasons.count("eos") >= 3 and reasons.count("length") >= 3


def test_config_records_languages_tokenizer_and_origin(
    marian_checkpoint: Path, marian_multi_checkpoint: Path, marian_dir: Path
) -> None:
    meta = json.loads((marian_checkpoint / "config.json").read_text())
    assert (meta["source_language"], meta["target_language"]) == ("en", "de")
    assert "target_tokens" not in meta
    assert meta["tokenizer"]["special_tokens"] == ["</s>", "<unk>", "<pad>"]
    assert meta["imported_from"]["directory"] == str(marian_dir.resolve())
    assert meta["imported_from"]["license"] == "cc-by-4.0"  # from the README's front matter
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (marian_checkpoint / name).read_bytes() == (marian_dir / name).read_bytes()
    multi = json.loads((marian_multi_checkpoint / "config.json").read_text())
    assert multi["target_tokens"] == {"en": ">>en<<", "fr": ">>fr<<"}
    card = (marian_checkpoint / CARD_FILE).read_text()
    assert "cc-by-4.0" in card and str(marian_dir.resolve()) in card and "en → de" in card


def test_origin_and_license_flags_win(marian_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "opus-mt-en-de"
    args = ["--from", str(marian_dir), "--out", str(out), "--license", "apache-2.0"]
    assert main([*args, "--origin", "https://huggingface.co/Helsinki-NLP/opus-mt-en-de"]) == 0
    card = (out / CARD_FILE).read_text()
    assert "apache-2.0" in card and "https://huggingface.co/Helsinki-NLP/opus-mt-en-de" in card


def _edit_json(path: Path, **changes: object) -> None:
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


def _resize_tensor(path: Path, name: str) -> None:
    from safetensors.torch import save_file

    tensors = load_file(path)
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


BAD = {
    "no config.json": (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    "no target.spm": (lambda d: (d / "target.spm").unlink(), "target.spm is missing"),
    "no weights": (
        lambda d: (d / "model.safetensors").unlink(),
        "has no model.safetensors or pytorch_model.bin",
    ),
    "wrong shape": (
        lambda d: _resize_tensor(d / "model.safetensors", "model.decoder.layers.1.fc2.weight"),
        "model.decoder.layers.1.fc2.weight has shape (32, 63); config.json implies (32, 64)",
    ),
    "unknown activation": (
        lambda d: _edit_json(d / "config.json", activation_function="gelu_new"),
        "activation_function 'gelu_new' is not supported",
    ),
    "unknown field": (
        lambda d: _edit_json(d / "config.json", layernorm_embedding=True),
        "unknown field 'layernorm_embedding'",
    ),
    "pre-norm flag": (
        lambda d: _edit_json(d / "config.json", normalize_before=True),
        "normalize_before = True is not supported",
    ),
    "unknown tensor": (
        lambda d: _add_tensor(d / "model.safetensors", "model.encoder.layernorm_embedding.weight"),
        "tensors the mapping does not know: ['model.encoder.layernorm_embedding.weight']",
    ),
    "repetition penalty": (
        lambda d: _edit_json(d / "generation_config.json", repetition_penalty=1.2),
        "repetition_penalty = 1.2 is not supported",
    ),
    "sequence ban": (
        lambda d: _edit_json(d / "generation_config.json", bad_words_ids=[[5, 6]]),
        "bans sequences of tokens",
    ),
}


def _add_tensor(path: Path, name: str) -> None:
    from safetensors.torch import save_file

    tensors = load_file(path)
    tensors[name] = torch.ones(32)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoints_exit_2_naming_the_problem_and_write_nothing(
    case: str, marian_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(marian_dir, broken)
    damage, message = BAD[case]
    damage(broken)
    out = tmp_path / "checkpoints" / "opus-mt-en-de"
    assert main(["--from", str(broken), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_an_existing_checkpoint_is_replaced_only_with_force(
    marian_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "opus-mt-en-de"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["--from", str(marian_dir), "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main(["--from", str(marian_dir), "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / WEIGHTS_FILE).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["opus-mt-en-de"]  # no temporary left


class _RunsCode:
    """A pickle that would call a function on load: torch.load(weights_only=True) refuses it."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pickle code ran",))


def test_a_pytorch_bin_is_read_with_weights_only(
    marian_dir: Path,
    marian_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(marian_dir, legacy)
    torch.save(load_file(legacy / "model.safetensors"), legacy / "pytorch_model.bin")
    (legacy / "model.safetensors").unlink()
    assert main(["--from", str(legacy), "--out", str(tmp_path / "from-bin")]) == 0
    assert load_file(tmp_path / "from-bin" / WEIGHTS_FILE).keys() == (
        load_file(marian_checkpoint / WEIGHTS_FILE).keys()
    )
    for name, tensor in load_file(tmp_path / "from-bin" / WEIGHTS_FILE).items():
        assert torch.equal(tensor, load_file(marian_checkpoint / WEIGHTS_FILE)[name])

    with (legacy / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"weights": _RunsCode()}, f, protocol=2)
    capsys.readouterr()
    assert main(["--from", str(legacy), "--out", str(tmp_path / "evil")]) == 2
    captured = capsys.readouterr()
    assert "not readable as plain tensors" in captured.err
    assert "pickle code ran" not in captured.out
    assert not (tmp_path / "evil").exists()
