"""Graphs too large for one ONNX file (NLLB-200 1.3B and 3.3B): their weights go into one
external data file per graph, a bundle file like any other. The tiny model is written that way
by lowering the threshold to nothing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import get_args

import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from export import onnx_export
from export.onnx_export import export_bundle
from export.quantize import graph_bytes
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import (
    DECODER_STEP_FILE,
    ENCODER_FILE,
    TOKENIZER_FILE,
    BundleError,
    Dtype,
    external_data_file,
    load_bundle,
)
from service.inference.engine import Engine

GRAPHS = (ENCODER_FILE, DECODER_STEP_FILE)
DATA_FILES = tuple(external_data_file(graph) for graph in GRAPHS)


def _export_external(checkpoint: Path, out: Path, dtype: Dtype) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
        export_bundle(checkpoint, out, dtype=dtype)


@pytest.fixture(scope="session", params=get_args(Dtype))
def external_bundle(
    request: pytest.FixtureRequest, tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Dtype, Path]:
    """(dtype, the tiny checkpoint's bundle in it with both graphs' weights external)."""
    dtype: Dtype = request.param
    out = tmp_path_factory.mktemp(f"bundle_{dtype}_external")
    _export_external(tiny_checkpoint, out, dtype)
    return dtype, out


def test_the_weights_are_one_data_file_per_graph_listed_in_the_manifest(
    external_bundle: tuple[Dtype, Path],
) -> None:
    _, bundle = external_bundle
    files = load_bundle(bundle).manifest.files
    assert set(files) == {*GRAPHS, *DATA_FILES, TOKENIZER_FILE}
    assert sorted(p.name for p in bundle.iterdir()) == sorted([*files, "manifest.json"])
    for graph, data in zip(GRAPHS, DATA_FILES, strict=True):
        # The graph file keeps its nodes and tensors under 1 KiB; the weights are in the data file.
        proto = onnx.load(bundle / graph, load_external_data=False)
        inline = [len(t.raw_data) for t in proto.graph.initializer if not uses_external_data(t)]
        assert max(inline, default=0) < 1024
        assert files[graph].size < files[data].size
        # Readable by whoever can read the graph (onnx writes the data file for its owner only).
        assert (bundle / data).stat().st_mode == (bundle / graph).stat().st_mode
    assert graph_bytes(load_bundle(bundle).manifest) == sum(
        files[f].size for f in (*GRAPHS, *DATA_FILES)
    )


def test_the_bundle_translates_as_the_single_file_one(
    external_bundle: tuple[Dtype, Path], val_src: list[str], request: pytest.FixtureRequest
) -> None:
    dtype, bundle = external_bundle
    engines = [
        Engine.load(directory, device="cpu", intra_op_threads=1)
        for directory in (bundle, request.getfixturevalue(f"{dtype}_bundle"))
    ]
    limit = engines[0].max_input_tokens
    sources = [ids for ids in engines[0].encode(val_src[:20]) if len(ids) <= limit][:8]
    options = DecodingOptions(beam_size=2)
    external, single = (
        [(h.ids, h.score) for nbest in engine.generate(sources, options) for h in nbest]
        for engine in engines
    )
    assert external == single


@pytest.mark.parametrize("data", DATA_FILES)
def test_a_missing_or_altered_data_file_is_refused(
    data: str, external_bundle: tuple[Dtype, Path], tmp_path: Path
) -> None:
    _, exported = external_bundle
    bundle = Path(shutil.copytree(exported, tmp_path / "bundle"))
    path = bundle / data
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x01
    path.write_bytes(bytes(content))
    with pytest.raises(BundleError, match=rf"{re.escape(str(path))}: sha256 mismatched"):
        Engine.load(bundle, device="cpu")
    path.unlink()
    with pytest.raises(BundleError, match=rf"{re.escape(str(path))}: missing"):
        Engine.load(bundle, device="cpu")


def test_a_re_export_leaves_no_stale_data_file(
    external_bundle: tuple[Dtype, Path], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    dtype, exported = external_bundle
    bundle = Path(shutil.copytree(exported, tmp_path / "bundle"))
    # Written afresh over the data files there (onnx would append to them).
    _export_external(tiny_checkpoint, bundle, dtype)
    assert load_bundle(bundle).manifest.files == load_bundle(exported).manifest.files
    # Removed when no longer needed.
    export_bundle(tiny_checkpoint, bundle, dtype=dtype)
    files = load_bundle(bundle).manifest.files
    assert set(files) == {*GRAPHS, TOKENIZER_FILE}
    assert sorted(p.name for p in bundle.iterdir()) == sorted([*files, "manifest.json"])
