"""model/importers/m2m100.py on random M2M100- and NLLB-shaped checkpoints built with
transformers (tests/conftest.py): the imported model's torch search gives generate's tokens and
scores with the target forced (forced_bos_token_id), the config records the languages and the
tokenizer, and checkpoints it cannot map exit 2 naming the problem, writing nothing."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from model.search import generate
from model.transformer import load_model
from tests.conftest import MULTILINGUAL_SAMPLE
from tests.transformers_reference import (
    MULTILINGUAL_CASES,
    generate_mixed,
    multilingual_reference,
)

torch.set_num_threads(1)
MAX_LENGTH = 30


@pytest.mark.parametrize(("family", "source", "targets"), MULTILINGUAL_CASES)
@pytest.mark.parametrize(("beam_size", "length_penalty"), [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_search_gives_the_tokens_and_scores_of_generate_with_the_target_forced(
    family: str,
    source: str,
    targets: tuple[str, ...],
    beam_size: int,
    length_penalty: float,
    request: pytest.FixtureRequest,
) -> None:
    """One batch, each text with its own target: the prefix is per sentence."""
    ref = multilingual_reference(request.getfixturevalue(f"{family}_dir"))
    model = load_model(request.getfixturevalue(f"{family}_checkpoint")).eval()
    texts = MULTILINGUAL_SAMPLE
    wanted, expected = generate_mixed(
        ref, texts, source=source, targets=targets, beam_size=beam_size,
        max_decoding_length=MAX_LENGTH, length_penalty=length_penalty,
    )  # fmt: skip
    nbest = generate(
        model,
        ref.encode(texts, source),
        prefixes=[[ref.language_id(target)] for target in wanted],
        beam_size=beam_size,
        max_decoding_length=MAX_LENGTH,
        length_penalty=length_penalty,
    )
    assert [hyps[0].ids for hyps in nbest] == [ids for ids, _ in expected]
    if beam_size > 1:
        for hyps, (_, score) in zip(nbest, expected, strict=True):
            assert hyps[0].score == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize(
    ("family", "languages", "token", "license_id"),
    [("m2m100", 8, "__de__", "mit"), ("nllb", 202, "deu_Latn", "cc-by-nc-4.0")],
)
def test_config_records_languages_tokenizer_and_license(
    family: str, languages: int, token: str, license_id: str, request: pytest.FixtureRequest
) -> None:
    checkpoint = request.getfixturevalue(f"{family}_checkpoint")
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["source_language"], config["target_language"]) == ("mul", "mul")
    assert len(config["source_tokens"]) == languages
    assert token in config["source_tokens"].values()
    assert all(prefix == [config["source_tokens"][code]] for code, prefix in
               config["decoder_prefixes"].items())  # fmt: skip
    model = config["model"]
    assert (model["norm"], model["positions"], model["position_offset"]) == ("pre", "fairseq", 2)
    assert config["imported_from"]["license"] == license_id
    card = (checkpoint / "MODEL_CARD.md").read_text()
    assert license_id in card and "CC-BY-NC" in card
    for name in [config["tokenizer"]["file"]] if family == "nllb" else ["vocab.json"]:
        assert (checkpoint / name).is_file()


def _run(source: Path, out: Path) -> int:
    """`python -m model.import --from source --out out`, in process: its exit status."""
    command = importlib.import_module("model.import")  # `import` is a keyword
    return int(command.main(["--from", str(source), "--out", str(out)]))


@pytest.mark.parametrize(
    ("family", "change", "message"),
    [
        ("m2m100", ("config.json", "layernorm_embedding", True), "layernorm_embedding"),
        ("m2m100", ("config.json", "tie_word_embeddings", False), "tie_word_embeddings"),
        ("m2m100", ("config.json", "architectures", ["MBartForConditionalGeneration"]),
         "architectures"),
        ("nllb", ("tokenizer_config.json", "legacy_behaviour", True), "legacy_behaviour"),
        ("nllb", ("config.json", "encoder_ffn_dim", 128), "encoder_ffn_dim"),
        ("m2m100", ("tokenizer_config.json", "language_codes", "klingon"), "language_codes"),
    ],
)  # fmt: skip
def test_what_cannot_be_mapped_exits_2_naming_it_and_writes_nothing(
    family: str,
    change: tuple[str, str, object],
    message: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = tmp_path / "source"
    shutil.copytree(request.getfixturevalue(f"{family}_dir"), source)
    file, key, value = change
    values = json.loads((source / file).read_text())
    values[key] = value
    (source / file).write_text(json.dumps(values))
    out = tmp_path / "out"
    code = _run(source, out)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["source"]


def test_a_folder_without_tokenizer_files_names_what_is_missing(
    m2m100_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    shutil.copytree(m2m100_dir, source)
    (source / "sentencepiece.bpe.model").unlink()
    code = _run(source, tmp_path / "out")
    assert code == 2
    err = capsys.readouterr().err
    assert "sentencepiece.bpe.model" in err and "tokenizer.json" in err


def test_the_language_tables_are_m2m100_tokenizer_s() -> None:
    """What a tokenizer_config.json without its language tokens means (language_codes)."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    from model.importers.m2m100 import _M2M100_CODES

    assert _M2M100_CODES == FAIRSEQ_LANGUAGE_CODES
