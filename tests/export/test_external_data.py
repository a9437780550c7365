"""Every graph's weights go into one external data file per graph, a bundle file like any
other, which ONNX Runtime maps into memory (the pages no step reads stay on disk); a bundle whose
graphs hold their weights themselves (exported before) loads and translates the same."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import onnx
import pytest
from onnx.external_data_helper import uses_external_data

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
from tests.service.helpers import with_inline_weights

GRAPHS = (ENCODER_FILE, DECODER_STEP_FILE)
DATA_FILES = tuple(external_data_file(graph) for graph in GRAPHS)


@pytest.fixture(params=get_args(Dtype))
def external_bundle(request: pytest.FixtureRequest) -> tuple[Dtype, Path]:
    """(dtype, the tiny checkpoint's bundle in it, as exported)."""
    dtype: Dtype = request.param
    bundle: Path = request.getfixturevalue(f"{dtype}_bundle")
    return dtype, bundle


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


def test_a_bundle_with_inline_weights_translates_as_the_exported_one(
    external_bundle: tuple[Dtype, Path], val_src: list[str], tmp_path: Path
) -> None:
    _, bundle = external_bundle
    inline = with_inline_weights(bundle, tmp_path / "inline")
    assert set(load_bundle(inline).manifest.files) == {*GRAPHS, TOKENIZER_FILE}
    engines = [Engine.load(b, device="cpu", intra_op_threads=1) for b in (bundle, inline)]
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


def test_a_re_export_writes_the_data_files_afresh(
    external_bundle: tuple[Dtype, Path], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    dtype, exported = external_bundle
    bundle = Path(shutil.copytree(exported, tmp_path / "bundle"))
    # Written afresh over the data files there (onnx would append to them).
    export_bundle(tiny_checkpoint, bundle, dtype=dtype)
    assert load_bundle(bundle).manifest.files == load_bundle(exported).manifest.files
    assert sorted(p.name for p in bundle.iterdir()) == sorted(p.name for p in exported.iterdir())


# Serves a bundle from a child process: translates, waits for a line on stdin, translates again.
_SERVE = """
import json
import sys
from service.bundle.decoding import DecodingOptions
from service.inference.engine import Engine
engine = Engine.load(sys.argv[1], device="cpu", intra_op_threads=1)
ids = engine.encode(sys.argv[2:])
options = DecodingOptions(beam_size=2)
for _ in range(2):
    nbest = engine.generate(ids, options)
    print(json.dumps([[h.ids for h in hypotheses] for hypotheses in nbest]), flush=True)
    sys.stdin.readline()
"""


def test_a_re_export_under_a_running_engine_leaves_it_working(
    fp32_bundle: Path, eos_checkpoint: Path, val_src: list[str], tmp_path: Path
) -> None:
    """The engine reads its weights from the mapped data files: an export into its directory,
    of other weights, writes new files (the old ones stay mapped, and the engine keeps
    translating with them) instead of rewriting them in place, which would take the pages from
    under the running process (SIGBUS) or change its weights under it."""
    bundle = Path(shutil.copytree(fp32_bundle, tmp_path / "bundle"))
    inodes = {data: (bundle / data).stat().st_ino for data in DATA_FILES}
    serving = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(bundle), *val_src[:4]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert serving.stdout is not None
        before = serving.stdout.readline()
        assert before.strip(), "the serving process did not translate"
        export_bundle(eos_checkpoint, bundle, dtype="fp32")  # the same shapes, other weights
        assert all((bundle / data).stat().st_ino != inode for data, inode in inodes.items())
        after, _ = serving.communicate("go\n", timeout=120)
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.communicate()
    assert serving.returncode == 0
    assert json.loads(after) == json.loads(before)
    # The new files hold the other weights.
    engine = Engine.load(bundle, device="cpu", intra_op_threads=1)
    nbest = engine.generate(engine.encode(val_src[:4]), DecodingOptions(beam_size=2))
    assert [[h.ids for h in n] for n in nbest] != json.loads(before)


def test_a_data_file_the_manifest_does_not_list_is_refused(
    fp32_bundle: Path, tmp_path: Path
) -> None:
    """A leftover, or weights ONNX Runtime would read unverified (a graph names its data file
    itself): either way the bundle does not hold what its manifest lists."""
    inline = with_inline_weights(fp32_bundle, tmp_path / "inline")
    shutil.copy(fp32_bundle / DATA_FILES[0], inline / DATA_FILES[0])
    with pytest.raises(BundleError, match=rf"{re.escape(DATA_FILES[0])}: not listed in"):
        load_bundle(inline)
