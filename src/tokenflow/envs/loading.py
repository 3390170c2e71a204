"""Resolve ``task.env``: an `Environment` subclass named as ``module:Class`` or ``path/to/file.py:Class``.

Names resolve the way ``task.reward`` does (`tokenflow.tasks.reward_loading.load_attribute`):
a file's folder goes on the Python path, so worker processes import it by the same name.
"""

from __future__ import annotations

import inspect

from tokenflow.envs.base import Environment
from tokenflow.tasks.reward_loading import load_attribute


class EnvironmentLoadError(ValueError):
    """``task.env`` names nothing importable, or something that is not a usable environment class."""


def load_environment(spec: str) -> type[Environment]:
    """The environment class ``spec`` names, checked: a concrete `Environment` subclass that can
    be built without arguments (one instance plays one episode)."""
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
    required = [p.name for p in inspect.signature(obj).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise EnvironmentLoadError(f"{spec}() needs argument(s) {', '.join(required)}; an environment is built "
                                   "without arguments, once per episode (read settings from the example)")
    return obj
