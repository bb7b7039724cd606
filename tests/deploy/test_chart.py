"""The Helm chart, rendered offline by Helm for the default values and each example values file.

Every core object is validated against the Kubernetes schemas of the releases Chart.yaml declares;
then what schemas cannot see is checked against this very server: each group's ConfigMap loads as
its configuration, probes hit real routes, the HPA's metric is one the server exports with the
labels selected, the drain fits the grace period, the keys file is where the server reads it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infinity_server.app import create_app
from infinity_server.metrics import Metrics
from infinity_server.settings import ENV_PREFIX, ServerSettings, Settings, load_settings
from model_registry import Registry
from model_registry.config import parse_budget
from tests.deploy.chart import (
    CHART,
    RELEASE,
    Rendered,
    container,
    declared_kube_versions,
    env_of,
    example_values,
    render,
)

VALUES = example_values()
CRDS = {"monitoring.coreos.com/v1": {"ServiceMonitor", "PrometheusRule"}, "gateway.networking.k8s.io/v1": {"HTTPRoute"}}
SCOPES = {"inference", "admin", "metrics", "priority"}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def test_the_values_sets_are_the_defaults_and_three_realistic_files() -> None:
    assert set(VALUES) == {"defaults", "cpu-single-group", "gpu-and-cpu-groups", "baked-weights-with-keys"}


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, Rendered]:
    return request.param, render(VALUES[request.param])


def bytes_of(quantity: str) -> int:
    match = _QUANTITY.match(str(quantity))
    assert match, f"unexpected Kubernetes quantity {quantity!r}"
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def group_configs(objects: Rendered, tmp_path: Path) -> dict[str, Settings]:
    """Each group's models.yaml, loaded by the server's own settings loader (no environment)."""
    configs = {}
    for config_map in objects.of_kind("ConfigMap"):
        if "models.yaml" not in config_map["data"]:  # the dashboard's
            continue
        path = tmp_path / f"{config_map['metadata']['name']}.yaml"
        path.write_text(config_map["data"]["models.yaml"])
        configs[config_map["metadata"]["name"]] = load_settings(path, environ={})
    return configs


def test_every_core_object_validates_against_the_declared_kubernetes_versions(rendered: tuple[str, Rendered]) -> None:
    import kubernetes_validate

    _, objects = rendered
    versions = declared_kube_versions()
    for kind in ("Deployment", "Service", "ConfigMap"):
        assert objects.of_kind(kind), f"no {kind} rendered"
    for obj in objects.objects:
        if obj["apiVersion"] in CRDS:
            assert obj["kind"] in CRDS[obj["apiVersion"]]
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: {error.message}")


@pytest.mark.parametrize("name", sorted(VALUES))
def test_helm_lint_finds_no_warning(name: str) -> None:
    import helm_python

    for version in declared_kube_versions():
        report = helm_python.lint(CHART, VALUES[name], strict=True, kube_version=f"v{version}.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_each_group_is_a_deployment_service_configmap_pdb_and_hpa_of_its_own(rendered: tuple[str, Rendered]) -> None:
    name, objects = rendered
    groups = (VALUES[name] or {}).get("groups") or [{"name": "default"}]
    for group in groups:
        full = f"{RELEASE}-infinity-server-{group['name']}"
        deployment = objects.named("Deployment", full)
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        assert objects.named("Service", full)["spec"]["selector"] == selector
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == objects.named("ConfigMap", full)["metadata"]["name"]
        if group.get("podDisruptionBudget", {}).get("enabled", True):
            assert objects.named("PodDisruptionBudget", full)["spec"]["selector"]["matchLabels"] == selector
        if group.get("autoscaling", {}).get("enabled", True):
            hpa = objects.named("HorizontalPodAutoscaler", full)
            assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": full}
            assert "replicas" not in deployment["spec"]
        else:
            assert deployment["spec"]["replicas"] == group.get("replicas", 1)


def test_each_group_configmap_loads_as_this_servers_configuration(
    rendered: tuple[str, Rendered], tmp_path: Path
) -> None:
    name, objects = rendered
    groups = {f"{RELEASE}-infinity-server-{g['name']}": g for g in (VALUES[name] or {}).get("groups", [])}
    for full, settings in group_configs(objects, tmp_path).items():
        server = container(objects.named("Deployment", full))
        assert settings.server.port == server["ports"][0]["containerPort"]
        if full in groups:
            assert [spec.name for spec in settings.registry.models] == [m["name"] for m in groups[full]["models"]]
            assert settings.registry.memory_budget == groups[full]["memoryBudget"]
        limits = server["resources"].get("limits", {})
        if "nvidia.com/gpu" not in limits:
            # On CPU a budget is of RAM: it must fit inside the container, or the kernel kills the pod.
            budget = parse_budget(settings.registry.memory_budget, total=0)
            assert 0 < budget < bytes_of(limits["memory"]), (full, settings.registry.memory_budget, limits)


def test_probes_point_at_real_routes_of_the_app(rendered: tuple[str, Rendered]) -> None:
    _, objects = rendered
    app = create_app(load_settings(None, environ={}))
    get_routes = {
        str(getattr(route, "path", "")) for route in app.routes if "GET" in (getattr(route, "methods", None) or ())
    }
    for deployment in objects.of_kind("Deployment"):
        server = container(deployment)
        port_names = {port["name"] for port in server["ports"]}
        probes = {kind: server[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
        for probe in probes.values():
            assert probe["httpGet"]["path"] in get_routes
            assert probe["httpGet"]["port"] in port_names
        assert probes["readiness"]["httpGet"]["path"] == "/ready"
        assert probes["liveness"]["httpGet"]["path"] == "/health"
        # Pinned models load before the server answers: a slow load must not be killed as dead.
        assert probes["startup"]["periodSeconds"] * probes["startup"]["failureThreshold"] >= 300


def test_the_autoscaler_metric_is_one_the_server_exports_with_those_labels(
    rendered: tuple[str, Rendered], tmp_path: Path
) -> None:
    _, objects = rendered
    configs = group_configs(objects, tmp_path)
    for hpa in objects.of_kind("HorizontalPodAutoscaler"):
        settings = configs[hpa["spec"]["scaleTargetRef"]["name"]]
        exposition = Metrics().exposition(Registry(settings.registry)).decode()
        gauges = {
            (sample.name, tuple(sorted(sample.labels.items())))
            for family in text_string_to_metric_families(exposition)
            if family.type == "gauge"
            for sample in family.samples
        }
        custom = [m.get("pods") or m.get("external") for m in hpa["spec"]["metrics"] if m["type"] != "Resource"]
        for metric in custom:
            selected = (metric["metric"]["name"], tuple(sorted(metric["metric"]["selector"]["matchLabels"].items())))
            assert selected in gauges, f"{selected} is not a gauge the server exports; it has {sorted(gauges)}"
            assert metric["target"]["type"] == "AverageValue"
        if custom:
            assert {c["metric"]["selector"]["matchLabels"]["model"] for c in custom} == {
                spec.name for spec in settings.registry.models
            }


def test_the_drain_fits_inside_the_termination_grace_period(rendered: tuple[str, Rendered], tmp_path: Path) -> None:
    _, objects = rendered
    configs = group_configs(objects, tmp_path)
    for deployment in objects.of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        sleep = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep"
        grace = configs[deployment["metadata"]["name"]].server.graceful_timeout
        assert pod["terminationGracePeriodSeconds"] > float(sleep[1]) + grace


def test_the_model_cache_mode_decides_init_container_volume_and_claim(rendered: tuple[str, Rendered]) -> None:
    name, objects = rendered
    mode = ((VALUES[name] or {}).get("modelCache") or {}).get("mode", "download")
    for deployment in objects.of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        server = container(deployment)
        env = env_of(server)
        assert env["HF_HUB_OFFLINE"] == "1", "a pod must never need the hub to start"
        volumes = {v["name"]: v for v in pod["volumes"]}
        if mode == "baked":
            assert "initContainers" not in pod
            assert "model-cache" not in volumes
            continue
        (init,) = pod["initContainers"]
        assert init["image"] == server["image"]
        assert init["args"] == ["download", "--config", env["INFINITY_SERVER_CONFIG"]]
        assert "HF_HUB_OFFLINE" not in env_of(init)
        assert env_of(init)["HF_HOME"] == env["HF_HOME"]
        mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
        assert (
            mounts["model-cache"]
            == env["HF_HOME"]
            == {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["model-cache"]
        )
        assert posixpath.dirname(env["INFINITY_SERVER_CONFIG"]) == mounts["config"]
        if mode == "pvc":
            claim = volumes["model-cache"]["persistentVolumeClaim"]["claimName"]
            pvc = objects.named("PersistentVolumeClaim", claim)
            assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        else:
            assert "emptyDir" in volumes["model-cache"]


def test_gateway_routes_match_one_header_per_model_to_the_groups_service(
    rendered: tuple[str, Rendered], tmp_path: Path
) -> None:
    _, objects = rendered
    configs = group_configs(objects, tmp_path)
    routed: list[str] = []
    for route in objects.of_kind("HTTPRoute"):
        (rule,) = route["spec"]["rules"]
        (backend,) = rule["backendRefs"]
        service = objects.named("Service", backend["name"])
        assert backend["port"] == service["spec"]["ports"][0]["port"]
        models = []
        for match in rule["matches"]:
            (header,) = match["headers"]
            assert (header["type"], header["name"]) == ("Exact", "X-Gateway-Model-Name")
            models.append(header["value"])
        assert models == [spec.name for spec in configs[backend["name"]].registry.models]
        routed.extend(models)
    assert len(routed) == len(set(routed)), "a model routed to two groups"
    if objects.of_kind("HTTPRoute"):
        assert len(objects.of_kind("HTTPRoute")) == len(objects.of_kind("Deployment"))


def test_service_monitors_scrape_the_metrics_route_of_each_group(rendered: tuple[str, Rendered]) -> None:
    _, objects = rendered
    for monitor in objects.of_kind("ServiceMonitor"):
        service = objects.named("Service", monitor["metadata"]["name"])
        assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == (service["spec"]["ports"][0]["name"], "/metrics")


def keys_file_of(objects: Rendered) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """(the server container, the keys file path it is told, the list the Secret puts there)."""
    (secret,) = objects.of_kind("Secret")
    deployment = objects.of_kind("Deployment")[0]
    server = container(deployment)
    path = env_of(server)[ENV_PREFIX + "API_KEYS_FILE"]
    mount = next(m for m in server["volumeMounts"] if m["name"] == "api-keys")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    (item,) = volume["secret"]["items"]
    assert posixpath.join(mount["mountPath"], item["path"]) == path
    return server, path, yaml.safe_load(secret["stringData"][item["key"]])


def test_the_api_keys_secret_holds_the_list_the_server_reads() -> None:
    objects = render(VALUES["baked-weights-with-keys"])
    _, path, entries = keys_file_of(objects)
    assert path.endswith(".yaml")
    for entry in entries:
        assert {"name", "scopes"} <= entry.keys()
        secrets = entry.keys() & {"key", "sha256", "key_env", "key_file"}
        assert len(secrets) == 1, f"{entry['name']}: exactly one of key, sha256, key_env, key_file"
        assert set(entry["scopes"]) <= SCOPES
        if "sha256" in entry:
            assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
    assert not render(VALUES["defaults"]).of_kind("Secret")


def test_the_server_loads_the_rendered_keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "api_keys_file" not in ServerSettings.model_fields:
        pytest.skip("server.api_keys_file (INFINITY_SERVER_API_KEYS_FILE) is not in this branch's settings yet")
    objects = render(VALUES["baked-weights-with-keys"])
    server, _, entries = keys_file_of(objects)
    keys = tmp_path / "api_keys.yaml"
    keys.write_text(yaml.safe_dump(entries))
    config = tmp_path / "models.yaml"
    config.write_text(objects.of_kind("ConfigMap")[0]["data"]["models.yaml"])
    settings = load_settings(config, environ={ENV_PREFIX + "API_KEYS_FILE": str(keys)})
    assert settings.server.model_dump()["api_keys_file"] == str(keys)
    # The group's env gives the operator key through key_env; building the app resolves every key.
    assert "INFINITY_OPERATOR_KEY" in env_of(server)
    monkeypatch.setenv("INFINITY_OPERATOR_KEY", "operator-secret")
    create_app(settings)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"groups": []}, "at least one model group"),
        ({"groups": [{"name": "Embedders", "models": [{"name": "a", "source": "x/a"}]}]}, "at '/groups/0/name'"),
        (
            {"groups": [{"name": "a", "replica": 2, "models": [{"name": "m", "source": "x/m"}]}]},
            "additional properties 'replica' not allowed",
        ),
        ({"groups": [{"name": "a", "models": []}]}, "serves at least one model"),
        (
            {"groups": [{"name": "a", "models": [{"name": "m", "source": "x/m"}]}] * 2},
            'groups[1].name: "a" is used by two groups',
        ),
        (
            {
                "groups": [
                    {"name": "a", "models": [{"name": "m", "source": "x/m"}]},
                    {"name": "b", "models": [{"name": "m", "source": "x/m"}]},
                ]
            },
            'model "m" is in groups a and b',
        ),
        (
            {
                "groups": [
                    {
                        "name": "a",
                        "models": [{"name": "BAAI/bge-m3", "source": "BAAI/bge-m3"}],
                        "autoscaling": {"queueDepth": {"enabled": True}},
                    }
                ]
            },
            "cannot be a metric label selector value",
        ),
        ({"modelCache": {"mode": "s3"}}, "value must be one of 'download', 'pvc', 'baked'"),
    ],
)
def test_mistakes_in_the_values_fail_the_render_naming_the_key(values: dict[str, Any], message: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError) as raised:
        render(values)
    assert message in str(raised.value)


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the leaves (resource maps and Kubernetes objects count as one value)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if (
            isinstance(value, dict)
            and value
            and key not in {"resources", "initResources", "seccompProfile", "capabilities"}
        ):
            paths.extend(value_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


def test_the_chart_readme_describes_every_value() -> None:
    readme = (CHART / "README.md").read_text().partition("\n## Values\n")[2]
    documented = set(re.findall(r"^\| `([\w.\[\]-]+)` \|", readme, re.M))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in value_paths(defaults) if path not in documented]
    assert not missing, f"values not in {CHART / 'README.md'}'s table: {missing}"
    stale = [path for path in documented if path not in value_paths(defaults) and not path.startswith("groups[]")]
    assert not stale, f"{CHART / 'README.md'} describes values the chart does not have: {stale}"
