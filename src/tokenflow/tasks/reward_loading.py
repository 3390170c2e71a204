"""Resolve a reward function named as ``module:function`` or ``path/to/file.py:function``.

`load_attribute` resolves such a name to any object; ``task.env`` classes resolve through it too
(`tokenflow.envs.loading`).

Reward functions run in scorer worker processes, so they must be importable there by name:
a lambda, a closure or a method defined under ``if __name__ == "__main__"`` is refused here, at
start, with a message saying what to do instead.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import pickle
import sys
from pathlib import Path


class RewardFunctionError(ValueError):
    pass


def _import_file(path: Path, what: str, error: type[Exception]):
    # Import under a stable module name and make its folder importable for the workers. The
    # folder goes on sys.path once, and comes off again when the file cannot be imported: a
    # process that tries many files (a server, a test session) keeps no trail of them.
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        return _exec_file(path, what, error)
    except BaseException:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
        raise


def _exec_file(path: Path, what: str, error: type[Exception]):
    module_name = path.stem
    spec_ = importlib.util.spec_from_file_location(module_name, path)
    if spec_ is None or spec_.loader is None:
        raise error(f"{what} file {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec_)
    sys.modules[module_name] = module
    try:
        spec_.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module may raise anything while importing
        sys.modules.pop(module_name, None)
        raise error(f"{what} file {str(path)!r} fails to import ({_first_line(e)}); fix the file") from None
    return module


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    where = ""
    if isinstance(e, SyntaxError) and e.lineno:
        where = f" at line {e.lineno}"
        text = e.msg
    return f"{type(e).__name__}{where}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def load_reward_fn(spec: str):
    if not isinstance(spec, str):
        raise RewardFunctionError(
            f"reward {spec!r} must be 'module:function', 'path/to/file.py:function' or a registered scorer's name")
    if ":" not in spec:
        # A registered scorer's name (tokenflow.registry.SCORERS, plugins included).
        from tokenflow.registry import SCORERS, UnknownName

        try:
            fn = SCORERS.get(spec)
        except UnknownName as e:
            raise RewardFunctionError(
                f"reward {spec!r} is neither 'module:function', 'path/to/file.py:function' nor a "
                f"registered scorer: {e}") from None
        check_picklable(fn)
        return fn
    fn = load_attribute(spec, what="reward", key="task.reward", noun="function", error=RewardFunctionError)
    if not callable(fn):
        kind = type(fn).__name__
        raise RewardFunctionError(f"{spec} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function; "
                                  "name a function fn(prompt, completion, example) in task.reward")
    if isinstance(fn, type):
        raise RewardFunctionError(f"{spec} is a class, not a function; "
                                  "name a function fn(prompt, completion, example) in task.reward")
    check_picklable(fn)
    return fn


def load_attribute(spec: str, *, what: str, key: str, noun: str, error: type[Exception]):
    """The object ``spec`` names: ``"module:attribute"`` (the module on the Python path) or
    ``"path/to/file.py:attribute"`` (imported under its stem, its folder put on the path so that
    worker processes import it the same way). ``what``/``key``/``noun`` word the errors, e.g.
    "reward" / "task.reward" / "function"; ``error`` is the exception raised."""
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise error(f"{what} file {str(path)!r} does not exist; check {key}")
        module = _import_file(path, what, error)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise error(f"cannot import {what} module {target!r}: {e}; check {key} "
                        f"(module:{noun}, with the module on the Python path)") from None
        except Exception as e:  # noqa: BLE001 - the user's module may raise anything while importing
            raise error(f"{what} module {target!r} fails to import ({_first_line(e)}); fix the module") from None
    obj = getattr(module, name, None)
    if obj is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        hint = difflib.get_close_matches(name, names, n=1)
        suggestion = f"did you mean {hint[0]!r}?" if hint else \
            (f"it defines {', '.join(sorted(names)[:8])}" if names else "it defines no functions or classes")
        raise error(f"{target!r} has no {noun} {name!r} ({suggestion}); fix {key}")
    return obj


def check_picklable(fn) -> None:
    """Refuse reward functions that cannot reach a worker process."""
    qual = getattr(fn, "__qualname__", "")
    if "<lambda>" in qual or "<locals>" in qual:
        raise RewardFunctionError(
            f"reward function {qual!r} is a lambda or a nested function and cannot be sent to a "
            "scorer process; define it at module level and name it as 'module:function'"
        )
    try:
        pickle.loads(pickle.dumps(fn))
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        raise RewardFunctionError(
            f"reward function {qual or fn!r} cannot be pickled ({e}); define it at module level"
        ) from None
