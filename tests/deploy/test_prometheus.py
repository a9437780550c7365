"""The Prometheus configs pass `promtool check config` (Debian package `prometheus`; skipped
when promtool is absent).

Debian's promtool is built without the Kubernetes service discovery, so it rejects
`kubernetes_sd_configs` as an unknown field. With such a promtool the Kubernetes config is
checked with that block swapped for an empty static config (everything else - relabelling,
intervals, job - still goes through promtool), and the discovery block is checked here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import DEPLOY, load_yaml

CONFIGS = [DEPLOY / "prometheus" / "prometheus.yml", DEPLOY / "prometheus" / "compose.yml"]
NO_K8S_SD = "field kubernetes_sd_configs not found"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def without_kubernetes_sd(config: dict[str, Any]) -> dict[str, Any]:
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": []}]
    return config


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_promtool_check_config(path: Path, tmp_path: Path) -> None:
    done = check(path)
    if done.returncode != 0 and NO_K8S_SD in done.stdout + done.stderr:
        (config,) = load_yaml(path)
        stubbed = tmp_path / path.name
        stubbed.write_text(yaml.safe_dump(without_kubernetes_sd(config)))
        done = check(stubbed)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("scrape_configs:\n  - job_name: x\n    scrape_interval: soon\n")
    assert check(bad).returncode != 0


def test_kubernetes_discovery_keeps_only_the_service_pods() -> None:
    (config,) = load_yaml(CONFIGS[0])
    (job,) = config["scrape_configs"]
    assert [sd["role"] for sd in job["kubernetes_sd_configs"]] == ["pod"]
    keeps = {
        r["source_labels"][0]: r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keeps == {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "transformer-mt",
        "__meta_kubernetes_pod_container_port_name": "http",
    }
    # prometheus-adapter maps the HPA's Pods metrics through these two labels.
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets


def test_compose_scrapes_the_compose_service() -> None:
    (config,) = load_yaml(CONFIGS[1])
    (compose,) = load_yaml(DEPLOY.parent / "docker-compose.yml")
    (job,) = config["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]  # every replica: one address per container
    (host,) = discovery["names"]
    port = str(discovery["port"])
    assert {r["target_label"] for r in job["relabel_configs"]} == {"namespace", "pod"}
    # The service itself, inside the compose network (not nginx in front of it): exposed there,
    # not published to the host.
    assert compose["services"][host]["build"]["context"] == "."
    assert port in [str(p) for p in compose["services"][host]["expose"]]
