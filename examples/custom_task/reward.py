"""Reward for examples/custom_task: exact answer, plus a logged format component.

A reward function takes (prompt, completion, example) — example is the dataset row — and
returns a float or a dict with a "reward" entry; other entries are logged as reward/<name>_mean.
"""


def score(prompt: str, completion: str, example: dict) -> dict:
    has_answer = ">" in completion
    answer = completion.rsplit(">", 1)[1].strip() if has_answer else None
    return {"reward": float(answer == example["answer"]), "format": float(has_answer)}
