"""deploy/k8s: the manifests parse, the built-in kinds validate offline against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), the ServiceMonitor (a CRD,
no schema offline) is checked structurally, and the objects agree with each other and with the
service (probe paths, ports, drain timeout, the HPA's metrics and the adapter rules)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.deploy.helpers import DEPLOY, K8S, REPO, Exported, Stage, k8s_objects, load_yaml

BUILT_IN = ["Deployment", "Service", "HorizontalPodAutoscaler"]
K8S_VERSION = "1.30.0"  # the oldest Kubernetes these manifests are meant for


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    return k8s_objects()


def container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (server,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    return server  # type: ignore[no-any-return]


def env_of(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}


@pytest.mark.parametrize(
    "path",
    sorted(
        [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), REPO / "docker-compose.yml"],
        key=str,
    ),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_yaml_parses(path: Path) -> None:
    assert load_yaml(path), f"{path} is empty"


def test_all_kinds_present(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == {*BUILT_IN, "ServiceMonitor"}


@pytest.mark.parametrize("kind", BUILT_IN)
def test_validates_against_kubernetes_schema(objects: dict[str, dict[str, Any]], kind: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate"
    )
    kubernetes_validate.validate(objects[kind], K8S_VERSION, strict=True)


def test_redis_is_persistent_valid_and_the_one_the_replicas_name() -> None:
    """deploy/k8s/redis/: a Service and a StatefulSet that validate, Redis with its append-only
    file on a claimed volume, non-root on a read-only root; the Deployment's MT_REDIS_URL names
    that Service and port."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate"
    )
    redis = k8s_objects(K8S / "redis")
    assert set(redis) == {"Service", "StatefulSet"}
    for doc in redis.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    spec = redis["StatefulSet"]["spec"]
    (server,) = spec["template"]["spec"]["containers"]
    assert server["args"][:3] == ["redis-server", "--appendonly", "yes"]
    (mount,) = server["volumeMounts"]
    (claim,) = spec["volumeClaimTemplates"]
    assert mount["name"] == claim["metadata"]["name"] and mount["mountPath"] == "/data"
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    service = redis["Service"]
    (port,) = service["spec"]["ports"]
    assert service["spec"]["selector"] == spec["template"]["metadata"]["labels"]
    name = service["metadata"]["name"]
    assert env_of(k8s_objects())["MT_REDIS_URL"] == f"redis://{name}:{port['port']}/0"


def test_schema_validation_can_fail(objects: dict[str, dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate"
    )
    broken = copy.deepcopy(objects["Deployment"])
    container({"Deployment": broken})["readinessProbe"]["httpGet"]["pathh"] = "/"  # unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken = copy.deepcopy(objects["HorizontalPodAutoscaler"])
    broken["spec"]["minReplicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_service_monitor_structure(objects: dict[str, dict[str, Any]]) -> None:
    monitor = objects["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    service = objects["Service"]
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    allowed = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme"}
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= allowed, set(endpoint) - allowed
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+s", endpoint["interval"])


def test_service_selects_the_pods(objects: dict[str, dict[str, Any]]) -> None:
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"].items() <= pod_labels.items()
    assert objects["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = objects["Service"]["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert container_ports[port["targetPort"]] == int(env_of(objects)["MT_PORT"])


def test_probes(objects: dict[str, dict[str, Any]]) -> None:
    server = container(objects)
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    names = {p["name"] for p in server["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert server[probe]["httpGet"]["port"] in names


def test_grace_period_covers_prestop_and_drain(objects: dict[str, dict[str, Any]]) -> None:
    spec = objects["Deployment"]["spec"]["template"]["spec"]
    command = container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    drain = float(env_of(objects).get("MT_DRAIN_TIMEOUT_S", Settings().drain_timeout_s))
    assert pre_stop >= 5  # long enough for endpoint removal to propagate
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain


def test_gpu_and_security(objects: dict[str, dict[str, Any]], stages: dict[str, Stage]) -> None:
    server = container(objects)
    assert server["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert server["resources"]["requests"]["cpu"]  # the HPA's CPU fallback needs a request
    pod_security = objects["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    image_user = stages["gpu"].all("USER")[-1].args.split(":")[0]
    assert str(pod_security["runAsUser"]) == image_user
    security = server["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert "/tmp" in {m["mountPath"] for m in server["volumeMounts"]}


def test_image_is_the_gpu_target_as_built(
    objects: dict[str, dict[str, Any]], stages: dict[str, Stage]
) -> None:
    """The Deployment runs what `docker build --target gpu -t transformer-mt:gpu .` makes
    (docs/operations.md), the target whose image has CUDA: it asks for a GPU."""
    name, tag = container(objects)["image"].split(":")
    assert (name, tag) == ("transformer-mt", "gpu") and tag in stages
    assert "--target gpu -t transformer-mt:gpu" in (REPO / "docs" / "operations.md").read_text()


def test_env_names_are_settings(objects: dict[str, dict[str, Any]]) -> None:
    known = {f"MT_{name.upper()}" for name in Settings.model_fields}
    entrypoint_only = {"MT_PRECISION", "MT_BUNDLES_DIR", "MT_BUNDLE_NAME"}
    for variable in (e["name"] for e in container(objects)["env"]):
        assert variable in known | entrypoint_only, variable


def adapter_rules() -> list[dict[str, Any]]:
    (values,) = load_yaml(DEPLOY / "prometheus-adapter" / "values.yaml")
    return values["rules"]["custom"]  # type: ignore[no-any-return]


def test_hpa_metrics_are_served_by_the_adapter(objects: dict[str, dict[str, Any]]) -> None:
    hpa = objects["HorizontalPodAutoscaler"]
    deployment = objects["Deployment"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert "Pods" in kinds and "Resource" in kinds  # custom metric + CPU fallback
    served = {rule["name"]["as"] for rule in adapter_rules()}
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Pods":
            assert metric["pods"]["metric"]["name"] in served


def test_adapter_rules_query_exported_metrics(exported_metrics: Exported) -> None:
    for rule in adapter_rules():
        series = re.match(r"(\w+)\{", rule["seriesQuery"])
        assert series, rule["seriesQuery"]
        assert series.group(1) in exported_metrics.names()
        assert re.search(rule["name"]["matches"], series.group(1))
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_kustomize_free_apply_layout() -> None:
    # `kubectl apply -f deploy/k8s/` must only meet Kubernetes objects (the adapter's Helm values
    # live outside deploy/k8s).
    for path in K8S.rglob("*"):
        if path.is_file():
            assert path.suffix == ".yaml", path
            for doc in load_yaml(path):
                assert {"apiVersion", "kind", "metadata"} <= set(doc), path
