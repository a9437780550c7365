"""model/importers/: the registry picks the importer by config.json's model_type, refuses the
others by name, and `python -m model.import` writes what `python -m model.import_marian` does."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from model.importers import IMPORTERS, importer_for, marian
from model.importers.common import UnsupportedCheckpoint
from tests.conftest import REPO

import_command = importlib.import_module("model.import")  # `import` is a keyword


def _config(directory: Path, **values: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(values))
    return directory


def test_the_registry_picks_marian_for_a_marian_config(tmp_path: Path) -> None:
    assert importer_for(_config(tmp_path, model_type="marian")) is marian


def test_every_importer_has_the_interface_under_its_model_type() -> None:
    for model_type, importer in IMPORTERS.items():
        assert model_type == importer.MODEL_TYPE
        parser = argparse.ArgumentParser()  # conflict_handler="error": a clash raises
        for flag in ("--from", "--out", "--force"):
            parser.add_argument(flag)
        importer.add_arguments(parser)  # its flags, besides those three
        assert callable(importer.import_checkpoint)


@pytest.mark.parametrize(
    ("values", "named"),
    [({"model_type": "t5"}, "model_type 't5'"), ({}, "model_type None")],
)
def test_an_unknown_model_type_is_refused_naming_it_and_the_supported_ones(
    tmp_path: Path, values: dict[str, object], named: str
) -> None:
    with pytest.raises(UnsupportedCheckpoint) as refused:
        importer_for(_config(tmp_path, **values))
    assert named in str(refused.value) and "supported: m2m_100, marian" in str(refused.value)


def test_a_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedCheckpoint) as refused:
        importer_for(tmp_path)
    message = str(refused.value)
    assert "config.json is missing" in message and "supported: m2m_100, marian" in message


def test_the_command_exits_2_on_an_unknown_model_type_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _config(tmp_path / "nllb", model_type="nllb-moe")
    out = tmp_path / "out"
    assert import_command.main(["--from", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model_type 'nllb-moe' has no importer (supported: m2m_100, marian)" in err
    assert not out.exists()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("command", ["model.import", "model.import_marian"])
def test_help_exits_0_and_lists_the_flags(command: str) -> None:
    done = _run(command, "--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--from", "--out", "--source-language", "--license", "--origin", "--force"):
        assert flag in done.stdout


def test_the_new_command_writes_what_the_old_one_does(marian_dir: Path, tmp_path: Path) -> None:
    """Through model.import's choice of importer, the same files, byte for byte: config.json,
    the weights, the tokenizer files and the card (the same --out name, the same flags)."""
    flags = ["--license", "apache-2.0", "--origin", "https://example.org/opus-mt-en-de"]
    outputs = {}
    for command in ("model.import", "model.import_marian"):
        out = tmp_path / command / "opus-mt-en-de"
        done = _run(command, "--from", str(marian_dir), "--out", str(out), *flags)
        assert done.returncode == 0, done.stderr
        printed = json.loads(done.stdout.strip().splitlines()[-1])
        assert printed["checkpoint"] == str(out)
        outputs[command] = out, printed["model"]
    (new, new_model), (old, old_model) = outputs["model.import"], outputs["model.import_marian"]
    assert new_model == old_model
    names = sorted(p.name for p in old.iterdir())
    assert sorted(p.name for p in new.iterdir()) == names
    assert {"config.json", "model.safetensors", "MODEL_CARD.md", "source.spm"} <= set(names)
    for name in names:
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    config = json.loads((new / "config.json").read_text())
    assert config["imported_from"]["license"] == "apache-2.0"
