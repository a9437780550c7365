"""Settings from the environment and flags, and the shipped model's first start."""

from __future__ import annotations

import importlib.util
import json
import logging
import resource
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_settings import CliApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.__main__ import main
from service.bundle.manifest import (
    CARD_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    BundleError,
    external_data_file,
    load_bundle,
    sha256_file,
)
from service.http.app import create_app
from service.http.server import fit_open_files, uvicorn_config
from service.inference import models
from service.inference.cpus import default_intra_op_threads
from service.inference.engine import Engine
from service.inference.models import (
    load_models,
    shipped_bundle,
    shipped_bundles,
    step_threads_spin,
)
from service.settings import Settings
from tests.service.helpers import FakeModel, with_inline_weights, without_alignment


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_BUNDLE", "bundles/a, bundles/b")
    monkeypatch.setenv("MT_API_KEYS", "k1,k2")
    monkeypatch.setenv("MT_CORS_ORIGINS", "https://a.example")
    monkeypatch.setenv("MT_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("MT_DEVICE", "cpu")
    settings = Settings()
    assert settings.bundle == [Path("bundles/a"), Path("bundles/b")]
    assert [k.get_secret_value() for k in settings.api_keys] == ["k1", "k2"]
    assert "k1" not in repr(settings)  # keys never reach logs
    assert settings.cors_origins == ["https://a.example"]
    assert (settings.max_batch_size, settings.device) == (4, "cpu")


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_PORT", "1234")
    argv = ["--bundle", "x", "--bundle", "y", "--port", "9000", "--max-wait-ms", "2.5"]
    settings = CliApp.run(Settings, cli_args=[*argv, "--device", "cuda"])
    assert settings.bundle == [Path("x"), Path("y")]
    assert (settings.port, settings.max_wait_ms, settings.device) == (9000, 2.5, "cuda")


def test_defaults() -> None:
    settings = Settings()
    assert settings.host == "127.0.0.1" and settings.bundle == [] and settings.api_keys == []
    assert settings.libretranslate_prefix == "/libretranslate"
    assert settings.limit_concurrency is None


def test_connection_settings_reach_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_KEEP_ALIVE_TIMEOUT_S", "620")
    argv = ["--backlog", "512", "--limit-concurrency", "1000", "--drain-timeout-s", "12.4"]
    settings = CliApp.run(Settings, cli_args=[*argv, "--forwarded-allow-ips", "10.0.0.7"])
    config = uvicorn_config(create_app(settings, models=[FakeModel()]), settings)
    assert (config.timeout_keep_alive, config.backlog, config.limit_concurrency) == (620, 512, 1000)
    assert config.forwarded_allow_ips == "10.0.0.7"
    assert config.timeout_graceful_shutdown == 12  # a SIGINT waits no longer than a drain


def test_hostile_client_limits_reach_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_MAX_HEADER_BYTES", "8192")
    settings = CliApp.run(Settings, cli_args=["--header-timeout-s", "2.5"])
    config = uvicorn_config(create_app(settings, models=[FakeModel()]), settings)
    assert config.server_header is False  # no "server: uvicorn"
    assert isinstance(config.http, type) and issubclass(config.http, HttpToolsProtocol)


def test_the_connection_cap_fits_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"soft": 1024, "hard": 4096}

    def getrlimit(resource_id: int) -> tuple[int, int]:
        return limits["soft"], limits["hard"]

    def setrlimit(resource_id: int, values: tuple[int, int]) -> None:
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert fit_open_files(1024) == 1024 and limits["soft"] == 1024 + 256  # raised to fit
    assert fit_open_files(8192) == 4096 - 256  # the hard limit: lowered to fit
    assert fit_open_files(100) == 100


