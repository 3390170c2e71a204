"""`Rubric`: weighted reward functions over finished episodes.

A reward function declares, by keyword, what it reads of an episode — any of

* ``messages``: the whole conversation (opening messages, each assistant turn as parsed, the
  observations),
* ``completion``: the text of the last assistant message (the final answer),
* ``example``: the example the episode was reset with,
* ``info``: the steps' ``info``, numbers summed over the episode,
* ``state``: the environment's ``state`` at the end of the episode,

(or ``**kwargs`` for all of them) and returns a number. ``async def`` functions are awaited.
Functions marked `group_reward` see the samples of one prompt at once: each keyword holds a
list with one entry per sample, and they return one number per sample (judges, rankings,
diversity bonuses).

``Rubric(funcs, weights)`` scores a group: each function's value is a component named after it;
``"reward"`` is the weighted sum of the components plus the sum of the rewards the episode's
steps returned (component ``"step_reward"``, present when some episode of the group has step
rewards). A function of weight 0 is a metric: logged, not in the reward.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from typing import Any, Callable, Sequence

from tokenflow.envs.episode import Episode

REWARD_ARGS = ("messages", "completion", "example", "info", "state")
_GROUP_ATTR = "__tokenflow_group_reward__"
_RESERVED = ("reward", "step_reward")


class RubricError(ValueError):
    """A reward function that cannot be used, or returned something that is not a reward."""


def group_reward(fn: Callable) -> Callable:
    """Mark a reward function as group-level: list-valued keywords in, one number per sample out."""
    setattr(fn, _GROUP_ATTR, True)
    return fn


def is_group_reward(fn: Callable) -> bool:
    return bool(getattr(fn, _GROUP_ATTR, False))


class Rubric:
    """Reward functions with weights (default 1 each); see the module docstring."""

    def __init__(self, funcs: Sequence[Callable] = (), weights: Sequence[float] | None = None) -> None:
        funcs = list(funcs)
        weights = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
        if len(weights) != len(funcs):
            raise RubricError(f"{len(funcs)} reward functions but {len(weights)} weights; give one weight each")
        if not all(math.isfinite(w) for w in weights):
            raise RubricError(f"weights must be finite numbers, got {weights}")
        self.funcs = funcs
        self.weights = weights
        self._wants = [_wanted_args(fn) for fn in funcs]
        names = [fn.__name__ for fn in funcs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise RubricError(f"reward function name(s) {', '.join(twice)} used twice; each names a component")
        clash = sorted(set(names) & set(_RESERVED))
        if clash:
            raise RubricError(f"a reward function may not be called {clash[0]!r}: that name is the total's")

    @property
    def names(self) -> list[str]:
        return [fn.__name__ for fn in self.funcs]

    def score(self, episodes: Sequence[Episode]) -> list[dict[str, float]]:
        """Score the episodes of one group (one prompt): per episode, every component and ``"reward"``.
        Use `score_async` from inside a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.score_async(episodes))
        raise RuntimeError("Rubric.score was called inside a running event loop; await Rubric.score_async instead")

    async def score_async(self, episodes: Sequence[Episode]) -> list[dict[str, float]]:
        episodes = list(episodes)
        out: list[dict[str, float]] = [{} for _ in episodes]
        total = [0.0] * len(episodes)
        for fn, weight, wants in zip(self.funcs, self.weights, self._wants):
            values = await self._values(fn, wants, episodes)
            for i, v in enumerate(values):
                out[i][fn.__name__] = v
                total[i] += weight * v  # weight 0: a metric (values are finite, so it adds 0)
        if any(ep.step_rewards for ep in episodes):
            for i, ep in enumerate(episodes):
                out[i]["step_reward"] = float(sum(ep.step_rewards))
                total[i] += out[i]["step_reward"]
        for i in range(len(episodes)):
            out[i]["reward"] = total[i]
        return out

    async def _values(self, fn: Callable, wants: tuple[str, ...], episodes: list[Episode]) -> list[float]:
        if is_group_reward(fn):
            kwargs = {k: [_arg(ep, k) for ep in episodes] for k in wants}
            got = await _call(fn, kwargs)
            if not isinstance(got, (list, tuple)) or len(got) != len(episodes):
                raise RubricError(f"group reward function {fn.__name__} returned {_show(got)}; it must return a "
                                  f"list of {len(episodes)} numbers, one per sample")
            return [_number(fn, v) for v in got]
        return [_number(fn, await _call(fn, {k: _arg(ep, k) for k in wants})) for ep in episodes]


def _wanted_args(fn: Callable) -> tuple[str, ...]:
    if not callable(fn):
        raise RubricError(f"{fn!r} is not a function; a rubric takes reward functions")
    name = getattr(fn, "__name__", repr(fn))
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return REWARD_ARGS
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)]
    unknown = [p.name for p in params if p.kind not in (p.VAR_KEYWORD,) and p.name not in REWARD_ARGS
               and p.default is p.empty]
    if positional or unknown:
        raise RubricError(f"reward function {name} takes {', '.join(positional + unknown)}; reward functions "
                          f"take keyword arguments from: {', '.join(REWARD_ARGS)}")
    return tuple(p.name for p in params if p.name in REWARD_ARGS)


def _arg(episode: Episode, key: str) -> Any:
    return episode.completion if key == "completion" else getattr(episode, key)


async def _call(fn: Callable, kwargs: dict) -> Any:
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _number(fn: Callable, v: Any) -> float:
    if isinstance(v, numbers.Real) and math.isfinite(v):  # bools and NumPy scalars included
        return float(v)
    raise RubricError(f"reward function {fn.__name__} returned {_show(v)}; it must return a finite number")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) < 80 else text[:77] + "..."
