"""The default task: multi-digit addition with worked column steps.

Prompt ``"347+85="``; a correct completion works the columns right to left, then gives the
answer after ``>``::

    7+5=12,4+8+1=13,3+0+1=4>432

Operands have 1–6 digits (short ones most often), so completions run from ~8 to ~70 characters:
a long-tailed length distribution with stragglers, like reasoning RL. The reward is 1 when the
number after the last ``>`` equals ``a + b`` and 0 otherwise.

The training stream is generated from ``(seed, index)``, so ``train_prompt(i)`` is the same prompt
in every run and resume can account for prompts exactly; the held-out split is a separate
stream, and training prompts that collide with it are redrawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tokenflow.tasks.base import Prompt

# Probability of an operand having 1..6 digits: mostly short, with a tail of long ones.
DIGIT_WEIGHTS = np.array([0.30, 0.30, 0.18, 0.10, 0.07, 0.05])
VOCAB = "0123456789+-*=,> "
EVAL_STREAM = 1_000_003  # offsets the eval stream's seed from the training stream's


def _draw_operand(rng: np.random.Generator) -> int:
    ndigits = int(rng.choice(len(DIGIT_WEIGHTS), p=DIGIT_WEIGHTS)) + 1
    low = 0 if ndigits == 1 else 10 ** (ndigits - 1)
    return int(rng.integers(low, 10**ndigits))


def worked_solution(a: int, b: int, drop_carry: "np.ndarray | None" = None) -> str:
    """The column-by-column completion for ``a+b``.

    ``drop_carry[i]`` true makes column i forget the incoming carry (a common slip); the steps
    and the answer stay consistent with the slip, so the result is a fluent wrong solution.
    """
    da, db = str(a)[::-1], str(b)[::-1]
    ncols = max(len(da), len(db))
    steps, digits, carry = [], [], 0
    for i in range(ncols + 1):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        if i == ncols and carry == 0:
            break
        if carry and drop_carry is not None and i < len(drop_carry) and drop_carry[i]:
            carry = 0
        s = x + y + carry
        steps.append(f"{x}+{y}+1={s}" if carry else f"{x}+{y}={s}")
        digits.append(s % 10)
        carry = s // 10
    answer = "".join(str(d) for d in reversed(digits))
    return ",".join(steps) + ">" + answer


def parse_answer(completion: str) -> str | None:
    """The text after the last ``>``, stripped; None when there is no answer."""
    if ">" not in completion:
        return None
    return completion.rsplit(">", 1)[1].strip()


def arithmetic_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 when the final answer equals the true sum, else 0.0."""
    return 1.0 if parse_answer(completion) == str(example["answer"]) else 0.0


@dataclass
class ArithmeticTask:
    """Addition with worked steps; see the module docstring."""

    seed: int = 0
    num_eval: int = 256
    name: str = "arithmetic"

    reward_fn = staticmethod(arithmetic_reward)
    reward_spec = "tokenflow.tasks.arithmetic:arithmetic_reward"

    def _problem(self, stream: int, index: int) -> tuple[int, int]:
        rng = np.random.default_rng([stream, index])
        return _draw_operand(rng), _draw_operand(rng)

    @staticmethod
    def _prompt(index: int, a: int, b: int) -> Prompt:
        return Prompt(id=index, text=f"{a}+{b}=", example={"a": a, "b": b, "answer": a + b})

    @cached_property
    def _eval_pairs(self) -> list[tuple[int, int]]:
        pairs: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        i = 0
        while len(pairs) < self.num_eval:
            p = self._problem(self.seed + EVAL_STREAM, i)
            i += 1
            if p not in seen:
                seen.add(p)
                pairs.append(p)
        return pairs

    @cached_property
    def _eval_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._eval_pairs)

    def train_prompt(self, index: int) -> Prompt:
        rng = np.random.default_rng([self.seed, index])
        while True:
            a, b = _draw_operand(rng), _draw_operand(rng)
            if (a, b) not in self._eval_set:
                return self._prompt(index, a, b)

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(i, a, b) for i, (a, b) in enumerate(self._eval_pairs)]

    def num_train_prompts(self) -> int | None:
        return None


def from_config(cfg) -> ArithmeticTask:
    """The registered factory (``task.name = "arithmetic"``)."""
    return ArithmeticTask(seed=cfg.seed, num_eval=cfg.num_eval)
