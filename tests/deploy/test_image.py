"""The images, built and run for real (.ci/images builds them with podman from base images made
from Debian's packages, then names them in MT_TEST_IMAGE_CPU and MT_TEST_IMAGE_GPU): the cpu
image serves both shipped directions as a non-root user on a read-only root file system, within
30 s, with its metrics, page and HEALTHCHECK, and drains on SIGTERM; the gpu image has ONNX
Runtime's CUDA provider with every library it loads inside the image but the driver's, and serves
on a machine without a GPU; both within their sizes. Skipped where no image is named."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.servers import free_port, wait_until_ready

CPU_IMAGE = os.environ.get("MT_TEST_IMAGE_CPU")
GPU_IMAGE = os.environ.get("MT_TEST_IMAGE_GPU")
MB = 1000 * 1000
NETWORK = "mt-test"  # a network of its own: netavark publishes ports on a created network

# ldd on the CUDA provider and every library that onnxruntime.preload_dlls() loaded, each from
# the directory it was loaded from: what does not resolve inside the image.
CUDA_PROBE = r"""
import json, os, subprocess, onnxruntime as ort
providers = ort.get_available_providers()
ort.preload_dlls()
loaded = sorted({line.split()[-1] for line in open("/proc/self/maps")
                 if "/nvidia/" in line and ".so" in line})
directories = sorted({os.path.dirname(p) for p in loaded})
capi = os.path.join(os.path.dirname(ort.__file__), "capi")
libraries = [os.path.join(capi, "libonnxruntime_providers_cuda.so")]
libraries += [os.path.join(d, f) for d in directories for f in sorted(os.listdir(d)) if ".so" in f]
env = {**os.environ, "LD_LIBRARY_PATH": ":".join(directories)}
missing = {}
for library in libraries:
    out = subprocess.run(["ldd", library], capture_output=True, text=True, env=env).stdout
    missing[library] = sorted({l.split()[0] for l in out.splitlines() if "not found" in l})
