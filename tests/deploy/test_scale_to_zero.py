"""The chart with a group that scales to zero: KEDA's ScaledObject, validated against KEDA's own
schema (the models `cloudcoil.models.keda` generates from KEDA's CRDs, with unknown keys refused
too), and the gate that holds the group's requests, checked against the gate itself: its
configuration loads, its probes and the scaler's URL are its routes, the figure KEDA reads is one
it answers, and the group's route goes through it.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from pydantic import BaseModel

from infinity_server.gate import create_gate_app, load_gate_settings
from tests.deploy.chart import CHART, NAMESPACE, RELEASE, Rendered, container, declared_kube_versions, render

ZERO = f"{RELEASE}-infinity-server-embed"
HOT = f"{RELEASE}-infinity-server-hot"
GATE = f"{RELEASE}-infinity-server-gate"


def values(**gate: Any) -> dict[str, Any]:
    return {
        "gateway": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]},
        "gate": gate,
        "groups": [
            {
                "name": "embed",
                "models": [{"name": "minilm", "source": "sentence-transformers/all-MiniLM-L6-v2"}],
                "autoscaling": {"maxReplicas": 3, "scaleToZero": {"enabled": True, "targetInFlight": 4}},
            },
            {"name": "hot", "models": [{"name": "reranker", "source": "cross-encoder/ms-marco-MiniLM-L6-v2"}]},
        ],
    }


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(values())


def unknown_keys(model: type[BaseModel], data: Any, where: str) -> list[str]:
    """Keys of `data` that the KEDA model (and its nested models) does not declare."""
    if not isinstance(data, dict):
        return []
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    found = []
    for key, value in data.items():
        if key not in fields:
            found.append(f"{where}.{key}")
            continue
        for inner in _models_in(fields[key].annotation):
            items = value if isinstance(value, list) else list(value.values()) if inner is dict else [value]
            for item in items if isinstance(items, list) else [items]:
                found += unknown_keys(inner, item, f"{where}.{key}")
    return found


def _models_in(annotation: Any) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, typing.List):  # noqa: UP006
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def test_the_scaled_object_validates_against_kedas_schema(rendered: Rendered) -> None:
    import cloudcoil.models.keda.v1alpha1 as keda

    (scaled,) = rendered.of_kind("ScaledObject")
    keda.ScaledObject.model_validate(scaled)
    assert unknown_keys(keda.ScaledObject, scaled, "ScaledObject") == []
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": ZERO}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 3)


def test_the_checker_refuses_what_keda_does_not_declare(rendered: Rendered) -> None:
    import cloudcoil.models.keda.v1alpha1 as keda

    (scaled,) = rendered.of_kind("ScaledObject")
    wrong = {**scaled, "spec": {**scaled["spec"], "minReplicas": 0}}
    assert unknown_keys(keda.ScaledObject, wrong, "ScaledObject") == ["ScaledObject.spec.minReplicas"]
    trigger = {**scaled["spec"]["triggers"][0], "metricKind": "x"}
    wrong = {**scaled, "spec": {**scaled["spec"], "triggers": [trigger]}}
    assert unknown_keys(keda.ScaledObject, wrong, "ScaledObject") == ["ScaledObject.spec.triggers.metricKind"]


def test_the_zero_group_has_no_hpa_and_no_fixed_replicas(rendered: Rendered) -> None:
    assert [h["metadata"]["name"] for h in rendered.of_kind("HorizontalPodAutoscaler")] == [HOT]
    assert "replicas" not in rendered.named("Deployment", ZERO)["spec"]


def test_the_zero_groups_route_goes_through_the_gate(rendered: Rendered) -> None:
    backends = {r["metadata"]["name"]: r["spec"]["rules"][0]["backendRefs"] for r in rendered.of_kind("HTTPRoute")}
    assert [b["name"] for b in backends[ZERO]] == [GATE]
    assert [b["name"] for b in backends[HOT]] == [HOT]


def test_the_gate_objects_validate_against_kubernetes(rendered: Rendered) -> None:
    import kubernetes_validate

    for kind in ("Deployment", "Service", "ConfigMap"):
        obj = rendered.named(kind, GATE)
        for version in declared_kube_versions():
            kubernetes_validate.validate(obj, version, strict=True)


def test_helm_lint_passes_with_a_group_at_zero() -> None:
    import helm_python

    for version in declared_kube_versions():
        report = helm_python.lint(CHART, values(), strict=True, kube_version=f"v{version}.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_gate_serves_its_rendered_configuration(rendered: Rendered, tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(rendered.named("ConfigMap", GATE)["data"]["gate.yaml"])
    settings = load_gate_settings(path)
    (group,) = settings.groups
    service = rendered.named("Service", ZERO)
    assert (group.name, group.models) == ("embed", ["minilm"])
    assert group.url == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    deployment = rendered.named("Deployment", GATE)
    server = container(deployment, "gate")
    mounted = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert server["command"][-1] == f"{mounted['config']}/gate.yaml"
    gate_service = rendered.named("Service", GATE)
    assert gate_service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()

    (scaled,) = rendered.of_kind("ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "metrics-api"
    url = urlparse(trigger["metadata"]["url"])
    assert url.hostname == f"{GATE}.{NAMESPACE}.svc"
    assert url.port == gate_service["spec"]["ports"][0]["port"] == settings.port

    # the scaler's URL, the probes and the figure KEDA reads, asked of the gate itself
    from starlette.testclient import TestClient

    with TestClient(create_gate_app(settings)) as client:
        figures = client.get(url.path)
        assert figures.status_code == 200
        assert isinstance(figures.json()[trigger["metadata"]["valueLocation"]], int)
        for probe in ("readinessProbe", "livenessProbe"):
            assert client.get(server[probe]["httpGet"]["path"]).status_code == 200


def test_with_prometheus_keda_sums_every_gate_pod(tmp_path: Path) -> None:
    import promql_parser
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.testclient import TestClient

    rendered = render(values(replicas=2, prometheusAddress="http://prometheus:9090"))
    (scaled,) = rendered.of_kind("ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = promql_parser.parse(trigger["metadata"]["query"])
    assert isinstance(query, promql_parser.AggregateExpr)
    assert str(query.op) == "sum"
    path = tmp_path / "gate.yaml"
    path.write_text(rendered.named("ConfigMap", GATE)["data"]["gate.yaml"])
    with TestClient(create_gate_app(load_gate_settings(path))) as client:
        client.get("/gate/groups/embed")
        names = {f.name for f in text_string_to_metric_families(client.get("/gate/metrics").text)}
    assert getattr(query.expr, "name", None) in names
    assert 'group="embed"' in trigger["metadata"]["query"]


def test_a_group_named_gate_beside_a_group_at_zero_fails_the_render() -> None:
    chosen = values()
    chosen["groups"][1]["name"] = "gate"
    with pytest.raises(Exception, match="would share its objects' names with the gate"):
        render(chosen)


def test_the_gate_refuses_a_bad_configuration(tmp_path: Path) -> None:
    from model_registry.errors import ConfigError

    path = tmp_path / "gate.yaml"
    group = {"name": "a", "url": "http://a:7997", "models": ["m"]}
    path.write_text(str({"gate": {"groups": [group, {**group, "name": "b"}]}}).replace("'", '"'))
    with pytest.raises(ConfigError, match="model 'm' is in two groups: a and b"):
        load_gate_settings(path)
    path.write_text('{"gate": {"groups": [{"name": "a", "url": "http://a", "models": ["m"]}], "wait_seconds": 0}}')
    with pytest.raises(ConfigError, match=r"gate\.wait_seconds: Input should be greater than 0"):
        load_gate_settings(path)
