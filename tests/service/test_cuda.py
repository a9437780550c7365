"""The engine on CUDA: the CPU's tokens, CUDA graphs on equal off, fp16 close to fp32.

Skipped without a CUDA-enabled ONNX Runtime (CI has none): run them on a GPU host with
`python -m pytest -m gpu`. They use the shipped model on Multi30k val, whose outputs are not a
random model's near-ties, so agreement is measured on what users get.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest

from export.onnx_export import export_bundle
from model.data import read_lines
from service.bundle.decoding import DecodingOptions, Hypothesis
from service.inference.engine import CUDA_PROVIDER, Engine
from tests.conftest import REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        CUDA_PROVIDER not in ort.get_available_providers(), reason="needs ONNX Runtime with CUDA"
    ),
]

SHIPPED = REPO / "checkpoints" / "multi30k-en-de"
SENTENCES = 300


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fp32 and fp16 for CUDA (the gather cache), and the CPU's own fp32 bundle."""
    out = tmp_path_factory.mktemp("shipped")
    export_bundle(SHIPPED, out / "fp32", cache="gather")
    export_bundle(SHIPPED, out / "fp16", dtype="fp16")
    export_bundle(SHIPPED, out / "cpu")
    return {name: out / name for name in ("fp32", "fp16", "cpu")}


@pytest.fixture(scope="module")
def sources(bundles: dict[str, Path], multi30k: Path) -> list[list[int]]:
    engine = Engine.load(bundles["cpu"], device="cpu", intra_op_threads=2)
    return engine.encode(read_lines(multi30k / "val.en.gz")[:SENTENCES])


def _decode(engine: Engine, sources: list[list[int]], beam: int) -> list[list[Hypothesis]]:
    return engine.generate(sources, DecodingOptions(beam_size=beam))


def _agreement(a: list[list[Hypothesis]], b: list[list[Hypothesis]]) -> float:
    return sum(x[0].ids == y[0].ids for x, y in zip(a, b, strict=True)) / len(a)


@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_gives_the_cpu_tokens(
    bundles: dict[str, Path], sources: list[list[int]], beam: int
) -> None:
    cpu = Engine.load(bundles["cpu"], device="cpu", intra_op_threads=2)
    cuda = Engine.load(bundles["fp32"], device="cuda", max_batch_size=32, intra_op_spinning=True)
    assert cuda.provider == CUDA_PROVIDER and cuda.padded
    # The CPU's threads only wait for the GPU there: they never spin.
    options = cuda.step_sessions.wide.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert _agreement(_decode(cuda, sources, beam), _decode(cpu, sources, beam)) >= 0.99


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_graphs_on_equal_off(
    bundles: dict[str, Path], sources: list[list[int]], dtype: str, beam: int
) -> None:
    """Each step shape runs plainly first, is captured next and replayed after that: three
    passes over the same batches capture and replay every shape; with room for two graphs, the
    other shapes run without one."""
    off = Engine.load(bundles[dtype], device="cuda", max_batch_size=32)
    on = Engine.load(bundles[dtype], device="cuda", max_batch_size=32, cuda_graphs=True)
    two = Engine.load(
        bundles[dtype], device="cuda", max_batch_size=32, cuda_graphs=True, max_cuda_graphs=2
    )
    assert on.cuda_graphs and not off.cuda_graphs
    expected = _decode(off, sources, beam)
    for _ in range(3):
        assert _decode(on, sources, beam) == expected
        assert _decode(two, sources, beam) == expected
    assert two.cuda_graphs_captured == 2 < on.cuda_graphs_captured
    assert off.cuda_graphs_captured == 0


@pytest.mark.parametrize("beam", [1, 4])
def test_fp16_stays_close_to_fp32(
    bundles: dict[str, Path], sources: list[list[int]], beam: int
) -> None:
    fp32 = Engine.load(bundles["cpu"], device="cpu", intra_op_threads=2)
    fp16 = Engine.load(bundles["fp16"], device="cuda", max_batch_size=32)
    assert _agreement(_decode(fp16, sources, beam), _decode(fp32, sources, beam)) >= 0.98
