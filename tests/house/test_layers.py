"""The house rules of docs/architecture.md ("Layers"), checked on the source: every import of
``src/tokenflow`` (module level, inside functions and under ``TYPE_CHECKING`` alike) goes to its
own layer or a lower one, the runtime's rooms import only downward in their own order, and no
two modules import each other, directly or around a loop."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tokenflow"

# Bottom to top; a module's layer is that of the longest prefix listed. Every typed config
# section lives in ``tokenflow.config`` (layer 1), none beside its package. One record lives
# beside its package: ``engine.backends`` (the table of engine backends and their capabilities,
# standard library and ``registry`` only), which the config reads to check ``engine.backend``.
LAYERS = {
    1: ["tokenflow._lazy", "tokenflow.rollout", "tokenflow.rollout_files", "tokenflow.registry", "tokenflow.errors",
        "tokenflow.host_memory", "tokenflow.precision",
        "tokenflow.config", "tokenflow.metrics", "tokenflow.engine.backends"],
    2: ["tokenflow.model_store", "tokenflow.engine", "tokenflow.sync"],
    3: ["tokenflow.algorithms", "tokenflow.buffer", "tokenflow.trainer"],
    4: ["tokenflow.tasks", "tokenflow.envs", "tokenflow.scoring", "tokenflow.serve", "tokenflow.evaluation"],
    5: ["tokenflow.runtime", "tokenflow.tinker"],
    6: ["tokenflow.cli", "tokenflow.bench", "tokenflow.report", "tokenflow.sim", "tokenflow.shipped_models"],
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


# A namedtuple's public methods carry an underscore so as not to clash with its fields.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# Reaching into another library's internals where it has no public way (a Queue's pipe, a torch
# process group's options) says why on the line: ``# noqa: SLF001 - <why>`` (ruff's rule name).
JUSTIFIED = re.compile(r"#\s*noqa:\s*SLF001\s+-\s+\S")


def _locals_of(fn: ast.AST, own_class: str | None) -> set[str]:
    """The names ``fn`` binds itself: its parameters and what its body assigns, less what it
    imports (a lazily imported module's private names are that module's business), ``self``,
    ``cls``, and in a method the objects of its own class: parameters annotated with it, and
    locals it builds itself (``x = cls(...)``, ``cls.__new__(cls)``, ``type(self)(...)``)."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]

    def own(arg: ast.arg) -> bool:
        ann = arg.annotation
        name = ann.value if isinstance(ann, ast.Constant) else getattr(ann, "id", None)
        return own_class is not None and name == own_class

    def built_here(call: ast.AST) -> bool:
        if not (own_class and isinstance(call, ast.Call)):
            return False
        f = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr == "__new__" else call.func
        if isinstance(f, ast.Call) and getattr(f.func, "id", None) == "type":  # type(self)(...)
            f = f.args[0] if f.args else f
        return getattr(f, "id", None) in ("cls", "self", own_class)

    names = {x.arg for x in params if not own(x)}
    exempt: set[str] = set()
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # a nested scope: its own names
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            exempt.update((x.asname or x.name).split(".")[0] for x in node.names)
        elif isinstance(node, ast.Assign) and built_here(node.value):
            exempt.update(t.id for t in node.targets if isinstance(t, ast.Name))
        todo.extend(ast.iter_child_nodes(node))
    return names - exempt - {"self", "cls"}


def private_reads(source: str) -> list[tuple[int, str]]:
    """Every ``x._name`` (read or written) where ``x`` is a parameter or a local variable of the
    function it is in (or of one around it): a module reaching into another object's private
    attributes. ``self._x``, ``cls._x``, a method's objects of its own class (`_locals_of`), a
    module's ``mod._x``, dunders, a namedtuple's API and lines marked ``# noqa: SLF001 - <why>``
    are not counted."""
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, scopes: list[set[str]], own_class: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                visit(child, scopes, node.name)
            for child in [*node.bases, *node.keywords, *node.decorator_list]:
                visit(child, scopes, own_class)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scopes = [*scopes, _locals_of(node, own_class)]
            own_class = None  # a function nested in a method is not the class's own
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in NAMEDTUPLE_API and any(node.value.id in s for s in scopes)
                and not JUSTIFIED.search(lines[node.lineno - 1])):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        for child in ast.iter_child_nodes(node):
            visit(child, scopes, own_class)

    visit(ast.parse(source), [], None)
    return found


