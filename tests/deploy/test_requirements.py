"""deploy/requirements-serve.txt, what the runtime image installs: pinned, covering everything
pyproject.toml says the service needs (core dependencies + the serve extra), and nothing of the
training side."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.helpers import REPO, requirement_name, serve_requirements

TRAIN_ONLY = {"torch", "safetensors", "sacrebleu", "sacremoses", "matplotlib", "onnx", "onnxscript"}


def pyproject() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_every_requirement_is_pinned() -> None:
    for line in serve_requirements():
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[0-9][0-9A-Za-z.+\-]*", line), line


def test_covers_core_and_serve_dependencies() -> None:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    wanted = {requirement_name(r) for r in project["dependencies"]}
    wanted |= {requirement_name(r) for r in project["optional-dependencies"]["serve"]}
    assert wanted == {requirement_name(r) for r in serve_requirements()}


def test_uvicorn_keeps_the_standard_extra() -> None:
    (uvicorn,) = [r for r in serve_requirements() if requirement_name(r) == "uvicorn"]
    assert uvicorn.startswith("uvicorn[standard]==")


def test_no_training_packages_and_only_the_gpu_onnxruntime() -> None:
    names = {requirement_name(r) for r in serve_requirements()}
    assert not names & TRAIN_ONLY
    assert "onnxruntime-gpu" in names
    assert "onnxruntime" not in names  # one ONNX Runtime per environment (README: Install)