print(json.dumps({"providers": providers, "loaded": loaded, "missing": missing}))
"""


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done.stdout


def needs(image: str | None) -> str:
    if image is None or shutil.which("podman") is None:
        pytest.skip("no image built here (.ci/images builds them and names them)")
    return image


@dataclass
class Container:
    name: str
    url: str
    process: subprocess.Popen[str]
    ready_s: float


@contextlib.contextmanager
def serving(image: str, *flags: str) -> Iterator[Container]:
    """`podman run` in the foreground (its exit status is the container's), published on a
    free 127.0.0.1 port, ready when yielded; removed afterwards."""
    name = f"mt-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    if subprocess.run(["podman", "network", "exists", NETWORK], check=False).returncode != 0:
        podman("network", "create", NETWORK)
    command = [
        "podman", "run", "--name", name, "--network", NETWORK, "--read-only",
        "-p", f"127.0.0.1:{port}:8000",
        "-e", "MT_DRAIN_TIMEOUT_S=30", "-e", "MT_LOG_LEVEL=info", *flags, image,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    try:
        wait_until_ready(url, process, timeout=120)
        yield Container(name, url, process, time.monotonic() - start)
    finally:
        if process.poll() is None:
            podman("kill", name, check=False)
        process.wait(60)
        podman("rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def cpu() -> Iterator[Container]:
    with serving(needs(CPU_IMAGE)) as container:
        yield container


def translate(url: str, text: str, source: str, target: str, **options: Any) -> str:
    body = {"text": text, "source": source, "target": target, **options}
    response = httpx.post(f"{url}/translate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    (translation,) = response.json()["translations"]
    text_: str = translation["text"]
    return text_


def size(image: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).strip())


def test_cpu_image_is_ready_within_30_s(cpu: Container) -> None:
    assert cpu.ready_s < 30, f"ready after {cpu.ready_s:.1f} s"


def test_cpu_image_translates_both_shipped_directions(cpu: Container) -> None:
    german = translate(cpu.url, "Two dogs are playing in the snow.", "en", "de")
    assert "Hunde" in german and "Schnee" in german, german
    english = translate(cpu.url, "Zwei Hunde spielen im Schnee.", "de", "en")
    assert "dogs" in english and "snow" in english, english


def test_cpu_image_metrics_scrape(cpu: Container) -> None:
    translate(cpu.url, "A man rides a bike.", "en", "de")
    response = httpx.get(f"{cpu.url}/metrics", timeout=30)
    assert response.status_code == 200
    samples = {
        (s.name, s.labels.get("route"), s.labels.get("status")): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert samples[("mt_http_requests_total", "/translate", "200")] >= 1


def test_cpu_image_serves_the_page(cpu: Container) -> None:
    response = httpx.get(f"{cpu.url}/", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<title>transformer-mt" in response.text


def test_cpu_image_runs_as_non_root_on_a_read_only_root(cpu: Container) -> None:
    assert podman("exec", cpu.name, "id", "-u").strip() == "10001"
    assert podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", cpu.name).strip() == (
        "true"
    )
    done = subprocess.run(
        ["podman", "exec", "-u", "0", cpu.name, "touch", "/app/written"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "Read-only file system" in done.stderr, done.stderr


def test_cpu_image_keeps_what_thai_sentences_need(cpu: Container) -> None:
    """The image leaves out PyThaiNLP's corpora but CRFCut's (Dockerfile, venv stage)."""
    probe = (
        "from service.text import segment; "
        "print(segment.split('วันนี้อากาศดีมาก ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อน', 'th').segments)"
    )
    output = podman("exec", cpu.name, "python", "-c", probe)
    assert output.strip() == "('วันนี้อากาศดีมาก', 'ฉันไปเดินเล่นที่สวนสาธารณะกับเพื่อน')"


def test_cpu_image_healthcheck_passes(cpu: Container) -> None:
    done = subprocess.run(
        ["podman", "healthcheck", "run", cpu.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_cpu_image_drains_on_sigterm(cpu: Container) -> None:
    """Requests in flight when SIGTERM comes are all answered, then the container exits 0.
    (Last: it stops the module's container.)"""
    text = " ".join(["A man in a blue shirt is riding a bike down the street."] * 40)

    def send(n: int) -> tuple[int, float]:
        # Not from the sentence cache: each of its sentences decoded, so that it takes a while.
        body = {"text": text, "source": "en", "target": "de", "beam_size": 4, "cache": False}
        response = httpx.post(f"{cpu.url}/translate", json=body, timeout=120)
        return response.status_code, time.monotonic()

    def in_flight() -> float:
        families = text_string_to_metric_families(httpx.get(f"{cpu.url}/metrics").text)
        return next(
            s.value for f in families for s in f.samples if s.name == "mt_in_flight_requests"
        )

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(send, n) for n in range(6)]
        end = time.monotonic() + 60
        while in_flight() < 6:
            assert time.monotonic() < end, "the requests were never in flight together"
            time.sleep(0.02)
        signalled = time.monotonic()
        podman("kill", "--signal", "TERM", cpu.name)
        results = [f.result() for f in futures]
    assert cpu.process.wait(60) == 0
    assert [status for status, _ in results] == [200] * 6
    # ...and every one was still in flight when SIGTERM came.
    assert min(answered for _, answered in results) > signalled
    assert cpu.process.stdout is not None
    assert "Finished server process" in cpu.process.stdout.read()


def test_cpu_image_size_is_kept() -> None:
    assert size(needs(CPU_IMAGE)) <= 450 * MB


def test_gpu_image_size_is_kept() -> None:
    assert size(needs(GPU_IMAGE)) <= 3500 * MB


def test_gpu_image_has_everything_the_cuda_provider_loads_but_the_driver() -> None:
    output = podman(
        "run", "--rm", "--entrypoint", "python", needs(GPU_IMAGE), "-c", CUDA_PROBE, timeout=300
    )
    probe = json.loads(output.splitlines()[-1])
    assert "CUDAExecutionProvider" in probe["providers"]
    names = {os.path.basename(p) for p in probe["loaded"]}
    for library in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcudnn.so.9"):
        assert library in names, sorted(names)
    provider, *others = probe["missing"]
    assert provider.endswith("libonnxruntime_providers_cuda.so")
    assert probe["missing"][provider] == ["libcuda.so.1"]
    unresolved = {
        lib: m for lib in others if (m := probe["missing"][lib]) not in ([], ["libcuda.so.1"])
    }
    assert unresolved == {}


def test_gpu_image_serves_without_a_gpu() -> None:
    with serving(needs(GPU_IMAGE)) as container:
        german = translate(container.url, "Two dogs are playing in the snow.", "en", "de")
        assert "Hunde" in german, german
        podman("kill", "--signal", "TERM", container.name)
        assert container.process.wait(60) == 0
        assert container.process.stdout is not None
        log = container.process.stdout.read()
    assert "multi30k-de-en-fp32 (fp32, MT_DEVICE=cpu)" in log