def private_attribute_reads(modules: dict[str, Path]) -> list[str]:
    root = SRC.parents[1]
    return [f"{p.relative_to(root)}:{line}: {what}" for _, p in sorted(modules.items())
            for line, what in private_reads(p.read_text(encoding="utf-8"))]


def test_no_module_imports_a_higher_layer():
    assert layering_violations(GRAPH) == []


def test_no_import_cycles():
    assert import_cycles(GRAPH) == []


def test_engine_backends_import_the_seam_never_each_other():
    """``tokenflow.engine``'s root is the seam; a backend (a subpackage other than ``loading``)
    imports the seam and layer 1, never another backend."""
    engine = "tokenflow.engine"
    backends = {m.split(".")[2] for m in MODULES if m.count(".") >= 2 and m.startswith(engine + ".")
                and MODULES[m].parent.name != "engine" and m.split(".")[2] != "loading"}
    assert {"builtin", "vllm"} <= backends
    wrong = [f"{m} imports {d}" for m, deps in sorted(GRAPH.items()) for d in sorted(deps)
             if m.startswith(engine + ".") and d.startswith(engine + ".")
             and {m.split(".")[2], d.split(".")[2]} <= backends and m.split(".")[2] != d.split(".")[2]]
    seam_up = [f"{m} imports {d}" for m, deps in sorted(GRAPH.items()) for d in sorted(deps)
               if m.startswith(engine + ".") and m.split(".")[2] not in backends
               and d.startswith(engine + ".") and d.split(".")[2] in backends]
    assert wrong == [] and seam_up == []


def test_every_package_says_what_it_is_for_and_what_it_may_import():
    """Every package's docstring: what it holds, then a line that starts ``May import:``."""
    docs = {m: ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
            for m, p in MODULES.items() if p.name == "__init__.py"}
    assert [m for m, doc in sorted(docs.items()) if not doc.strip()] == []
    silent = [m for m, doc in sorted(docs.items())
              if not any(line.strip().startswith("May import:") for line in doc.splitlines())]
    assert silent == [], "these packages' docstrings have no 'May import:' line"


def test_every_layers_entry_names_a_module():
    """An entry of LAYERS that names no module (a package that was renamed, or never written)
    would silently place nothing: each names a module or package of src/tokenflow."""
    assert [pre for prefixes in LAYERS.values() for pre in prefixes if pre not in MODULES] == []
    assert [room for room in RUNTIME_ROOMS if f"tokenflow.runtime.{room}" not in MODULES] == []


def test_no_module_reads_another_objects_private_attributes():
    """``x._name`` on a parameter or local ``x`` reaches into another object's state: make the
    thing public, or give its owner a method. (Another library's internals with no public way
    in: ``# noqa: SLF001 - <why>`` on the line.)"""
    assert private_attribute_reads(MODULES) == []


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


PLANTED = """
import os
from collections import namedtuple


class Stats:
    def merge(self, other: "Stats"):
        self._n += other._n  # the class's own privates, on a parameter of its own class


def poke(engine, n):
    engine._paused = True
    lock = engine.runner
    with lock._mutex:
        pass
    os._exit(n) if n else None
    return lambda q: q._reader


def fine(point, q):
    q._reader  # noqa: SLF001 - a Queue's pipe
    return point._replace(x=1), point.__class__
"""


@pytest.mark.parametrize("source, expected", [
    (PLANTED, [(12, "engine._paused"), (14, "lock._mutex"), (17, "q._reader")]),
    ("def f(x):\n    def g():\n        return x._y\n    return g\n", [(3, "x._y")]),  # a closure's
    ("import sys\n\ndef f():\n    return sys._getframe(0)\n", []),  # a module's own private name
    ("class A:\n    def f(self, other: 'B'):\n        return other._y\n", [(3, "other._y")]),
    ("class A:\n    @classmethod\n    def f(cls, b):\n        a = cls.__new__(cls)\n        a._x = b._x\n",
     [(5, "b._x")]),  # what the class builds itself is its own
])
def test_the_private_attribute_check_catches_a_planted_read(source, expected):
    """The check on planted code: a parameter's and a local's private attributes (read or
    written, in a closure or a lambda) are caught; self, a module, the class's own parameter,
    a namedtuple's API, dunders and a justified line are not."""
    assert private_reads(source) == expected
