"""deploy/grafana/dashboard.json: every metric it queries is one the running service exports
(families from /metrics of a real `python -m service`, with the _total / _bucket / _count / _sum
series their types imply), it shows what operators need, and the compose stack provisions it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.deploy.helpers import DEPLOY, REPO, Exported, load_yaml

DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
# PromQL words that look like metric names but are functions, keywords or label names.
PROMQL_WORDS = {
    "sum", "rate", "by", "histogram_quantile", "max", "min", "avg", "le", "irate", "increase",
    "without", "on", "ignoring", "and", "or", "unless", "count", "topk", "bottomk",
}  # fmt: skip


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Identifiers in an expression outside label matchers, grouping clauses, strings and
    range selectors."""
    stripped = re.sub(r'"[^"]*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", "", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)
    stripped = re.sub(r"\b(by|without)\s*\([^)]*\)", "", stripped)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped))
    return words - PROMQL_WORDS


def test_metric_name_extraction() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{route!~"/x|y"}[5m])))'
    assert metric_names(expr) == {"a_bucket"}
    assert metric_names("sum(rate(b_total[$__rate_interval])) / sum(c)") == {"b_total", "c"}


def test_every_queried_metric_is_exported(
    dashboard: dict[str, Any], exported_metrics: Exported
) -> None:
    names = exported_metrics.names()
    queried = set().union(*(metric_names(e) for e in exprs(dashboard)))
    assert queried, "no metric found in the dashboard"
    assert queried <= names, sorted(queried - names)
    # A wrong suffix is caught too: a counter's family name is not a series of its own.
    assert "mt_http_requests" not in exported_metrics.samples


def test_the_service_really_serves_the_core_series(exported_metrics: Exported) -> None:
    # After one translation and one 422 these have samples, not only HELP/TYPE lines.
    for name in (
        "mt_http_requests_total",
        "mt_http_request_duration_seconds_bucket",
        "mt_batch_size_segments_bucket",  # the default scheduler's (whole batches)
        "mt_generated_tokens_total",
        "mt_queue_depth_segments",
        "mt_in_flight_requests",
        "mt_rejected_requests_total",
    ):
        assert name in exported_metrics.samples, name


def test_latency_quantiles(dashboard: dict[str, Any]) -> None:
    latency = [e for e in exprs(dashboard) if "mt_http_request_duration_seconds_bucket" in e]
    quantiles = {float(m) for e in latency for m in re.findall(r"histogram_quantile\(([\d.]+)", e)}
    assert quantiles == {0.5, 0.95, 0.99}
    assert all("by (le" in e for e in latency)


@pytest.mark.parametrize(
    "needle",
    [
        "mt_http_requests_total",  # request rate
        "mt_queue_depth_segments",
        "mt_batch_size_segments",
        "mt_step_rows",
        "mt_running_segments",
        "mt_slots",
        "mt_time_to_first_step_seconds",
        "mt_generated_tokens_total",  # tokens/s
        'status=~"5.."',  # errors
        "mt_rejected_requests_total",
    ],
)
def test_panels_cover(dashboard: dict[str, Any], needle: str) -> None:
    assert any(needle in e for e in exprs(dashboard))


def test_panels_are_well_formed(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        assert panel["title"]
        assert panel["targets"]
        uid = panel["datasource"]["uid"]
        assert uid.removeprefix("${").removesuffix("}") in variables
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
    assert all("[$__rate_interval]" in e for e in exprs(dashboard) if "rate(" in e)


def test_compose_provisions_the_dashboard(dashboard: dict[str, Any]) -> None:
    (compose,) = load_yaml(REPO / "docker-compose.yml")
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.rsplit(":", 1)[0].split(":", 1) for volume in grafana["volumes"])
    for source in mounts:
        assert (REPO / source).exists(), source
    (provider,) = load_yaml(REPO / "deploy/grafana/provisioning/dashboards/transformer-mt.yml")
    path = provider["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/dashboard.json"].startswith(path + "/")
    (datasources,) = load_yaml(REPO / "deploy/grafana/provisioning/datasources/prometheus.yml")
    (variable,) = dashboard["templating"]["list"]
    assert variable["current"]["value"] == datasources["datasources"][0]["uid"]
    assert datasources["datasources"][0]["url"].startswith("http://prometheus:")
    assert "prometheus" in compose["services"]
