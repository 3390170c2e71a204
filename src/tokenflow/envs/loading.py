"""Resolve ``task.env``: an `Environment` subclass named as ``module:Class`` or ``path/to/file.py:Class``.

Names resolve the way ``task.reward`` does (`tokenflow.tasks.reward_loading.load_attribute`):
a file's folder goes on the Python path, so worker processes import it by the same name.

``[task.options]`` reach the class by keyword (`make_environment`, `options_for`): the
constructor and the ``train_example`` / ``eval_examples`` classmethods each receive the options
their signature names (all of them with ``**kwargs``). A key that none of the callables used
names is refused when the class loads, naming ``task.options.KEY``; an environment that takes
no options is called exactly as before.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from tokenflow.envs.base import Environment
from tokenflow.errors import InputError
from tokenflow.tasks.reward_loading import load_attribute

EXAMPLE_METHODS = ("train_example", "eval_examples")
"""The classmethods that generate examples (``task.name = "env"``); they take options too."""


class EnvironmentLoadError(InputError):
    """``task.env`` names nothing importable, or something that is not a usable environment class,
    or ``[task.options]`` hold a key the class does not take."""


def _parameters(fn, skip: int = 0) -> tuple[set[str], bool]:
    """(the keyword-passable parameter names of ``fn`` after its first ``skip`` positional ones
    (an example method's ``index, seed`` / ``seed, n``), whether it takes ``**kwargs``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[skip:]
    except (TypeError, ValueError):  # a builtin without a signature: it takes nothing extra
        return set(), False
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def options_for(fn, options: Mapping[str, Any] | None, skip: int = 0) -> dict[str, Any]:
    """The options ``fn`` receives: those its signature names (after its first ``skip``
    positional parameters), or all of them with ``**kwargs``."""
    if not options:
        return {}
    names, var_kw = _parameters(fn, skip)
    return dict(options) if var_kw else {k: v for k, v in options.items() if k in names}


def make_environment(cls: type[Environment], options: Mapping[str, Any] | None = None) -> Environment:
    """One instance of ``cls`` for one episode, built with the options its constructor names."""
    return cls(**options_for(cls, options))


def check_options(cls: type, spec: str, options: Mapping[str, Any] | None, *, examples: bool) -> None:
    """Every option is named by the constructor or (``examples``: the class generates its
    examples) by an example classmethod; the constructor's required arguments are options."""
    options = dict(options or {})
    used = [("__init__", cls)] + ([(m, getattr(cls, m)) for m in EXAMPLE_METHODS
                                    if callable(getattr(cls, m, None))] if examples else [])
    taken: set[str] = set()
    for m, fn in used:
        names, var_kw = _parameters(fn, 0 if m == "__init__" else 2)
        taken |= set(options) if var_kw else names & set(options)
    for key in sorted(set(options) - taken):
        where = ", ".join(f"{spec.rsplit(':', 1)[-1]}.{m}" for m, _ in used)
        raise EnvironmentLoadError(
            f"task.options.{key}: the environment {spec} takes no option {key!r} (none of {where} has a "
            f"parameter of that name); remove it from [task.options], or add it to the class "
            "(docs/environments.md, \"Options\")")
    required = [p.name for p in inspect.signature(cls).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and p.name not in options]
    if required:
        raise EnvironmentLoadError(f"{spec}() needs argument(s) {', '.join(required)}; an environment is built "
                                   "once per episode with the options of [task.options] as its keyword "
                                   f"arguments: set task.options.{required[0]}, or give it a default")


def load_environment(spec: str, options: Mapping[str, Any] | None = None, *,
                     examples: bool = False, build: bool = True) -> type[Environment]:
    """The environment class ``spec`` names, checked: a concrete `Environment` subclass that can
    be built from ``options`` (``[task.options]``; one instance plays one episode), each option
    taken by its constructor or (``examples``) by an example classmethod (`check_options`).
    ``build=False``: the class alone is wanted (its rubric, in a scorer), options not checked."""
    if not isinstance(spec, str) or ":" not in spec:
        raise EnvironmentLoadError(f"task.env = {spec!r} must be 'module:Class' or 'path/to/file.py:Class'")
    obj = load_attribute(spec, what="environment", key="task.env", noun="class", error=EnvironmentLoadError)
    if not isinstance(obj, type):
        kind = type(obj).__name__
        raise EnvironmentLoadError(f"{spec} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a class; "
                                   "name an Environment subclass in task.env")
    if not issubclass(obj, Environment):
        raise EnvironmentLoadError(f"{spec} is a class but not a tokenflow.envs.Environment; subclass Environment "
                                   "(or ToolEnvironment for tool use)")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise EnvironmentLoadError(f"{spec} does not implement {missing}; an Environment defines async step()")
    if build:
        check_options(obj, spec, options, examples=examples)
    return obj
