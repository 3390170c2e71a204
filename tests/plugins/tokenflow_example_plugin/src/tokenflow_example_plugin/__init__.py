"""Example tokenflow plugin: imported through the ``tokenflow.plugins`` entry point, it registers
an advantage estimator, a task and a scorer with tokenflow's registries."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from tokenflow.registry import ADVANTAGES, SCORERS, TASKS
from tokenflow.tasks.arithmetic import parse_answer
from tokenflow.tasks.base import Prompt

log = logging.getLogger(__name__)


@ADVANTAGES.register("median_baseline")  # outcome only: no values, no per-token rewards
def median_baseline(inp, cfg):
    """A_i = r_i − median of r over sample i's group, on every loss token (0 for a lone sample)."""
    from tokenflow.algorithms.advantages import AdvantageResult

    adv = np.zeros(len(inp.rewards))
    for g in np.unique(inp.group_ids):
        idx = np.flatnonzero(inp.group_ids == g)
        if len(idx) > 1:
            adv[idx] = inp.rewards[idx] - np.median(inp.rewards[idx])
    log.info("median_baseline: advantages for %d sequences", len(adv))
    return AdvantageResult([(a * (m > 0)).astype(np.float32) for a, m in zip(adv, inp.masks)])


@SCORERS.register("small_sums_exact")
def small_sums_exact(prompt: str, completion: str, example: dict) -> float:
    """1.0 when the answer after the last '>' is the sum, else 0.0."""
    return 1.0 if parse_answer(completion) == str(example["answer"]) else 0.0


def _check(task_cfg) -> None:
    digits = task_cfg.options.get("max_digits", 2)
    if not isinstance(digits, int) or not 1 <= digits <= 6:
        raise ValueError(f"task.options.max_digits = {digits!r}: small_sums needs an integer from 1 to 6")


@dataclass
class SmallSums:
    """Additions a + b with operands of at most ``max_digits`` digits."""

    seed: int = 0
    max_digits: int = 2
    num_eval: int = 64
    name: str = "small_sums"
    reward_fn = staticmethod(small_sums_exact)
    reward_spec = "small_sums_exact"  # resolved in each scorer process through the registry

    def _prompt(self, stream: int, index: int) -> Prompt:
        rng = np.random.default_rng([self.seed, stream, index])
        a, b = (int(x) for x in rng.integers(0, 10 ** self.max_digits, size=2))
        return Prompt(id=index, text=f"{a}+{b}=", example={"a": a, "b": b, "answer": a + b})

    def train_prompt(self, index: int) -> Prompt:
        return self._prompt(0, index)

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(1, i) for i in range(self.num_eval)]

    def num_train_prompts(self) -> int | None:
        return None


@TASKS.register("small_sums", check=_check)
def small_sums(task_cfg) -> SmallSums:
    return SmallSums(seed=task_cfg.seed, max_digits=task_cfg.options.get("max_digits", 2),
                     num_eval=min(task_cfg.num_eval, 64))
