"""Dependencies point one way, and heavy backends stay lazy.

Every import counts, the ones inside functions too: a lazy import is a dependency that only
waits for its first call. Imports under `if TYPE_CHECKING:` do not: they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: The engine's layers, top first. A module may import from its own layer or the ones below it,
#: never from one above; within a layer, no two modules import each other in a circle.
#: A subpackage (`adapters`, `backends`) is one entry.
ENGINE_LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "__init__ sync",  # the public faces
        "registry",  # runs requests: lease, admission, prepare, queue
        "tasks",  # embed, rerank, score, classify, rank media, tokenize, over `Runner.run`
        "runtime",  # lifecycle, leases, queues, workers, admission, warm-up, memory
        "cache",  # results by content
        "adapters",  # the model families' code
        "media",  # decoding, pages, similarity
        "detection",  # what a directory holds
        "families",  # what each family is, declared
        "config",
        "backends",  # the engines, each declared by its package
        "zoo",  # what published models look like: files, templates, sources, the catalogue
        "types errors",  # the contract's leaves
    )
)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, names: bool) -> Iterator[str]:
    """Every module `tree` imports at run time, in functions too; with `names`, also `a.b` for
    each `from a import b`, as `b` may be a module."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (name for child in node.orelse for name in _imports(child, names))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            if names:
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from _imports(node, names)


def module_imports(root: Path, package: str, *, names: bool = False) -> dict[str, set[str]]:
    """Per module of `package` under `root` (as `package/sub/module.py`), the modules it imports."""
    return {
        str(path.relative_to(root)): set(_imports(ast.parse(path.read_text()), names))
        for path in sorted((root / package).rglob("*.py"))
    }


def imported_modules(package: str) -> dict[str, set[str]]:
    return module_imports(SRC, package)


def _entry(package: str, name: str) -> str:
    """`package.adapters.dense` -> 'adapters'; `package.registry` -> 'registry'; `package` -> '__init__'."""
    parts = name.split(".")[1:]
    return parts[0] if parts else "__init__"


def layer_violations(root: Path, package: str, layers: Sequence[frozenset[str]]) -> list[str]:
    """Each import of a module from a layer above the importer's, and each module in no layer."""
    rank = {entry: i for i, layer in enumerate(layers) for entry in layer}
    found = []
    for path, names in module_imports(root, package, names=True).items():
        dotted = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        own = _entry(package, dotted)
        if own not in rank:
            found.append(f"{path} is in no layer; add '{own}' to one")
            continue
        # The package itself is imported before any of its modules: never a new dependency.
        targets = {_entry(package, n) for n in names if n.split(".")[0] == package} - {"__init__"}
        above = sorted(t for t in targets if t in rank and rank[t] < rank[own])
        found.extend(f"{path} imports {package}.{target}, from a layer above its own" for target in above)
    return found


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Circles among the modules of `package` (every import counts, lazy ones too)."""
    imports = module_imports(root, package, names=True)
    modules = {
        path.removesuffix(".py").replace("/", ".").removesuffix(".__init__"): names for path, names in imports.items()
    }
    graph = {m: {n for n in names if n in modules and n != m and n != package} for m, names in modules.items()}
    cycles, state = [], dict.fromkeys(graph, 0)

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state[target] == 1:
                cycles.append([*trail[trail.index(target) :], target])
            elif state[target] == 0:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [module])
    return cycles


def test_the_engine_is_layered_with_lazy_imports_counted() -> None:
    assert layer_violations(SRC, "model_registry", ENGINE_LAYERS) == []


def test_no_engine_module_imports_itself_in_a_circle() -> None:
    assert import_cycles(SRC, "model_registry") == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    "importer",
    [
        "from pkg.top import run\n",  # at the top of the module
        "def late():\n    from pkg.top import run\n    return run\n",  # inside a function
        "class Late:\n    def method(self):\n        import pkg.top\n",  # inside a method
    ],
)
def test_the_layer_check_sees_an_upward_import_wherever_it_is(tmp_path: Path, importer: str) -> None:
    root = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/top.py": "from pkg import low\n", "pkg/low.py": importer})
    layers = (frozenset({"__init__"}), frozenset({"top"}), frozenset({"low"}))
    assert layer_violations(root, "pkg", layers) == ["pkg/low.py imports pkg.top, from a layer above its own"]
    assert import_cycles(root, "pkg") == [["pkg.low", "pkg.top", "pkg.low"]]


def test_the_layer_check_lets_typing_only_imports_through(tmp_path: Path) -> None:
    low = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import run\n"
    root = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/top.py": "from pkg import low\n", "pkg/low.py": low})
    layers = (frozenset({"__init__"}), frozenset({"top"}), frozenset({"low"}))
    assert layer_violations(root, "pkg", layers) == []
    assert import_cycles(root, "pkg") == []


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


def test_the_engine_root_is_its_faces_and_leaves_and_the_layers_are_its_folders() -> None:
    root = SRC / "model_registry"
    modules = sorted(p.stem for p in root.glob("*.py"))
    folders = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 12, modules
    entries = {entry for layer in ENGINE_LAYERS for entry in layer}
    assert entries == {*modules, *folders}, "each folder and root module is one entry of ENGINE_LAYERS"


#: The engine's public face: its package (which re-exports the registry, its results and the
#: observers a server hangs on a request) and the contract modules at its root.
_PUBLIC_FACE = frozenset({"model_registry", "model_registry.errors", "model_registry.types", "model_registry.config"})


def test_the_server_reaches_the_engine_only_through_its_public_face() -> None:
    for path, names in imported_modules("infinity_server").items():
        inside = {n for n in names if n.split(".")[0] == "model_registry"} - _PUBLIC_FACE
        assert not inside, f"{path} imports engine internals {sorted(inside)}"


def test_reading_the_declarations_imports_no_engine() -> None:
    code = (
        "import sys; from model_registry import backends, families; from model_registry.detection import rules; "
        "backends.declared(); families.declared(); rules.all_rules(); "
        "sys.exit(sorted({'torch', 'onnxruntime', 'ctranslate2', 'transformers'} & set(sys.modules)) or None)"
    )
    ran = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr


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
    "infinity_server.fetch",
    "infinity_server.routing",
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
        "model_registry/backends/torch/engine.py",  # the engine
        "model_registry/backends/torch/packed.py",  # the engine's padding-free batches
        "model_registry/backends/torch/graphs.py",  # the engine's CUDA graphs
        "model_registry/backends/torch/fp8.py",  # the engine's fp8 layers, torch imported by the load that asks
        "model_registry/backends/torch/lora.py",  # task adapters on the engine's layers and in an export
        "model_registry/backends/onnx/export.py",  # exporting to ONNX traces the torch model
        "model_registry/runtime/memory.py",  # CUDA memory probing, imported only when CUDA is asked about
        "model_registry/backends/devices.py",  # whether there is a CUDA device, asked only for `device: auto`
    )
    for path, names in imported_modules("model_registry").items():
        if any(n.split(".")[0] == "torch" for n in names):
            assert path.startswith(allowed), f"{path} imports torch"
