"""Dependencies point one way, and heavy backends stay lazy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def imported_modules(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (SRC / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        found[str(path.relative_to(SRC))] = names
    return found


def test_the_engine_knows_nothing_of_http() -> None:
    for path, names in imported_modules("model_registry").items():
        offending = {n for n in names if n.split(".")[0] in {"infinity_server", "starlette", "hypercorn"}}
        assert not offending, f"{path} imports {offending}"


def test_the_contract_modules_are_leaves() -> None:
    modules = imported_modules("model_registry")
    for leaf in ("model_registry/types.py", "model_registry/errors.py"):
        internal = {n for n in modules[leaf] if n.startswith(("model_registry", "infinity_server"))}
        assert not internal, f"{leaf} imports {internal}"
    base = {n for n in modules["model_registry/adapters/base.py"] if n.startswith("model_registry")}
    assert base <= {"model_registry.types"}


def test_importing_the_packages_does_not_import_torch() -> None:
    code = "import sys, model_registry, infinity_server.app; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_adapters_import_engines_never_the_reverse() -> None:
    for path, names in imported_modules("model_registry").items():
        if path.startswith("model_registry/backends/"):
            upward = {n for n in names if n.startswith(("model_registry.adapters", "model_registry.registry"))}
            assert not upward, f"{path} imports {upward}: engines sit below the adapters"
    base = imported_modules("model_registry")["model_registry/backends/base.py"]
    assert {n for n in base if n.startswith("model_registry")} == set(), "the engine contract is a leaf"
    assert {n.split(".")[0] for n in base} <= {"__future__", "abc", "dataclasses", "pathlib", "typing", "numpy"}


def test_torch_is_imported_only_by_its_engine_and_the_adapters_that_need_it() -> None:
    allowed = (
        "model_registry/adapters/",  # heads, pooling and media towers run on torch
        "model_registry/backends/torch.py",  # the engine
        "model_registry/backends/onnx_export.py",  # exporting to ONNX traces the torch model
        "model_registry/memory.py",  # CUDA memory probing, imported only when CUDA is asked about
    )
    for path, names in imported_modules("model_registry").items():
        if any(n.split(".")[0] == "torch" for n in names):
            assert path.startswith(allowed), f"{path} imports torch"
