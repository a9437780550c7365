"""docker-compose.yml's stack brought up for real with podman-compose, its images stood in by the
ones .ci/images builds (the cpu image for mt, Debian's nginx and Prometheus for theirs): nginx
answers through its three replicas, Prometheus finds and scrapes each replica, and a rolling
restart of the replicas under load (benchmarks.rolling_restart --compose) loses nothing. Skipped
where the images are not named or podman-compose is absent."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks import rolling_restart
from benchmarks.nginx_reload import parse_version
from benchmarks.servers import free_port
from tests.deploy.helpers import REPO

IMAGES = {
    "MT_IMAGE": os.environ.get("MT_TEST_IMAGE_CPU"),
    "NGINX_IMAGE": os.environ.get("MT_TEST_IMAGE_NGINX"),
    "PROMETHEUS_IMAGE": os.environ.get("MT_TEST_IMAGE_PROMETHEUS"),
    "REDIS_IMAGE": os.environ.get("MT_TEST_IMAGE_REDIS"),
}


def compose(project: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman-compose", "--project-name", project, "--file", str(REPO / "docker-compose.yml"),
         *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def podman(*args: str) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def eventually(check: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if check():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str, str]]:
    """(project, nginx URL, Prometheus URL) of the running stack: mt x3, nginx, Prometheus."""
    if None in IMAGES.values() or shutil.which("podman-compose") is None:
        pytest.skip("no stand-in images named (.ci/images builds them) or no podman-compose")
    project = f"mtci{uuid.uuid4().hex[:6]}"
    port, prometheus_port = free_port(), free_port()
    env = {
        **os.environ,
        **{k: v for k, v in IMAGES.items() if v is not None},
        "MT_PUBLISH": f"127.0.0.1:{port}",
        "PROMETHEUS_PUBLISH": f"127.0.0.1:{prometheus_port}",
    }
    services = ["redis", "mt", "nginx", "prometheus"]
    up = compose(project, env, "up", "--detach", "--no-build", *services)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = f"http://127.0.0.1:{port}"
        eventually(lambda: httpx.get(f"{url}/ready", timeout=5).status_code == 200, 120, "ready")
        yield project, url, f"http://127.0.0.1:{prometheus_port}"
    finally:
        down = compose(project, env, "down", "--timeout", "10")
        assert down.returncode == 0, down.stdout + down.stderr


def test_nginx_answers_through_the_replicas_sharing_redis(stack: tuple[str, str, str]) -> None:
    """A translation through nginx, and its sentence in the Redis every replica reads."""
    project, url, _ = stack
    body = {"text": "Two dogs are playing in the snow.", "source": "en", "target": "de"}
    response = httpx.post(f"{url}/translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert "Hunde" in response.json()["translations"][0]["text"]
    (redis,) = containers(project, "redis")
    keys = podman("exec", redis, "redis-cli", "dbsize")
    assert int(keys) >= 1


def containers(project: str, service: str) -> list[str]:
    labels = [f"label=com.docker.compose.{k}" for k in (f"project={project}", f"service={service}")]
    filters = [arg for label in labels for arg in ("--filter", label)]
    return podman("ps", "--quiet", *filters).split()


def test_nginx_keeps_connections_through_a_reload_where_it_can(
    stack: tuple[str, str, str],
) -> None:
    """The running nginx has keepalive_min_timeout if it is 1.27.4 or later (the compose file's
    image), and starts without it if older (CI's stand-in, Debian's 1.22)."""
    project, _, _ = stack
    (nginx,) = containers(project, "nginx")
    version = parse_version(podman("exec", nginx, "sh", "-c", "nginx -v 2>&1"))
    effective = podman("exec", nginx, "nginx", "-T")
    has = re.search(r"^\s*keepalive_min_timeout 1s;", effective, re.MULTILINE) is not None
    assert has == (version >= (1, 27, 4)), version


def test_prometheus_scrapes_every_replica(stack: tuple[str, str, str]) -> None:
    _, _, prometheus = stack

    def three_up() -> bool:
        targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]
        return [t["health"] for t in targets["activeTargets"]] == ["up"] * 3

    eventually(three_up, 90, "three replicas scraped")


def test_rolling_restart_loses_nothing(stack: tuple[str, str, str], tmp_path: Path) -> None:
    project, url, _ = stack
    out = tmp_path / "result.json"
    argv = ["--compose", project, "--engine", "podman", "--url", url, "--clients", "4"]
    assert rolling_restart.main([*argv, "--pause", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["replicas"] == 3 and result["restarts"] == 3
    assert result["answered"] > 0
    assert result["lost"] == 0, result["failures"]
    assert result["exit_codes"] == [0, 0, 0]  # each replica drained and exited cleanly
