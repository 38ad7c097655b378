"""The package's imports point down (core <- formats <- tools) and form no cycle, function-level imports included;
core holds nothing only the tools use, and `import dspark_hf` loads no tool."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dspark_hf

PACKAGE = "dspark_hf"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE
# custom_generate/ is the file transformers loads for generate(custom_generate=...): beside formats, on core.
LAYERS = {"core": 0, "formats": 1, "custom_generate": 1, "tools": 2}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def resolve(importer: str, is_package: bool, node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The package modules an import statement loads (a `from X import name` of a submodule counts as it)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return {name for name in names if name.split(".")[0] == PACKAGE}
    base_parts = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level:
        base_parts = base_parts[: len(base_parts) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != PACKAGE:
        return set()
    found = {base}
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            found.add(f"{base}.{alias.name}")
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in ast.walk(tree):  # every import, at module level or inside functions
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= resolve(name, path.name == "__init__.py", node, modules)
        graph[name] = {edge for edge in edges if edge != name}
        unknown = {edge for edge in edges if edge not in modules}
        assert not unknown, f"{path}: imports {sorted(unknown)}, which are not modules of the package"
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for importer, imported in graph.items():
        for target in imported:
            if layer(target) == "root":
                wrong.append(f"{importer} imports the package root {target} (only users import it)")
            elif layer(importer) != "root" and LAYERS[layer(target)] > LAYERS[layer(importer)]:
                wrong.append(f"{importer} ({layer(importer)}) imports {target} ({layer(target)}): imports point down")
    return sorted(wrong)


def test_every_module_belongs_to_a_layer():
    stray = [name for name in all_modules() if layer(name) not in LAYERS and name != PACKAGE]
    assert not stray, f"modules outside core/, formats/ and tools/: {stray}"


def test_imports_point_down_without_cycles():
    graph = import_graph()
    for name in sorted(LAYERS, key=LAYERS.get):
        members = sorted(module for module in graph if layer(module) == name)
        print(f"{name}: {len(members)} modules, {sum(len(graph[m]) for m in members)} imports: "
              + ", ".join(m.removeprefix(f"{PACKAGE}.") for m in members))
    found_cycles, wrong = cycles(graph), violations(graph)
    print(f"cycles: {found_cycles or 'none'}; upward imports: {wrong or 'none'}")
    assert not found_cycles, f"import cycles: {found_cycles}"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "graph, problem",
    [
        ({"dspark_hf.core.a": {"dspark_hf.tools.b"}, "dspark_hf.tools.b": set()}, "imports point down"),
        ({"dspark_hf.formats.a": {"dspark_hf.tools.b"}, "dspark_hf.tools.b": set()}, "imports point down"),
        ({"dspark_hf.core.a": {"dspark_hf.formats.b"}, "dspark_hf.formats.b": set()}, "imports point down"),
        ({"dspark_hf.tools.a": {"dspark_hf"}, "dspark_hf": set()}, "package root"),
    ],
)
def test_the_checks_catch_what_they_are_for(graph, problem):
    assert problem in " ".join(violations(graph))


def test_cycle_detection_sees_function_level_cycles(tmp_path):
    graph = {"dspark_hf.core.a": {"dspark_hf.core.b"}, "dspark_hf.core.b": {"dspark_hf.core.c"},
             "dspark_hf.core.c": {"dspark_hf.core.a"}, "dspark_hf.core.d": set()}
    assert cycles(graph) == [["dspark_hf.core.a", "dspark_hf.core.b", "dspark_hf.core.c"]]
    source = "def f():\n    from .b import thing\n"
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom))
    modules = {"dspark_hf.core.a": None, "dspark_hf.core.b": None}
    assert resolve("dspark_hf.core.a", False, node, modules) == {"dspark_hf.core.b"}


def defined_names(tree: ast.Module) -> set[str]:
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def used_names(tree: ast.Module) -> set[str]:
    """Every name a module reads: plain names, attributes, and the names it imports."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
    return used


def only_for_the_tools(sources: dict[str, str], public: set[str]) -> list[str]:
    """Functions and classes of core/ that neither core, formats/ nor the package's public names use."""
    trees = {name: ast.parse(source) for name, source in sources.items()}
    used = set(public).union(*(used_names(tree) for name, tree in trees.items() if layer(name) in ("core", "formats")))
    return sorted(f"{name}.{defined}" for name, tree in trees.items() if layer(name) == "core"
                  for defined in defined_names(tree) - used)


def test_core_holds_nothing_only_the_tools_use():
    sources = {name: path.read_text() for name, path in all_modules().items()}
    assert not only_for_the_tools(sources, set(dspark_hf.__all__)), "move these to the tools (or delete them)"


def test_the_core_check_sees_a_function_only_a_tool_calls():
    sources = {
        "dspark_hf.core.a": "def used():\n    pass\n\ndef for_tools():\n    pass\n\ndef public():\n    pass\n",
        "dspark_hf.core.b": "from .a import used\n",
        "dspark_hf.tools.c": "from ..core.a import for_tools\n",
    }
    assert only_for_the_tools(sources, {"public"}) == ["dspark_hf.core.a.for_tools"]


def test_importing_the_package_loads_no_tool():
    check = "import sys, dspark_hf\nprint(sorted(m for m in sys.modules if m.startswith('dspark_hf.tools')))"
    finished = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert finished.stdout.strip() == "[]", finished.stderr
