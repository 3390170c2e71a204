"""The reward of examples/laptop_math: the number after the last "The answer is", exactly.

    task.reward = "examples/laptop_math/reward.py:score"

1.0 when the completion states its answer in the required form ("The answer is 24.") and that
number is the row's answer, else 0.0. No credit for the form alone: a model that only learns
to write the sentence gains nothing. Two components are logged beside the reward (as
``reward/format_mean`` and ``reward/correct_mean``): whether the form is there at all, and
whether the answer is correct. ``tokenflow eval`` reports the same two on the held-out
prompts (and the accuracy among the answers in the form), so a gain can be split into form and
substance.
"""

from __future__ import annotations

import re

# "The answer is 24", "the answer is: 24", "The final answer is $24$.", "The answer is **24**."
# -- the last one counts. The number must end there: "The answer is 1000.5" states no whole
# number (it is not 1000), so it is not in the form.
ANSWER = re.compile(r"answer is\s*:?\s*(?:\*\*)?\s*\$?\s*(-?\d[\d,]*)(?![.,]?\d)", re.IGNORECASE)


def stated_answer(completion: str) -> str | None:
    """The number the completion gives as its answer, or None when it gives none in the form."""
    found = ANSWER.findall(completion)
    return found[-1].replace(",", "") if found else None


def score(prompt: str, completion: str, example: dict) -> dict:
    answer = stated_answer(completion)
    correct = answer is not None and answer.lstrip("0") == str(example["answer"]).lstrip("0")
    return {"reward": float(correct), "format": float(answer is not None), "correct": float(correct)}
