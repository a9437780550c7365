"""deploy/requirements-*.txt, what the images install: every line pinned; serve + cpu and serve +
gpu each cover everything pyproject.toml says the service needs (core dependencies + the serve
extra, with the ONNX Runtime build of the target), and nothing of the training side; the export
stage's list covers what `python -m export` imports, torch as the CPU build."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.deploy.helpers import REPO, requirements

TRAIN_ONLY = {"torch", "safetensors", "sacrebleu", "sacremoses", "matplotlib", "onnx", "onnxscript"}


def names(lines: list[str]) -> set[str]:
    return {re.split(r"[\[=<>]", line, maxsplit=1)[0].lower().replace("_", "-") for line in lines}


def project() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as f:
        table = tomllib.load(f)["project"]
    assert isinstance(table, dict)
    return table


@pytest.mark.parametrize("name", ["serve", "cpu", "gpu", "export"])
def test_every_requirement_is_pinned(name: str) -> None:
    for line in requirements(name):
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[0-9][0-9A-Za-z.+\-]*", line), line


def test_serve_leaves_onnx_runtime_to_the_targets() -> None:
    assert not names(requirements("serve")) & {"onnxruntime", "onnxruntime-gpu"}
    assert "onnxruntime" in names(requirements("cpu"))
    assert "onnxruntime-gpu" not in names(requirements("cpu"))
    assert "onnxruntime-gpu" in names(requirements("gpu"))
    assert "onnxruntime" not in names(requirements("gpu"))  # one ONNX Runtime per environment
    (cpu,) = [r for r in requirements("cpu") if r.startswith("onnxruntime==")]
    (gpu,) = [r for r in requirements("gpu") if r.startswith("onnxruntime-gpu[")]
    assert cpu.split("==")[1] == gpu.split("==")[1]


def test_gpu_brings_cuda_and_cudnn_as_pinned_wheels() -> None:
    (ort,) = [r for r in requirements("gpu") if r.startswith("onnxruntime-gpu")]
    assert ort.startswith("onnxruntime-gpu[cuda,cudnn]==")
    found = names(requirements("gpu"))
    for wheel in ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-curand"):
        assert wheel in found


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_each_image_covers_core_and_serve_dependencies(target: str) -> None:
    table = project()
    extras = table["optional-dependencies"]
    assert isinstance(extras, dict)
    wanted = names(table["dependencies"]) | names(extras["serve"])  # type: ignore[arg-type]
    if target == "cpu":  # the serve extra names the GPU build; the cpu image has the CPU one
        wanted = wanted - {"onnxruntime-gpu"} | {"onnxruntime"}
    installed = names(requirements("serve")) | names(requirements(target))
    assert wanted <= installed, wanted - installed
    assert not installed & TRAIN_ONLY


def test_uvicorn_keeps_the_standard_extra() -> None:
    (uvicorn,) = [r for r in requirements("serve") if r.startswith("uvicorn")]
    assert uvicorn.startswith("uvicorn[standard]==")


def test_export_stage_has_cpu_torch_and_no_compiled_sources() -> None:
    lines = requirements("export")
    assert "torch==2.13.0+cpu" in lines
    found = names(lines)
    assert {"onnx", "onnxscript", "onnxruntime", "safetensors", "tokenizers", "pydantic"} <= found
    assert "eflomal" not in found  # a source distribution: it needs a compiler
