"""Render the Helm chart offline with Helm itself (helm-python-sdk embeds Helm's Go library)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "infinity-server"
EXAMPLES = REPO / "deploy" / "helm" / "examples"
RELEASE, NAMESPACE = "search", "retrieval"


def example_values() -> dict[str, dict[str, Any] | None]:
    """The default values (None) and every example values file, by name."""
    sets: dict[str, dict[str, Any] | None] = {"defaults": None}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        sets[path.stem] = yaml.safe_load(path.read_text())
    return sets


@dataclass(frozen=True)
class Rendered:
    """Every object of one render, in template order."""

    objects: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [obj for obj in self.of_kind(kind) if obj["metadata"]["name"] == name]
        return found


def render(values: dict[str, Any] | None) -> Rendered:
    import helm_python

    manifests = helm_python.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for template, text in sorted(manifests.items()):
        if template.endswith(".yaml"):
            objects.extend(obj for obj in yaml.safe_load_all(text) if obj)
    return Rendered(tuple(objects))


def declared_kube_versions() -> list[str]:
    """The oldest Kubernetes release Chart.yaml's kubeVersion accepts, and the newest with schemas here."""
    from kubernetes_validate.utils import latest_version

    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+\.\d+)\.\d+(-0)?", constraint)
    assert match, f"kubeVersion {constraint!r} is not of the form '>=X.Y.Z-0' these tests read"
    return [match.group(1), latest_version()]


def container(deployment: dict[str, Any], name: str = "server") -> dict[str, Any]:
    (found,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def env_of(container_spec: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container_spec.get("env", [])}
