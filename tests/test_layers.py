"""The package's imports go one way: an AST walk of every import (TYPE_CHECKING ones and those inside
functions included) finds no circle between localspec's modules."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "localspec"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The localspec modules ``path`` imports (a name imported from a package counts as its submodule if
    there is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        for t in targets:
            while t not in modules and "." in t:
                t = t.rpartition(".")[0]
            if t in modules and t != name:
                found.add(t)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_walk_finds_a_circle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_localspec_imports_one_that_imports_it_back():
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports(p, modules) for p in paths}
    # the walk sees imports
    assert graph["localspec.drafting.auto"] >= {"localspec.drafting.drafters", "localspec.methods"}
    assert cycles(graph) == []


# localspec's layers, lowest first: a module may import from its own layer and the ones below it, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "paths", "sizes")),
    ("requests", ("methods", "options", "constraint")),
    ("runtime", ("runtime",)),
    ("components", ("sampling", "structured", "prompt_cache", "catalog")),
    ("reasoning", ("reasoning",)),
    ("drafting", ("drafting",)),
    ("decoding", ("decoding", "events")),
    ("api", ("", "api", "embeddings", "images", "lanes", "loading", "results", "prompts", "export")),
    ("entry", ("cli", "server", "bench", "__main__")),
]
#: What an entry point may not import: another entry point, but for the command line, which starts them all.
ENTRY_IMPORTS = {"cli": {"server", "bench"}, "server": set(), "bench": set(), "__main__": {"cli"}}


def top(module: str) -> str:
    """The first name under localspec (``""`` for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def rank(module: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        if top(module) in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its package or module to LAYERS")


def graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def upward(g: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, or of one entry point by another."""
    found = []
    for module, targets in g.items():
        for target in targets:
            if rank(target) > rank(module):
                found.append(f"{module} -> {target}")
            elif rank(target) == rank(module) == len(LAYERS) - 1 and top(target) != top(module) \
                    and top(target) not in ENTRY_IMPORTS[top(module)]:
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_the_layer_check_finds_an_upward_import():
    assert upward({"localspec.runtime.model": {"localspec.drafting.auto"}}) == [
        "localspec.runtime.model -> localspec.drafting.auto"]
    assert upward({"localspec.server.app": {"localspec.bench.agent"}}) == [
        "localspec.server.app -> localspec.bench.agent"]
    assert upward({"localspec.drafting.auto": {"localspec.runtime.model"}}) == []


def test_every_import_goes_down_the_layers():
    g = graph()
    assert all(rank(m) >= 0 for m in g)  # every module is in a layer
    assert upward(g) == []


def test_each_package_says_its_layer():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Layer" in doc or init.parent == PACKAGE, f"{init}: its docstring names no layer"
        assert doc, f"{init} has no docstring"


def test_few_modules_at_the_top_and_none_too_long():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 15, flat
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
