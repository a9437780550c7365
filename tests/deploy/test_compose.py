"""docker-compose.yml (the local stack) and its GPU override, checked structurally: no compose
plugin or engine here to run `docker compose config`. nginx's start command is run for real
(busybox's sh, sed and grep where installed, as in the Alpine image), its paths mapped to the
repository and a temporary directory, so the configuration it writes can be checked."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.servers import NGINX_CONF
from service.settings import Settings
from tests.deploy.helpers import DEPLOY, REPO, Stage, load_yaml, parse_nginx


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml as compose reads it with none of its variables set: each
    `${NAME:-default}` is its default."""
    text = (REPO / "docker-compose.yml").read_text()
    doc = yaml.safe_load(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text))
    return doc  # type: ignore[no-any-return]


def seconds(value: str) -> float:
    assert value.endswith("s"), value
    return float(value[:-1])


def mt_port(compose: dict[str, Any], stages: dict[str, Stage]) -> int:
    """The port the service binds in its container: the image's MT_PORT unless compose sets it."""
    env = compose["services"]["mt"]["environment"]
    return int(env.get("MT_PORT", stages["app"].env()["MT_PORT"]))


def published(service: dict[str, Any]) -> dict[int, int]:
    """host port -> container port, from "HOST:CONTAINER" entries."""
    pairs = (str(entry).split(":") for entry in service.get("ports", []))
    return {int(host): int(container) for host, container in pairs}


def test_stack_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"mt", "redis", "nginx", "prometheus", "grafana"}
    for name, service in compose["services"].items():
        assert "image" in service, name
        assert ":latest" not in service["image"] or name == "mt", "pin third-party images"
    # The official image, pinned to a release (not latest, stable or mainline).
    assert re.fullmatch(r"nginx:\d+\.\d+\.\d+-alpine", compose["services"]["nginx"]["image"])


