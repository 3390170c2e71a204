"""The house rules of docs/architecture.md ("Layers"), checked on the source: every import of
``src/tokenflow`` (module level, inside functions and under ``TYPE_CHECKING`` alike) goes to its
own layer or a lower one, the runtime's rooms import only downward in their own order, and no
two modules import each other, directly or around a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tokenflow"

# Bottom to top; a module's layer is that of the longest prefix listed. The typed config
# sections that live beside their package (``engine.config``, ...) are records, layer 1.
LAYERS = {
    1: ["tokenflow._lazy", "tokenflow.rollout", "tokenflow.rollout_files", "tokenflow.registry", "tokenflow.errors",
        "tokenflow.config", "tokenflow.metrics", "tokenflow.engine.config", "tokenflow.trainer.config",
        "tokenflow.algorithms.config", "tokenflow.scoring.config"],
    2: ["tokenflow.model_store", "tokenflow.engine", "tokenflow.sync"],
    3: ["tokenflow.algorithms", "tokenflow.buffer", "tokenflow.trainer"],
    4: ["tokenflow.tasks", "tokenflow.envs", "tokenflow.scoring", "tokenflow.serve", "tokenflow.evaluation"],
    5: ["tokenflow.runtime"],
    6: ["tokenflow.cli", "tokenflow.bench", "tokenflow.report", "tokenflow.sim", "tokenflow.tools",
        "tokenflow.plugins"],
}
# The runtime's rooms, bottom to top (tokenflow/runtime/__init__.py says what each holds).
RUNTIME_ROOMS = ["view", "drivers", "workers", "backends", "run", "orchestrator", "launch"]


def _modules() -> dict[str, Path]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = ("tokenflow", *p.relative_to(SRC).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The tokenflow modules ``name`` imports (a package's ``__init__`` counts as the package)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t.startswith("tokenflow") and t != name:
                found.add(t)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer_of(module: str) -> int:
    if module == "tokenflow":  # the package itself: lazy public names only
        return 1
    best, layer = -1, None
    for n, prefixes in LAYERS.items():
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and len(pre) > best:
                best, layer = len(pre), n
    assert layer is not None, f"{module} is in no layer: add its package to LAYERS and docs/architecture.md"
    return layer


def room_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["tokenflow", "runtime"] or len(parts) < 3:
        return None
    return RUNTIME_ROOMS.index(parts[2])


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if dep == "tokenflow":  # the package's lazy public names
                continue
            if layer_of(dep) > layer_of(mod):
                out.append(f"{mod} (layer {layer_of(mod)}) imports {dep} (layer {layer_of(dep)})")
            elif room_of(mod) is not None and room_of(dep) is not None and room_of(dep) > room_of(mod):
                out.append(f"{mod} (runtime room {RUNTIME_ROOMS[room_of(mod)]}) imports {dep} "
                           f"(room {RUNTIME_ROOMS[room_of(dep)]}, above it)")
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), packages' ``__init__`` aside:
    a package that re-exports its modules is not a loop."""
    edges = {m: {d for d in deps if not MODULES.get(d, Path()).name == "__init__.py"} for m, deps in graph.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_a_higher_layer():
    assert layering_violations(GRAPH) == []


def test_no_import_cycles():
    assert import_cycles(GRAPH) == []


def test_every_package_says_what_it_is_for_and_what_it_may_import():
    missing = [m for m, p in MODULES.items() if p.name == "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []
    for room in RUNTIME_ROOMS[:-1]:
        doc = ast.get_docstring(ast.parse((SRC / "runtime" / room.replace(".", "/") / "__init__.py").read_text()))
        assert "import" in doc, f"tokenflow.runtime.{room}'s docstring does not say what it may import"


@pytest.mark.parametrize("edge, kind", [
    (("tokenflow.rollout", "tokenflow.runtime.launch"), "layer"),
    (("tokenflow.runtime.workers.process", "tokenflow.runtime.backends.local.start"), "room"),
])
def test_the_checks_catch_a_wrong_import(edge, kind):
    """The two checks on graphs with one bad edge added: an upward import and a loop."""
    graph = {m: set(d) for m, d in GRAPH.items()}
    graph[edge[0]].add(edge[1])
    found = layering_violations(graph)
    assert len(found) == 1 and edge[0] in found[0] and (("room" in found[0]) == (kind == "room"))
    graph = {m: set(d) for m, d in GRAPH.items()}
    graph["tokenflow.sync.base"].add("tokenflow.sync.factory")
    cycles = import_cycles(graph)  # the loop this redesign removed: the factory back in the base
    assert len(cycles) == 1 and {"tokenflow.sync.base", "tokenflow.sync.factory", "tokenflow.sync.broadcast"} <= set(cycles[0])
