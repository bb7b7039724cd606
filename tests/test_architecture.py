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


#: What a dialect module may import from this project: the shared edge helpers and schemas.
_DIALECT_MAY_IMPORT = (
    "infinity_server.api",
    "infinity_server.auth",
    "infinity_server.encoding",
    "infinity_server.errors",
    "infinity_server.schemas",
    "infinity_server.media",
    "infinity_server.settings",
)
#: Engine internals a dialect never touches: it makes registry calls and writes their results.
_ENGINE_INTERNALS = frozenset({"run", "forward", "prepare", "preprocess", "postprocess", "adapter", "queue", "put"})


def test_dialect_modules_import_only_the_registry_api_and_shared_helpers() -> None:
    for path, names in imported_modules("infinity_server").items():
        if not path.startswith("infinity_server/api/"):
            continue
        engine = {n for n in names if n.startswith("model_registry.")}
        assert not engine, f"{path} imports engine internals {engine}; use the names `model_registry` exports"
        heavy = {n for n in names if n.split(".")[0] in {"numpy", "torch", "transformers"}}
        assert not heavy, f"{path} imports {heavy}; array work belongs to infinity_server.encoding or the engine"
        edge = {n for n in names if n.startswith("infinity_server.") and not n.startswith(_DIALECT_MAY_IMPORT)}
        assert not edge, f"{path} imports {edge}"


def test_no_dialect_module_calls_a_model_or_builds_a_batch() -> None:
    for path in (SRC / "infinity_server" / "api").glob("*.py"):
        tree = ast.parse(path.read_text())
        touched = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and (node.attr in _ENGINE_INTERNALS or (node.attr.startswith("_") and not node.attr.startswith("__")))
        }
        assert not touched, f"{path.name} reaches into the engine: {sorted(touched)}"


def test_the_dialect_modules_do_not_import_each_other_in_a_circle() -> None:
    modules = imported_modules("infinity_server")
    graph = {
        path.removesuffix(".py").replace("/", "."): {n for n in names if n.startswith("infinity_server.api.")}
        for path, names in modules.items()
        if path.startswith("infinity_server/api/")
    }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        nexts = graph.get(start, set())
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in nexts)

    circular = [module for module in graph if reaches(module, module, set())]
    assert not circular, f"import circle through {circular}"


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
        "model_registry/backends/packed.py",  # the engine's padding-free batches
        "model_registry/backends/onnx_export.py",  # exporting to ONNX traces the torch model
        "model_registry/memory.py",  # CUDA memory probing, imported only when CUDA is asked about
    )
    for path, names in imported_modules("model_registry").items():
        if any(n.split(".")[0] == "torch" for n in names):
            assert path.startswith(allowed), f"{path} imports torch"