@pytest.mark.parametrize("value", [" , ", " ", ","])
def test_api_keys_that_name_nothing_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A templating slip must not turn authentication off."""
    monkeypatch.setenv("MT_API_KEYS", value)
    with pytest.raises(ValidationError, match="names nothing"):
        Settings()
    monkeypatch.setenv("MT_API_KEYS", "")
    assert Settings().api_keys == []  # empty: explicitly none


@pytest.mark.parametrize(
    "values",
    [
        {"default_beam_size": 9, "max_beam_size": 8},
        {"libretranslate_prefix": "lt"},
        {"max_batch_size": 0},
        {"device": "tpu"},
        {"device_id": -1},
        {"keep_alive_timeout_s": 0},
        {"backlog": 0},
        {"limit_concurrency": 0},
    ],
)
def test_invalid_settings_are_refused(values: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**values)  # type: ignore[arg-type]


def test_prefix_loses_its_trailing_slash() -> None:
    assert Settings(libretranslate_prefix="/lt/").libretranslate_prefix == "/lt"


@pytest.mark.parametrize(
    ("bundles", "workers", "named", "spins"),
    [(1, 1, None, True), (2, 1, None, False), (1, 2, None, False), (2, 1, True, True),
     (1, 1, False, False)],
)  # fmt: skip
def test_the_steps_threads_spin_in_a_process_of_one_model_unless_told(
    fp32_bundle: Path,
    monkeypatch: pytest.MonkeyPatch,
    bundles: int,
    workers: int,
    named: bool | None,
    spins: bool,
) -> None:
    """Unset, the decoder step's threads spin where one process serves one model (and take
    every core), not where it serves several or is one of several workers (whose threads would
    take each other's cores), nor under a cgroup CPU quota (which spinning would spend); named,
    the setting holds either way. Workers share the cores out."""
    monkeypatch.delenv("MT_INTRA_OP_SPINNING", raising=False)
    monkeypatch.delenv("MT_INTRA_OP_THREADS", raising=False)
    monkeypatch.setattr(models, "cpu_quota", lambda: None)  # as on a host with none
    asked: list[dict[str, object]] = []

    def default_threads(**options: Any) -> int:
        asked.append(options)
        return default_intra_op_threads(**options)

    monkeypatch.setattr(models, "default_intra_op_threads", default_threads)
    named_it = {} if named is None else {"intra_op_spinning": named}
    settings = Settings(
        bundle=[fp32_bundle] * bundles, checkpoint=[], device="cpu", workers=workers, **named_it
    )
    assert step_threads_spin(settings, bundles, 2.0) == (named is True)
    engines = load_models(settings)
    assert len(engines) == bundles
    for engine in engines:
        options = engine.step_sessions.wide.get_session_options()
        entry = options.get_session_config_entry("session.intra_op.allow_spinning")
        assert entry == ("1" if spins else "0")
        threads = default_intra_op_threads(spinning=spins, processes=workers)
        assert options.intra_op_num_threads == threads
    assert asked == [{"spinning": spins, "processes": workers}]  # the cores shared out


def test_the_shipped_bundle_is_built_once(tiny_checkpoint: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundles" / "tiny"
    assert shipped_bundle(tiny_checkpoint, bundle) == bundle
    load_bundle(bundle)  # a complete, verified bundle
    written = (bundle / MANIFEST_FILE).stat().st_mtime_ns
    assert shipped_bundle(tiny_checkpoint, bundle) == bundle  # second start: no export
    assert (bundle / MANIFEST_FILE).stat().st_mtime_ns == written


def test_without_export_or_checkpoint_the_error_says_what_to_do(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BundleError, match="no checkpoint at"):
        shipped_bundle(tmp_path / "missing", tmp_path / "bundle")
    real_find_spec = importlib.util.find_spec

    def no_torch(name: str, *args: object) -> object:
        return None if name == "torch" else real_find_spec(name)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    with pytest.raises(BundleError, match=r"pip install -e '.\[train\]'"):
        shipped_bundle(tiny_checkpoint, tmp_path / "bundle")


def test_python_m_service_exits_2_with_a_message_when_there_is_no_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["--checkpoint", str(tmp_path / "none"), "--shipped-bundles", str(tmp_path / "b")]
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert "no bundle given (--bundle DIR)" in caplog.text


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "--port (MT_PORT): Input should be less than or equal to 65535"),
        (
            [],
            {"MT_MAX_TEXTS": "abc"},
            "--max-texts (MT_MAX_TEXTS): Input should be a valid integer",
        ),
        (["--default-beam-size", "9"], {}, "default_beam_size 9 exceeds max_beam_size 8"),
    ],
)
def test_python_m_service_names_an_invalid_setting_and_exits_2(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A message naming the setting by its flag and variable, not pydantic's traceback."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_python_m_service_exits_2_for_a_bundle_that_is_not_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--bundle", str(tmp_path / "nowhere")]) == 2
    assert f"--bundle {tmp_path / 'nowhere'}: no such directory" in caplog.text


def test_the_log_level_may_be_written_in_capitals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_LOG_LEVEL", "INFO")
    assert Settings().log_level == "info"


def test_python_m_service_makes_a_model_directorys_bundle_once_before_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model DIR --workers N`: the bundle is made (imported, exported) in the supervisor,
    once, and the workers are handed it; not made by each worker at once, racing for the
    cache. A directory that is no model stops the start with status 2."""
    made: list[Path] = []

    def model_bundle(directory: Path, cache: Path) -> Path:
        made.append(directory)
        return cache / "made"

    served: list[Settings] = []
    monkeypatch.setattr(models, "model_bundle", model_bundle)
    monkeypatch.setattr("service.__main__.serve_workers", lambda s: served.append(s) or 0)
    cache = tmp_path / "cache"
    argv = ["--model", str(tmp_path / "m"), "--model-cache", str(cache), "--workers", "3"]
    assert main(argv) == 0
    assert made == [tmp_path / "m"]
    [settings] = served
    assert (settings.bundle, settings.model, settings.workers) == ([cache / "made"], [], 3)
    monkeypatch.undo()
    assert main(["--model", str(tmp_path / "nowhere"), "--workers", "3"]) == 2


def test_the_shipped_bundle_is_exported_again_when_the_checkpoint_changes(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import load_file, save_file

    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))
    weights = checkpoint / "model.safetensors"
    bundle = tmp_path / "bundles" / "tiny"
    shipped_bundle(checkpoint, bundle)
    first = load_bundle(bundle).manifest.provenance.checkpoint_sha256
    assert first == sha256_file(weights)

    tensors = load_file(weights)  # a new training run: same shapes, other weights
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(weights))
    with caplog.at_level(logging.WARNING):
        assert shipped_bundle(checkpoint, bundle) == bundle
    assert "is stale" in caplog.text
    again = load_bundle(bundle).manifest.provenance.checkpoint_sha256  # complete and verified
    assert again == sha256_file(weights) != first
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["tiny"]  # no export leftovers


