"""What a task is: a source of prompts plus a reward function.

A reward function has the signature ``fn(prompt: str, completion: str, example: dict)`` and
returns a float, or a dict of named components with a ``"reward"`` entry (the scalar the
advantages use; the other components are logged). It runs in a scorer worker process, so it
must be importable by name (``module:function``) — closures and lambdas are refused at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

RewardFn = Callable[[str, str, dict], "float | dict[str, float]"]


@dataclass(frozen=True)
class Prompt:
    """One prompt of a task. ``id`` is stable across runs: resume accounting relies on it."""

    id: int
    text: str
    example: dict = field(default_factory=dict)
    """The dataset row (or generated fields) handed to the reward function."""


class Task(Protocol):
    name: str
    reward_fn: RewardFn
    """A module-level function scoring one completion."""
    reward_spec: str
    """``module:function`` (or ``file.py:function``) naming reward_fn, for scorer processes."""

    def train_prompt(self, index: int) -> Prompt:
        """The prompt at position ``index`` of the (possibly infinite) training stream.

        Called by the runtime with the data cursor; the same index always gives the same
        prompt, which is what makes resume exact.
        """
        ...

    def eval_prompts(self) -> list[Prompt]:
        """The held-out evaluation split (disjoint from the training stream)."""
        ...

    def num_train_prompts(self) -> int | None:
        """Size of one epoch of training prompts, or None for a generated, unbounded stream."""
        ...
