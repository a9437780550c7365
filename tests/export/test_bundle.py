"""service/bundle/manifest.py: a damaged bundle fails to load, with a message naming the file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from export.parity import open_bundle
from service.bundle.manifest import (
    DECODER_STEP_FILE,
    ENCODER_FILE,
    MANIFEST_FILE,
    MEMORY,
    TOKENIZER_FILE,
    BundleError,
    decoder_step_io,
    encoder_io,
    file_entry,
    load_bundle,
)


@pytest.fixture
def bundle(fp32_bundle: Path, tmp_path: Path) -> Path:
    """A private copy of the session's fp32 bundle, free to damage."""
    return Path(shutil.copytree(fp32_bundle, tmp_path / "bundle"))


def _edit_manifest(bundle: Path, edit: dict[str, object]) -> None:
    path = bundle / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest.update(edit)
    path.write_text(json.dumps(manifest))


def test_intact_bundle_loads(bundle: Path) -> None:
    loaded = open_bundle(bundle).bundle
    n = loaded.manifest.model.decoder_layers
    assert loaded.manifest.encoder.input_names == encoder_io(n)[0]
    inputs, outputs = decoder_step_io(n, "indirection", alignment=True)
    assert loaded.manifest.decoder_step.input_names == inputs
    assert loaded.manifest.decoder_step.output_names == outputs


def test_service_module_does_not_import_torch() -> None:
    code = (
        "import sys, service.bundle; sys.exit(bool({'torch', 'onnx', 'model'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("file", [ENCODER_FILE, DECODER_STEP_FILE, TOKENIZER_FILE])
def test_missing_file(bundle: Path, file: str) -> None:
    (bundle / file).unlink()
    with pytest.raises(BundleError, match=rf"{file}: missing"):
        load_bundle(bundle)


def test_missing_manifest(bundle: Path) -> None:
    (bundle / MANIFEST_FILE).unlink()
    with pytest.raises(BundleError, match=rf"{MANIFEST_FILE}: missing"):
        load_bundle(bundle)


def test_truncated_graph(bundle: Path) -> None:
    path = bundle / ENCODER_FILE
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(BundleError, match=rf"{ENCODER_FILE}: truncated"):
        load_bundle(bundle)


def test_flipped_byte(bundle: Path) -> None:
    path = bundle / DECODER_STEP_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"{DECODER_STEP_FILE}: sha256 mismatched"):
        load_bundle(bundle)


def test_unparseable_manifest(bundle: Path) -> None:
    (bundle / MANIFEST_FILE).write_text('{"format_version": 1,')
    with pytest.raises(BundleError, match=rf"{MANIFEST_FILE}: not readable JSON"):
        load_bundle(bundle)


@pytest.mark.parametrize("version", [99, "7", [7], {"v": 7}])
def test_unsupported_format_version(bundle: Path, version: object) -> None:
    _edit_manifest(bundle, {"format_version": version})
    with pytest.raises(BundleError, match=rf"format version {re.escape(repr(version))} is not"):
        load_bundle(bundle)


def test_file_name_outside_the_bundle(bundle: Path) -> None:
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    manifest["files"]["../secret"] = manifest["files"][TOKENIZER_FILE]
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="not a plain name"):
        load_bundle(bundle)


def test_manifest_naming_a_wrong_tensor(bundle: Path) -> None:
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    manifest["encoder"]["outputs"][0]["name"] = "encoder_out"
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=rf"{MANIFEST_FILE}: tensor names of {ENCODER_FILE}"):
        load_bundle(bundle)


def test_graph_with_a_tensor_the_manifest_lacks(bundle: Path) -> None:
    # The files and hashes are consistent, but the graph itself renames an output.
    path = bundle / ENCODER_FILE
    graph = onnx.load(str(path))
    for node in graph.graph.node:
        node.input[:] = ["encoder_out" if i == MEMORY else i for i in node.input]
        node.output[:] = ["encoder_out" if o == MEMORY else o for o in node.output]
    graph.graph.output[0].name = "encoder_out"
    onnx.save(graph, str(path))
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    manifest["files"][ENCODER_FILE] = file_entry(path).model_dump()
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    load_bundle(bundle)  # the files themselves verify
    with pytest.raises(BundleError, match=rf"{ENCODER_FILE}: graph outputs do not match"):
        open_bundle(bundle)
