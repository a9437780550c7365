"""A rehearsal of the Dockerfile's runtime stage without Docker (no engine in CI): a fresh venv
(no system site-packages, so nothing leaks in from the dev environment), `pip install -r
deploy/requirements-serve.txt`, the files the runtime stage's COPY lines name copied into an
/app stand-in, `pip install --no-deps .`, then the image's ENTRYPOINT with the image's ENV
(host and port moved to a free 127.0.0.1 port) serving the tiny fp32 bundle: one translation
over HTTP, the HEALTHCHECK script, a SIGTERM drain, and torch, model/ and export/ absent.

onnxruntime-gpu is replaced by the CPU `onnxruntime` of the same version: both install the same
`onnxruntime` module and API, but the GPU wheel is ~250 MB and links CUDA 13 / cuDNN 9 libraries
that this machine lacks (its CUDA provider would only fail to load and fall back to the CPU
provider, which is exactly what the CPU wheel runs). What this does not cover: the base image,
apt packages, the `USER`, and the CUDA provider itself.

Needs the package index (PyPI); skipped with the reason when pip cannot reach it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.helpers import REPO, Stage, requirement_name, serve_requirements
from tests.service.helpers import free_port, wait_until_ready

PIP_TIMEOUT_S = 600


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


def cpu_requirements() -> list[str]:
    """The serving requirements with the CPU build of ONNX Runtime (same version)."""
    return [
        line.replace("onnxruntime-gpu==", "onnxruntime==", 1)
        if requirement_name(line) == "onnxruntime-gpu"
        else line
        for line in serve_requirements()
    ]


def index_reachable(tmp: Path) -> str | None:
    """None when pip can download from its index, else why not."""
    pin = next(r for r in serve_requirements() if requirement_name(r) == "prometheus-client")
    done = run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "-d",
            str(tmp),
            pin,
        ],
        timeout=120,
    )
    return None if done.returncode == 0 else (done.stdout + done.stderr)[-500:]


def clean_env() -> dict[str, str]:
    drop = ("MT_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    return env


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, stages: dict[str, Stage]) -> Path:
    """A stand-in for the image's filesystem root: venv/ (/opt/venv) and app/ (/app)."""
    root = tmp_path_factory.mktemp("image")
    why = index_reachable(root / "probe")
    if why is not None:
        pytest.skip(f"pip cannot reach the package index: {why}")
    runtime = stages["runtime"]
    workdirs = [i.args for i in runtime.all("WORKDIR")]
    assert workdirs == ["/app"]
    env = clean_env()

    venv = root / "venv"
    done = run([sys.executable, "-m", "venv", str(venv)], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    python = str(venv / "bin" / "python")
    requirements = root / "requirements-cpu.txt"
    requirements.write_text("\n".join(cpu_requirements()) + "\n")
    install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = run(
        [*install, "--only-binary=:all:", "-r", str(requirements)], env=env, timeout=PIP_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr

    app = root / "app"
    app.mkdir()
    for source_stage, source, destination in runtime.copies():
        if source_stage is not None:
            continue  # the bundles from the build stage: the test supplies its own
        target = app / destination if not destination.startswith("/") else root / destination
        assert target.is_relative_to(app), destination
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / source, target, ignore=ignore)
        else:
            shutil.copy2(REPO / source, target)
    done = run([*install, "--no-deps", "."], cwd=app, env=env, timeout=PIP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def image_env(root: Path, stages: dict[str, Stage], port: int) -> dict[str, str]:
    """The runtime stage's ENV with /opt/venv and /app moved into `root`, on 127.0.0.1."""
    env = clean_env()
    for key, value in stages["runtime"].env().items():
        value = value.replace("$PATH", env["PATH"]).replace("/opt/venv", str(root / "venv"))
        env[key] = value.replace("/app/", f"{root / 'app'}/")
    env.update(MT_HOST="127.0.0.1", MT_PORT=str(port), MT_INTRA_OP_THREADS="1")
    env["MT_BUNDLES_DIR"] = str(root / "bundles")
    return env


def test_torch_and_training_code_are_absent(image: Path) -> None:
    python = str(image / "venv" / "bin" / "python")
    probe = (
        "import importlib.util as u, sys; "
        "found = [m for m in ('torch', 'model', 'export', 'onnx') if u.find_spec(m)]; "
        "sys.exit(', '.join(found) or None)"
    )
    done = run([python, "-c", probe], cwd=image / "app", env=clean_env(), timeout=60)
    assert done.returncode == 0, f"importable in the runtime venv: {done.stderr.strip()}"
    # ...while the service and ONNX Runtime are, from any directory.
    probe = "import onnxruntime, service.inference.engine; print(onnxruntime.__version__)"
    done = run([python, "-c", probe], cwd=image, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    (ort,) = [r for r in cpu_requirements() if requirement_name(r) == "onnxruntime"]
    assert done.stdout.strip() == ort.split("==")[1]


@contextlib.contextmanager
def entrypoint(image: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [str(image / "app" / "deploy" / "docker" / "entrypoint.sh")],
        cwd=image / "app",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_entrypoint_serves_the_fp32_bundle(
    image: Path, stages: dict[str, Stage], fp32_bundle: Path
) -> None:
    bundle = image / "bundles" / "multi30k-en-de-fp32"
    if not bundle.exists():
        shutil.copytree(fp32_bundle, bundle)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = image_env(image, stages, port)
    env["MT_DEVICE"] = "cpu"  # this machine may show /dev/nvidia*; the CPU wheel has no CUDA
    env["MT_BUNDLE_NAME"] = "multi30k-en-de"  # one direction (the test bundle is en -> de)
    with entrypoint(image, env) as process:
        wait_until_ready(url, process, timeout=120.0)
        body = {"text": "A man rides a bike.", "source": "en", "target": "de", "beam_size": 1}
        response = httpx.post(f"{url}/translate", json=body, timeout=60)
        assert response.status_code == 200, response.text
        (translation,) = response.json()["translations"]
        assert isinstance(translation["text"], str)
        assert translation["segments"]

        healthcheck = run(
            [
                str(image / "venv" / "bin" / "python"),
                str(image / "app/deploy/docker/healthcheck.py"),
            ],
            env=env,
            timeout=30,
        )
        assert healthcheck.returncode == 0, healthcheck.stderr

        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert process.stdout is not None
        output = process.stdout.read()
    assert f"entrypoint: serving {bundle} (fp32" in output
    assert "CPUExecutionProvider" in output
