"""The import graph of tune_cp: layers import only downwards and no module imports itself back.

The layers, lowest first (``docs/architecture.md``, "Layers"): ``config`` (the specs, the axis
registry, the resolver) < ``oracle`` (memory and time) < ``formats`` (framework I/O) <
``solver`` (legality, CP-SAT, check) < ``calibration`` (fitting the time model) < ``agent``
(search, seed phase, LLM phase, plan, reports) < ``cli``. Every import counts, the lazy ones
inside functions too (a lazy import is still a dependency; only ``if TYPE_CHECKING:`` blocks are
skipped), and a cycle between two modules of one layer is as much a defect as one across layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tune_cp"
LAYERS = ("config", "oracle", "formats", "solver", "calibration", "agent", "cli")
OUTSIDE = {"tests", "benchmarks", "docs", ".venv", ".git", "build"}


def modules() -> dict[str, Path]:
    """Every module of the package (the repository root installs as ``tune_cp``)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in OUTSIDE or rel.parts[0].endswith(".egg-info"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([PACKAGE, *parts])] = path
    return out


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (t for n in node.orelse for t in _imports(n, name, is_package))
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)  # from pkg import module
        yield from _imports(node, name, is_package)


def import_graph() -> dict[str, set[str]]:
    """``module -> the package's modules it imports`` (``from a import b`` counts ``a.b`` when
    ``b`` is a module, else ``a``)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in _imports(tree, name, path.name == "__init__.py"):
            if not target.startswith(PACKAGE + ".") and target != PACKAGE:
                continue
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in mods and target != name:
                graph[name].add(target)
    return graph


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_layer() -> None:
    strays = sorted(m for m in modules() if layer(m) not in LAYERS)
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"


def test_the_graph_sees_top_level_and_lazy_imports() -> None:
    g = import_graph()
    assert "tune_cp.config.specs" in g["tune_cp.solver.rules"]  # top level
    assert "tune_cp.oracle.catalog" in g["tune_cp.oracle.work"]  # ``from ... import gpu_...``
    assert "tune_cp.solver.check" in g["tune_cp.calibration.refit"]  # inside a function
    assert "tune_cp.oracle.params" in g["tune_cp.oracle.inventory"]  # ``from pkg import mod``


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_reaches_a_higher_layer() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                    if rank[layer(b)] > rank[layer(a)])
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_module_cycle() -> None:
    found = cycles(import_graph())
    assert not found, f"module cycles: {found}"
