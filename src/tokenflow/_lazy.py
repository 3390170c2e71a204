"""Lazy re-exports: a package names its public objects without importing torch to do so."""

from __future__ import annotations

import importlib


def lazy_getattr(package: str, namespace: dict, exports: dict[str, str]):
    """A module ``__getattr__`` that imports ``exports[name]`` (a module path) on first access."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
