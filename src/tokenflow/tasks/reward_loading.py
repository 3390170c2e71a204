"""Resolve a reward function named as ``module:function`` or ``path/to/file.py:function``.

Reward functions run in scorer worker processes, so they must be importable there by name:
a lambda, a closure or a method defined under ``if __name__ == "__main__"`` is refused here, at
start, with a message saying what to do instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
from pathlib import Path


class RewardFunctionError(ValueError):
    pass


def load_reward_fn(spec: str):
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
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise RewardFunctionError(f"reward file {str(path)!r} does not exist")
        # Import under a stable module name and make its folder importable for the workers.
        sys.path.insert(0, str(path.parent))
        module_name = path.stem
        spec_ = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec_)
        sys.modules[module_name] = module
        spec_.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise RewardFunctionError(f"cannot import reward module {target!r}: {e}") from None
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise RewardFunctionError(f"{target!r} has no function {name!r}")
    check_picklable(fn)
    return fn


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