def test_a_bundle_of_an_older_format_is_exported_again(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bundle = tmp_path / "bundles" / "tiny"
    shipped_bundle(tiny_checkpoint, bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    old = FORMAT_VERSION - 1
    (bundle / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": old}))
    with caplog.at_level(logging.WARNING):
        assert shipped_bundle(tiny_checkpoint, bundle) == bundle
    assert f"bundle format version {old}, this service reads {FORMAT_VERSION}" in caplog.text
    assert load_bundle(bundle).manifest.format_version == FORMAT_VERSION


def test_a_bundle_exported_before_alignments_is_exported_again(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shipped bundle of an earlier release serves text only: the service re-exports it so
    that html, xml and return_alignments work without a manual step."""
    bundle = tmp_path / "bundles" / "tiny"
    without_alignment(shipped_bundle(tiny_checkpoint, tmp_path / "first"), bundle)
    assert load_bundle(bundle).manifest.alignment is None
    with caplog.at_level(logging.WARNING):
        assert shipped_bundle(tiny_checkpoint, bundle) == bundle
    assert "exported before the decoder step had an alignment output" in caplog.text
    assert load_bundle(bundle).manifest.alignment is not None


def test_a_bundle_with_inline_weights_is_exported_again(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shipped bundle of an earlier release copies its weights into the process: the
    service re-exports it so that they are mapped from data files (less memory)."""
    bundle = tmp_path / "bundles" / "tiny"
    with_inline_weights(shipped_bundle(tiny_checkpoint, tmp_path / "first"), bundle)
    inline = set(load_bundle(bundle).manifest.files)
    with caplog.at_level(logging.WARNING):
        assert shipped_bundle(tiny_checkpoint, bundle) == bundle
    assert "its graphs hold their weights themselves" in caplog.text
    assert set(load_bundle(bundle).manifest.files) - inline == {
        external_data_file(ENCODER_FILE),
        external_data_file(DECODER_STEP_FILE),
    }


def test_without_torch_a_bundle_with_inline_weights_is_served_as_it_is(
    tiny_checkpoint: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A serving install (no torch) keeps serving what an older release exported: inline
    weights cost memory, not correctness; another format version it cannot read at all."""
    bundle = tmp_path / "bundles" / "tiny"
    with_inline_weights(shipped_bundle(tiny_checkpoint, tmp_path / "first"), bundle)
    files = load_bundle(bundle).manifest.files
    monkeypatch.setattr(models, "_can_export", lambda package: False)
    with caplog.at_level(logging.WARNING):
        assert shipped_bundle(tiny_checkpoint, bundle) == bundle
    assert "serving it as it is" in caplog.text
    assert load_bundle(bundle).manifest.files == files
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    (bundle / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 6}))
    with pytest.raises(BundleError, match="needs the export package with torch"):
        shipped_bundle(tiny_checkpoint, bundle)


def test_a_bundle_without_the_checkpoints_model_card_is_exported_again(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The card is what /status shows: one added or edited after the export is re-exported
    (a bundle from before bundles carried cards has none)."""
    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint"))
    bundle = tmp_path / "bundles" / "tiny"
    shipped_bundle(checkpoint, bundle)
    assert load_bundle(bundle).manifest.card is None
    for card in ("# tiny\n", "# tiny, edited\n"):
        (checkpoint / CARD_FILE).write_text(card, encoding="utf-8")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert shipped_bundle(checkpoint, bundle) == bundle
        assert "its model card is not" in caplog.text
        assert Engine.load(bundle, device="cpu").card == card
    written = (bundle / MANIFEST_FILE).stat().st_mtime_ns
    assert shipped_bundle(checkpoint, bundle) == bundle  # the same card: no export
    assert (bundle / MANIFEST_FILE).stat().st_mtime_ns == written


def test_every_shipped_checkpoint_gets_its_own_bundle(
    tiny_checkpoint: Path, eos_checkpoint: Path, tmp_path: Path
) -> None:
    """The default serves every shipped direction: each checkpoint (MT_CHECKPOINT, comma-
    separated) exported to MT_SHIPPED_BUNDLES/its name."""
    checkpoints = [tmp_path / "en-de", tmp_path / "de-en"]
    for source, copy in zip((tiny_checkpoint, eos_checkpoint), checkpoints, strict=True):
        shutil.copytree(source, copy)
    settings = Settings(
        checkpoint=",".join(map(str, checkpoints)),  # type: ignore[arg-type]  # as the env has it
        shipped_bundles=tmp_path / "bundles",
    )
    bundles = shipped_bundles(settings)
    assert bundles == [tmp_path / "bundles" / "en-de", tmp_path / "bundles" / "de-en"]
    provenance = [load_bundle(bundle).manifest.provenance.checkpoint for bundle in bundles]
    assert provenance == [str(checkpoint.resolve()) for checkpoint in checkpoints]
