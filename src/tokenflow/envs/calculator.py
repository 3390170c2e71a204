"""The built-in tool environment: arithmetic with a calculator the model calls in plain text.

A question is ``a*b`` or ``a*b+c`` with two-digit ``a`` and ``b`` (``"47*83+29"``): a product a
tiny model cannot work out in its head. With the tools it takes three turns::

    assistant: mul(47,83)      tool: 3901
    assistant: add(3901,29)    tool: 3930
    assistant: 3930            (no call: the final answer; reward 1 if it is right)

(two for ``a*b``). The shipped tool model (`tokenflow.shipped_models.make_tool_model`) is warm-started on
such episodes with a deliberate slip — after the product it often answers at once, forgetting
``+c`` — so RL has something to fix.

Examples come from the class (``task.name = "env"``): a training stream indexed by position,
seeded, and a held-out split the training stream never draws.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tokenflow.envs.rubric import Rubric
from tokenflow.envs.tool_env import ToolEnvironment

TWO_STEP_SHARE = 0.6
"""Share of questions of the form a*b+c (the others are a*b)."""
EVAL_STREAM = 2_000_003  # offsets the held-out stream's seed from the training stream's


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def parse_answer(text: str) -> int | None:
    """The integer a final answer states, or None if it is not just an integer."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None


def correct(completion: str, example: dict) -> float:
    """1 when the final answer equals the true value."""
    return float(parse_answer(completion) == example["answer"])


def tool_calls(info: dict) -> float:
    """Tool calls that ran (a metric)."""
    return float(info.get("tool_calls", 0))


def malformed(info: dict) -> float:
    """Tool calls that could not be run (a metric)."""
    return float(info.get("malformed_tool_calls", 0) + info.get("tool_errors", 0))


def problem(rng: np.random.Generator) -> tuple[int, int, int | None]:
    """(a, b, c) with c None for a one-step question."""
    a, b = (int(x) for x in rng.integers(10, 100, size=2))
    c = int(rng.integers(1, 100)) if rng.random() < TWO_STEP_SHARE else None
    return a, b, c


def example_of(a: int, b: int, c: int | None) -> dict:
    question = f"{a}*{b}" + (f"+{c}" if c is not None else "")
    return {"prompt": question, "a": a, "b": b, "c": c, "answer": a * b + (c or 0)}


@lru_cache(maxsize=8)
def _held_out(seed: int, n: int) -> tuple[tuple[int, int, int | None], ...]:
    out: list[tuple[int, int, int | None]] = []
    seen: set = set()
    i = 0
    while len(out) < n:
        p = problem(np.random.default_rng([seed + EVAL_STREAM, i]))
        i += 1
        if p not in seen:
            seen.add(p)
            out.append(p)
    return tuple(out)


@lru_cache(maxsize=8)
def _held_out_set(seed: int, n: int) -> frozenset:
    return frozenset(_held_out(seed, n))


class CalculatorEnv(ToolEnvironment):
    """Arithmetic with ``add`` and ``mul`` tools in the plain format; see the module docstring."""

    tools = [add, mul]
    tool_format = "plain"
    max_turns = 4
    rubric = Rubric([correct, tool_calls, malformed], weights=[1.0, 0.0, 0.0])
    num_held_out = 256
    """Size of the held-out split the training stream avoids (the largest eval split served)."""

    def reset(self, example: dict):
        return [{"role": "user", "content": example["prompt"]}], list(self.tools)

    @classmethod
    def train_example(cls, index: int, seed: int) -> dict:
        held_out = _held_out_set(seed, cls.num_held_out)
        rng = np.random.default_rng([seed, index])
        while True:
            p = problem(rng)
            if p not in held_out:
                return example_of(*p)

    @classmethod
    def eval_examples(cls, seed: int, n: int) -> list[dict]:
        if n > cls.num_held_out:
            raise ValueError(f"CalculatorEnv holds out {cls.num_held_out} examples; ask for at most that many")
        return [example_of(*p) for p in _held_out(seed, n)]
