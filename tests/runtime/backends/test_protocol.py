"""Both backends implement the whole typed surface the orchestrator is written against
(``tokenflow.runtime.backends.protocol``). A Protocol's own method bodies do nothing, so a backend
that subclasses it and forgets a method would fail silently mid-run: each member must be defined
by the backend's own class (methods, properties) or assigned by its own methods (data)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tokenflow.runtime.backends.protocol import Backend, Worker


def _members(proto) -> tuple[set[str], set[str]]:
    """(data attributes, methods and properties) a protocol declares."""
    data = set(proto.__dict__.get("__annotations__", {}))
    calls = {n for n, v in vars(proto).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return data, calls


def _assigned(cls) -> set[str]:
    """``self.x = ...`` targets in the class's own methods (tuple targets included), plus class attributes."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    found = {n for n, v in vars(cls).items() if not callable(v)}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                    found.add(el.attr)
    return found


def missing_members(cls, proto) -> list[str]:
    data, calls = _members(proto)
    own = _assigned(cls)
    return sorted([n for n in calls if n not in vars(cls)] + [n for n in data if n not in own])


def _backends():
    from tokenflow.runtime.backends.local.backend import LocalBackend
    from tokenflow.runtime.backends.ray.backend import RayBackend, RayWorker
    from tokenflow.runtime.workers.process import WorkerHandle

    return [(LocalBackend, Backend), (RayBackend, Backend), (WorkerHandle, Worker), (RayWorker, Worker)]


@pytest.mark.parametrize("index", range(4), ids=["LocalBackend", "RayBackend", "WorkerHandle", "RayWorker"])
def test_every_backend_and_worker_handle_defines_the_whole_protocol(index):
    cls, proto = _backends()[index]
    if proto is Backend:
        assert Backend in cls.__mro__
    assert missing_members(cls, proto) == []


def test_the_check_finds_a_missing_method_and_a_missing_attribute():
    class Partial(Backend):  # no trainer_start_step, no replace_engine
        def __init__(self):
            self.engines, self.trainer = [], None
            self.restarts_engines = self.engines_start_unattached = False

        all_workers = property(lambda self: [])
        recv = broadcast = check = replace_trainer = locked_engines = lend_trainer_threads = shutdown = (
            lambda self, *a: None)

    assert missing_members(Partial, Backend) == ["replace_engine", "trainer_start_step"]
