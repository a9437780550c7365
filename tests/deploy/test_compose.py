"""docker-compose.yml (the local stack) and its GPU override, checked structurally: no compose
plugin or engine here to run `docker compose config`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.helpers import DEPLOY, REPO, Stage, load_yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_yaml(REPO / "docker-compose.yml")
    return doc  # type: ignore[no-any-return]


def seconds(value: str) -> float:
    assert value.endswith("s"), value
    return float(value[:-1])


def test_stack_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"mt", "prometheus", "grafana"}
    for name, service in compose["services"].items():
        assert "image" in service, name
        assert ":latest" not in service["image"] or name == "mt", "pin third-party images"


def test_service_builds_this_repository(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    mt = compose["services"]["mt"]
    assert mt["build"] == "."
    port = stages["runtime"].env()["MT_PORT"]
    assert f"{port}:{port}" in mt["ports"]
    # Compose SIGKILLs after stop_grace_period: leave the drain its time.
    drain = float(mt["environment"]["MT_DRAIN_TIMEOUT_S"])
    assert seconds(mt["stop_grace_period"]) > drain
    assert mt["read_only"] is True and "/tmp" in mt["tmpfs"]


def test_volumes_exist(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (REPO / source).exists(), source


def test_gpu_override_reserves_one_nvidia_gpu() -> None:
    (override,) = load_yaml(DEPLOY / "compose.gpu.yml")
    mt = override["services"]["mt"]
    (device,) = mt["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert mt["environment"]["MT_DEVICE"] == "cuda"