def test_service_builds_this_repository(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    mt = compose["services"]["mt"]
    assert mt["build"] == {"context": ".", "target": "cpu"}  # the small image
    assert mt["image"] == "transformer-mt:cpu"
    # Reachable inside the compose network only: nginx fronts it.
    assert "ports" not in mt
    assert str(mt_port(compose, stages)) in [str(port) for port in mt["expose"]]
    # Compose SIGKILLs after stop_grace_period: leave the drain its time.
    drain = float(mt["environment"]["MT_DRAIN_TIMEOUT_S"])
    assert seconds(mt["stop_grace_period"]) > drain
    assert mt["read_only"] is True and "/tmp" in mt["tmpfs"]


def test_the_service_url_is_nginx(compose: dict[str, Any]) -> None:
    """The header's service URL is published by nginx, the only service in front of mt."""
    match = re.search(r"Service http://localhost:(\d+)", (REPO / "docker-compose.yml").read_text())
    assert match, "the header names the service URL"
    port = int(match[1])
    owners = [name for name, service in compose["services"].items() if port in published(service)]
    assert owners == ["nginx"]
    assert published(compose["services"]["nginx"]) == {port: 8080}  # nginx listens on 8080


# What the fake nginx's `nginx -t` does: pass, refuse keepalive_min_timeout (before 1.27.4),
# or fail for another reason (the real start then fails with it).
NGINX_TESTS = {
    "takes": "exit 0",
    "refuses": "echo 'nginx: [emerg] unknown directive \"keepalive_min_timeout\"' >&2; exit 1",
    "fails": "echo 'nginx: [emerg] host not found in upstream \"mt:8000\"' >&2; exit 1",
}


def run_nginx_command(
    nginx: dict[str, Any], tmp_path: Path, *, test: str = "takes"
) -> tuple[dict[str, str], list[str], str]:
    """nginx's start command with its bind mounts mapped to their sources and its tmpfs mounts
    to temporary directories, and a fake `nginx` on PATH whose `nginx -t` does NGINX_TESTS[test]:
    the configuration files it writes (name -> text), the arguments it starts nginx with, and
    what it says on stderr."""
    shell, flag, script = nginx["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    assert "$" not in script, "compose would interpolate it (write $$)"
    paths: dict[str, Path] = {}
    for volume in nginx["volumes"]:
        source, target, *_ = volume.split(":")
        paths[target] = REPO / source
    for mount in nginx["tmpfs"]:
        paths[mount] = tmp_path / mount.strip("/").replace("/", "_")
        paths[mount].mkdir()
    for target in sorted(paths, key=len, reverse=True):
        script = script.replace(target, str(paths[target]))
    assert "/etc/" not in script and "/var/" not in script, f"unmapped path in {script!r}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args_file = tmp_path / "nginx-args"
    fake = bin_dir / "nginx"
    check = f'if [ "$1" = -t ]; then {NGINX_TESTS[test]}; fi\n'
    fake.write_text(f"#!/bin/sh\n{check}printf '%s\\n' \"$@\" > {args_file}\n")
    fake.chmod(0o755)
    busybox = shutil.which("busybox")
    if busybox is not None:  # the Alpine image's sh, sed and grep
        for tool in ("sh", "sed", "grep", "rm"):
            (bin_dir / tool).symlink_to(busybox)
        command, path = [str(bin_dir / "sh"), "-c", script], str(bin_dir)
    else:
        command, path = ["/bin/sh", "-c", script], f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        command, env={"PATH": path}, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    written = {
        p.name: p.read_text() for mount in nginx["tmpfs"] for p in paths[mount].glob("*.conf")
    }
    return written, args_file.read_text().splitlines(), result.stderr


def test_nginx_fronts_mt_with_the_committed_conf(
    compose: dict[str, Any], stages: dict[str, Stage], tmp_path: Path
) -> None:
    nginx = compose["services"]["nginx"]
    sources = [REPO / volume.split(":")[0] for volume in nginx["volumes"]]
    assert [source.resolve() for source in sources] == [NGINX_CONF]
    written, args, _ = run_nginx_command(nginx, tmp_path)
    assert args == ["-g", "daemon off;"]
    text = written["transformer-mt.conf"]
    # The committed file, but for its upstream server line (as benchmarks/servers.py does).
    committed = NGINX_CONF.read_text().splitlines()
    changed = [(a, b) for a, b in zip(committed, text.splitlines(), strict=True) if a != b]
    committed_server = next(line.split() for line in committed if line.split()[:1] == ["server"])
    expected = ["server", f"mt:{mt_port(compose, stages)}", *committed_server[2:]]
    assert [new.split() for _, new in changed] == [expected]
    conf = parse_nginx(text)
    (upstream,) = conf["{upstream}"]
    (server_line,) = upstream["server"]
    host, port = server_line[0].rsplit(":", 1)
    assert compose["services"][host]["build"]["context"] == "."  # built here, not a copy
    assert int(port) == mt_port(compose, stages)
    (server,) = conf["{server}"]
    (listen,) = server["listen"]
    assert [int(listen[0])] == list(published(nginx).values())


@pytest.mark.parametrize("test", sorted(NGINX_TESTS))
def test_nginx_keeps_connections_through_a_reload_where_it_can(
    compose: dict[str, Any], tmp_path: Path, test: str
) -> None:
    """keepalive_min_timeout where this nginx takes it (1.27.4 and later), so that a reload
    answers a request on a kept-alive connection with "Connection: close" rather than closing
    the connection as the request arrives. Left out, with a line saying so, where `nginx -t`
    calls it an unknown directive (CI's Debian 1.22); kept where `nginx -t` fails for another
    reason, which the real start then reports."""
    written, args, said = run_nginx_command(compose["services"]["nginx"], tmp_path, test=test)
    assert args == ["-g", "daemon off;"]
    extra = {name: text for name, text in written.items() if name != "transformer-mt.conf"}
    if test == "refuses":
        assert extra == {}
        assert "no keepalive_min_timeout before 1.27.4" in said
    else:
        assert extra == {"keepalive-min-timeout.conf": "keepalive_min_timeout 1s;\n"}
        assert parse_nginx(extra["keepalive-min-timeout.conf"]) == {
            "keepalive_min_timeout": [["1s"]]
        }
        assert "keepalive_min_timeout before" not in said


def test_nginx_runs_read_only(compose: dict[str, Any]) -> None:
    nginx = compose["services"]["nginx"]
    assert nginx["read_only"] is True
    # Where the image's nginx writes: temporary files, the pid file, the rewritten conf (which
    # also hides the image's default server on port 80).
    assert {"/var/cache/nginx", "/var/run", "/etc/nginx/conf.d"} <= set(nginx["tmpfs"])
    assert "mt" in nginx["depends_on"]


def test_forwarded_allow_ips_names_nginx_only(compose: dict[str, Any]) -> None:
    """The service trusts X-Forwarded-For from nginx's fixed address, and from nothing else on
    the network: not the gateway, from which clients on the host reach nginx."""
    nginx = compose["services"]["nginx"]
    address = ipaddress.ip_address(nginx["networks"]["default"]["ipv4_address"])
    trusted = compose["services"]["mt"]["environment"]["MT_FORWARDED_ALLOW_IPS"].split(",")
    assert [ipaddress.ip_address(host.strip()) for host in trusted] == [address]
    assert "networks" not in compose["services"]["mt"]  # mt is on the default network too
    (pool,) = compose["networks"]["default"]["ipam"]["config"]
    assert address in ipaddress.ip_network(pool["subnet"])
    # Outside the range the other containers' addresses come from, and not the gateway.
    assert address not in ipaddress.ip_network(pool["ip_range"])
    assert address != ipaddress.ip_address(pool["gateway"])


def test_slow_client_limits_are_the_service_defaults(compose: dict[str, Any]) -> None:
    """Stated in compose next to nginx's (deploy/nginx/transformer-mt.conf): the defaults."""
    env = compose["services"]["mt"]["environment"]
    for name in ("max_header_bytes", "header_timeout_s", "body_timeout_s", "max_connections"):
        field = Settings.model_fields.get(name)
        assert field is not None, f"service.settings.Settings has no {name}"
        assert float(env[f"MT_{name.upper()}"]) == field.default, name


def test_volumes_exist(compose: dict[str, Any]) -> None:
    """Bind mounts name files of the repository; named volumes are declared."""
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (REPO / source).exists(), source
            else:
                assert source in compose["volumes"], source


def test_gpu_override_reserves_one_nvidia_gpu(compose: dict[str, Any]) -> None:
    (override,) = load_yaml(DEPLOY / "compose.gpu.yml")
    assert set(override["services"]) <= set(compose["services"])
    mt = override["services"]["mt"]
    (device,) = mt["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert mt["environment"]["MT_DEVICE"] == "cuda"
    # Merged over mt, it must not publish the service past nginx.
    assert "ports" not in mt and "networks" not in mt
