"""The package's structure, read from its source: the import graph (imports inside functions
counted too: a circle hides there), the layers (no dagster in lib/, no asset module importing
another), no private name used across modules, and module sizes."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mascot_dag"
# Modules allowed past MAX_LINES, each with its reason.
MAX_LINES = 400
LARGE = {
    "mascot_dag.pipeline": "the lineage walk (in-process and launched runs, --missing-only, the "
                           "backfills of the UI and sensors): one concern, one reader's path",
    "mascot_dag.lib.evaluation.methods": "every evaluation method's plan side by side, so that "
                                         "their differences read as one table",
    "mascot_dag.lib.serving.server": "the OpenAI-compatible app: routes, validation, streaming "
                                     "and cancellation share the request's state",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, name: str) -> list[tuple[str, list[str], int]]:
    """[(imported module, [names imported from it], line)] of every import in the file,
    at any depth; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


@functools.cache
def graph() -> dict[str, set[str]]:
    """Internal import edges: module -> package modules it imports (a `from pkg import mod`
    counts as importing pkg.mod)."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for target, names, _ in imports(path, m):
            if not target.startswith("mascot_dag"):
                continue
            found = {f"{target}.{n}" for n in names if f"{target}.{n}" in mods}
            if target in mods and (not found or len(found) < len(names)):
                found.add(target)
            edges[m] |= {t for t in found if t != m}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_analyser_finds_circles_and_edges():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges = graph()
    assert "mascot_dag.lib.dialogue.engine" in edges["mascot_dag.lib.dialogue.chat"]
    # imports inside functions count: cli imports the pipeline inside its commands
    assert "mascot_dag.pipeline" in edges["mascot_dag.cli"]


def test_no_import_circles():
    assert cycles(graph()) == []


def test_lib_imports_no_dagster_and_no_layer_above_it():
    bad = []
    for m, path in modules().items():
        if not m.startswith("mascot_dag.lib"):
            continue
        for target, _, line in imports(path, m):
            if target.split(".")[0] == "dagster" or target.startswith("dagster_") or (
                    target.startswith("mascot_dag.") and not target.startswith("mascot_dag.lib")):
                bad.append(f"{m}:{line} imports {target}")
    assert not bad, "\n".join(bad)


ASSET_DECORATORS = {"asset", "multi_asset", "asset_check", "multi_asset_check", "graph_asset"}


def asset_modules() -> set[str]:
    """Modules that define assets or checks (assets/common.py and assets/queries.py define
    none: they are the helpers every asset module may import)."""
    out = set()
    for m, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for dec in getattr(node, "decorator_list", []):
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = (target.attr if isinstance(target, ast.Attribute)
                        else getattr(target, "id", ""))
                if name in ASSET_DECORATORS:
                    out.add(m)
    return out


def test_no_module_imports_an_asset_module_but_the_lineage():
    """Asset modules share helpers (assets/common.py, assets/queries.py, lib, the registry),
    never each other; only mascot_dag.lineage loads them all."""
    assets = asset_modules()
    assert {"mascot_dag.assets.alignment", "mascot_dag.assets.evaluation"} <= assets
    assert "mascot_dag.assets.common" not in assets and "mascot_dag.assets.queries" not in assets
    bad = [f"{m} -> {t}" for m, ts in graph().items() if m != "mascot_dag.lineage"
           for t in ts if t in assets]
    assert not bad, "\n".join(sorted(bad))


def test_no_private_name_used_across_modules():
    bad = []
    for m, path in modules().items():
        for target, names, line in imports(path, m):
            if target.startswith("mascot_dag") and target != m:
                bad += [f"{m}:{line} imports {target}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_module_sizes():
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules().items()}
    large = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert set(large) <= set(LARGE), {m: n for m, n in large.items() if m not in LARGE}
    assert len(LARGE) <= 3
