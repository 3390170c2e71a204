"""The reward of the real-model runs (``task.reward = "tests/real_model/rewards.py:answer_reward"``)."""

from __future__ import annotations


def answer_reward(prompt: str, completion: str, example: dict) -> float:
    """1 when the answer is in the completion; otherwise a little for length, so that the samples
    of a group differ and every step has a signal (the runs check the plumbing, not learning)."""
    if example["answer"].lower() in completion.lower():
        return 1.0
    return min(len(completion), 64) / 256
