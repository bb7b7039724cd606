"""The chart's Grafana dashboard and alert rules: they render, every query parses as PromQL, and
every metric they query is one a running server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.conftest import start_server
from tests.deploy.chart import CHART, render

ON = {"monitoring": {"dashboard": {"enabled": True}, "alerts": {"enabled": True}}}
#: Grafana's variables, as a query's text holds them, and what stands for each when it is parsed.
VARIABLES = {"$__rate_interval": "5m", "$model": ".*"}


def dashboard_queries(rendered: Any) -> list[str]:
    config_map = rendered.named("ConfigMap", "search-infinity-server-dashboard")
    (text,) = config_map["data"].values()
    board = json.loads(text)
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def rule_queries(rendered: Any) -> list[str]:
    (rule,) = rendered.of_kind("PrometheusRule")
    return [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]


def selected_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (it must parse)."""
    import promql_parser

    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name is not None:
            found.add(node.name)
        for attribute in ("lhs", "rhs", "expr", "args", "param", "vector_selector"):
            child = getattr(node, attribute, None)
            for item in child if isinstance(child, list) else [child]:
                if item is not None and not isinstance(item, (str, int, float)):
                    walk(item)

    walk(promql_parser.parse(expr))
    return found


def test_monitoring_is_off_by_default() -> None:
    rendered = render(None)
    assert not rendered.of_kind("PrometheusRule")
    assert all(not c["metadata"]["name"].endswith("-dashboard") for c in rendered.of_kind("ConfigMap"))


def test_the_dashboard_is_the_charts_file_labelled_for_grafana() -> None:
    rendered = render(ON)
    config_map = rendered.named("ConfigMap", "search-infinity-server-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = config_map["data"].values()
    assert json.loads(text) == json.loads((CHART / "files" / "dashboard.json").read_text())
    board = json.loads(text)
    titles = [p["title"] for p in board["panels"]]
    for topic in ("Queue depth", "Admitted and refused", "Latency per model and route", "Items per batch"):
        assert any(t.startswith(topic) for t in titles), topic
    for topic in ("Batch occupancy", "Loads, evictions", "Memory per device", "cache hit ratio", "Batch jobs"):
        assert any(topic.lower() in t.lower() for t in titles), topic


def test_every_alert_has_a_name_a_severity_and_a_summary() -> None:
    (rule,) = render(ON).of_kind("PrometheusRule")
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    names = {r["alert"] for r in rules}
    assert names == {
        "InfinityRequestsRefused",
        "InfinityLatencyOverDeadline",
        "InfinityModelLoadFailed",
        "InfinityMemoryNearBudget",
        "InfinityBatchJobsStalled",
    }
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert r["annotations"]["description"], r["alert"]
        assert "{{ $labels." in r["annotations"]["summary"], "Prometheus fills the labels, not Helm"


@pytest.mark.parametrize(
    ("values", "threshold"),
    [({}, "> 120"), ({"server": {"request_timeout": 30}}, "> 30"), ({"latencySeconds": 5}, "> 5")],
)
def test_the_latency_alert_fires_past_the_deadline(values: dict[str, Any], threshold: str) -> None:
    alerts = {"enabled": True, **({"latencySeconds": values["latencySeconds"]} if "latencySeconds" in values else {})}
    chosen: dict[str, Any] = {"monitoring": {"alerts": alerts}}
    if "server" in values:
        chosen["server"] = values["server"]
    (rule,) = render(chosen).of_kind("PrometheusRule")
    (latency,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "InfinityLatencyOverDeadline"]
    assert latency["expr"].strip().endswith(threshold)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name a real server's `/metrics` can hold, read from its `# TYPE` lines, after a
    request has run."""
    batch_dir = tmp_path_factory.mktemp("batches")
    model = {"name": "fake", "source": "fake", "kind": "fake", "pin": True}
    settings = Settings(
        ServerSettings(batch_dir=str(batch_dir), access_log=False), registry_config({"models": [model]})
    )
    server = start_server(create_app(settings))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.post("/v1/embeddings", json={"model": "fake", "input": ["a sentence"]}).raise_for_status()
            text = client.get("/metrics").text
    finally:
        server.close()
    # A counter's TYPE line names its samples (`x_total`); a histogram's, the family of its series.
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names |= {family + s for s in suffixes.get(kind, ("",))}
    return names


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_queried_is_one_a_server_exports(exported: set[str], source: str) -> None:
    rendered = render(ON)
    queries = dashboard_queries(rendered) if source == "dashboard" else rule_queries(rendered)
    assert queries
    for expr in queries:
        selected = selected_metrics(expr)
        assert selected, expr
        assert selected <= exported, f"{sorted(selected - exported)} in {expr!r} is not exported"


def test_the_metric_check_sees_a_metric_no_server_exports(exported: set[str]) -> None:
    assert selected_metrics("sum(rate(infinity_no_such_thing_total[5m]))") - exported == {
        "infinity_no_such_thing_total"
    }
    with pytest.raises(Exception, match="unclosed left parenthesis"):
        selected_metrics("sum(rate(infinity_requests_total[5m])")


def test_the_readme_documents_the_monitoring_values() -> None:
    readme = (Path(CHART) / "README.md").read_text()
    for key in ("monitoring.dashboard.enabled", "monitoring.alerts.enabled", "monitoring.alerts.latencySeconds"):
        assert f"`{key}`" in readme, key
