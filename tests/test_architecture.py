"""The package's shape: imports go one way, sub-packages keep to their layers, Spark stays out.

The import graph is read from the source (every ``import``, including those inside functions;
``if TYPE_CHECKING:`` blocks are left out, as they never run), so a cycle hidden in a function
body is found as surely as one at the top of a module.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coordinator"

# Each layer may import the layers before it (and itself); "coordinator" is the package's public re-exports.
LAYERS = ["foundation", "zookeeper", "iceberg", "protocol", "history", "serving", "job", "tidemark", "operations"]
FOUNDATION = {"coordinator.crashpoints", "coordinator.errors", "coordinator.formatting", "coordinator.names",
              "coordinator.records", "coordinator.settings", "coordinator.uncaught"}
MAY_IMPORT = {
    "foundation": {"foundation"},
    "zookeeper": {"foundation", "zookeeper"},
    "iceberg": {"foundation", "iceberg"},
    "protocol": {"foundation", "zookeeper", "iceberg", "protocol"},
    "history": {"foundation", "zookeeper", "iceberg", "protocol", "history"},
    "serving": {"foundation", "zookeeper", "iceberg", "protocol", "history", "serving"},
    "job": {"foundation", "zookeeper", "iceberg", "protocol", "history", "job"},
    "tidemark": {"foundation", "zookeeper", "iceberg", "protocol", "tidemark"},
    "operations": set(LAYERS),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    if module == "coordinator.tidemark":
        return "tidemark"
    return module.split(".")[1]


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Each module's imports of the package's modules: those that run, and with ``typing`` also those under ``if
    TYPE_CHECKING:`` (they never run, but a type a lower layer names is still an upward dependency)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {module: imports(ast.parse(path.read_text(), str(path)), module, set(modules), typing)
            for module, path in modules.items()}


def imports(tree: ast.AST, module: str, modules: set[str], typing: bool = False) -> set[str]:
    found: set[str] = set()
    for node in (ast.walk(tree) if typing else _runtime_nodes(tree)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{module}: relative import; the package uses absolute imports only")
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        found |= {t for t in targets if t in modules and t != module}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_of_the_package_imports_itself_through_a_cycle():
    graph = {m: deps - {"coordinator"} for m, deps in import_graph().items() if m != "coordinator"}
    assert find_cycle(graph) is None


def test_each_sub_package_imports_only_the_layers_below_it():
    wrong = []
    for module, deps in import_graph(typing=True).items():
        if module == "coordinator":
            continue
        if "coordinator" in deps:
            wrong.append(f"{module} imports the package root (import from the defining module instead)")
        for dep in deps - {"coordinator"}:
            if layer_of(dep) not in MAY_IMPORT[layer_of(module)]:
                wrong.append(f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})")
    assert wrong == []


def test_the_layer_check_sees_an_import_made_for_type_checking_only():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from coordinator.protocol.registry import X\n")
    modules = {"coordinator.errors", "coordinator.protocol.registry"}
    assert imports(tree, "coordinator.errors", modules) == set()
    assert imports(tree, "coordinator.errors", modules, typing=True) == {"coordinator.protocol.registry"}


def private_names(tree: ast.AST) -> set[str]:
    """The ``_names`` a module defines: its functions, classes and methods, and attributes it sets on ``self``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
            found.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            found.add(target.id if isinstance(target, ast.Name) else getattr(target, "attr", ""))
    return {n for n in found if n.startswith("_") and not n.startswith("__")}


def reaches_into(sources: dict[str, str]) -> list[str]:
    """``module:line what`` for each use of another module's private name: ``from m import _x``, or ``obj._x``
    (on anything but ``self``/``cls``) where ``_x`` is defined by another module of the package, not this one."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    defined = {m: private_names(tree) for m, tree in trees.items()}
    wrong = []
    for module, tree in trees.items():
        others = set().union(*(names for m, names in defined.items() if m != module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in sources and node.module != module:
                wrong += [f"{module}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif (isinstance(node, ast.Attribute) and node.attr in others and node.attr not in defined[module]
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                wrong.append(f"{module}:{node.lineno} uses {ast.unparse(node)}")
    return wrong


def test_no_module_uses_another_modules_private_names():
    sources = {module_name(p): p.read_text() for root in (PACKAGE, ROOT / "spark_hooks") for p in root.rglob("*.py")}
    assert reaches_into(sources) == []


def test_the_private_name_check_finds_an_import_and_an_attribute():
    sources = {"a": "def _helper(): pass\nclass A:\n    def _step(self): pass\n",
               "b": "from a import _helper\ndef f(obj):\n    return obj._step()\n",
               "c": "class C:\n    def _step(self): pass\n    def g(self, other):\n        return other._step()\n"}
    assert reaches_into(sources) == ["b:1 imports a._helper", "b:3 uses obj._step"]


def test_every_sub_package_says_what_it_holds_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)} must say what it may import"


@pytest.mark.parametrize("module", ["coordinator", "coordinator.operations.cli"])
def test_importing_the_coordinator_loads_no_spark(module):
    code = (f"import sys, coordinator, {module}; [getattr(coordinator, name) for name in coordinator.__all__]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_public_name_is_exported_and_found_when_first_used():
    import coordinator
    assert sorted(coordinator.__all__) == sorted(set(coordinator.__all__)) == dir(coordinator)
    assert [name for name in coordinator.__all__ if getattr(coordinator, name).__name__ != name] == []
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        coordinator.Nope  # noqa: B018 - the attribute access is the test
