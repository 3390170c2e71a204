"""Held-out evaluation: greedy accuracy of a model on a task's eval split.

Accuracy is the fraction of eval prompts whose greedy completion gets reward ≥ 0.5
(``tokenflow.rollout.CORRECT_REWARD``, the threshold dynamic sampling counts correct samples
with; for the 0/1 rewards of verifiable tasks, the fraction solved). Prompts are encoded by
`tokenflow.tasks.prompts.prompt_encoder`, as in training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from tokenflow.rollout import CORRECT_REWARD
from tokenflow.tasks.base import Task
from tokenflow.tasks.prompts import prompt_encoder


def accuracy_of(generate: Callable[[list[list[int]]], list[str]], tokenizer, task: Task,
                limit: int | None = None, encode: Callable[[str], list[int]] | None = None) -> float:
    """``encode``: a `tokenflow.tasks.prompts.prompt_encoder` (default: the tokenizer's plain
    `encode_prompt`)."""
    return evaluate(generate, tokenizer, task, limit, encode).accuracy


@dataclass
class Evaluation:
    """Held-out greedy accuracy, and the reward's components when it returns a dict.

    ``components``: each numeric component's mean over the prompts (``{"format": 0.4}``);
    ``accuracy_given``: for each component that is 0 or 1 on every prompt, the accuracy among the
    prompts where it is 1 (the accuracy among answers in the required form, say), None when it
    is never 1. Together they split a gain into form and substance."""

    accuracy: float
    prompts: int
    components: dict[str, float] = field(default_factory=dict)
    accuracy_given: dict[str, float | None] = field(default_factory=dict)


def evaluate(generate: Callable[[list[list[int]]], list[str]], tokenizer, task: Task,
             limit: int | None = None, encode: Callable[[str], list[int]] | None = None) -> Evaluation:
    encode = encode or prompt_encoder(tokenizer)
    prompts = task.eval_prompts()[:limit]
    completions = generate([encode(p.text) for p in prompts])
    raw = [task.reward_fn(p.text, c, p.example) for p, c in zip(prompts, completions)]
    correct = [float(r["reward"] if isinstance(r, dict) else r) >= CORRECT_REWARD for r in raw]
    n = max(1, len(prompts))
    out = Evaluation(sum(correct) / n, len(prompts))
    names = sorted({k for r in raw if isinstance(r, dict) for k in r if k != "reward"})
    for name in names:
        values = [r.get(name) if isinstance(r, dict) else None for r in raw]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            continue  # missing on some prompts, or not a finite number: no mean to give
        out.components[name] = sum(float(v) for v in values) / n
        if all(float(v) in (0.0, 1.0) for v in values):
            among = [c for c, v in zip(correct, values) if float(v) == 1.0]
            out.accuracy_given[name] = sum(among) / len(among) if among else None
    return out


def hf_greedy_generate(model, tokenizer, max_new_tokens: int = 96, batch: int = 256):
    """A ``generate`` callable for :func:`accuracy_of` backed by a transformers model."""
    import torch

    def generate(prompt_ids: list[list[int]]) -> list[str]:
        out: list[str] = []
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        was_training = model.training
        model.eval()
        for i in range(0, len(prompt_ids), batch):
            chunk = prompt_ids[i : i + batch]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), pad)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, row in enumerate(chunk):  # left padding, as generate() expects
                ids[j, width - len(row):] = torch.tensor(row)
                mask[j, width - len(row):] = 1
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=pad,
                                     eos_token_id=tokenizer.eos_token_id)
            out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        model.train(was_training)
        return out

    return generate


def greedy_accuracy(model, tokenizer, task: Task, limit: int | None = None) -> float:
    """Held-out greedy accuracy of an in-memory transformers model."""
    return accuracy_of(hf_greedy_generate(model, tokenizer), tokenizer, task, limit)


def engine_greedy_generate(engine, max_tokens: int = 96, stop: tuple[str, ...] = ()):
    """A ``generate`` callable for :func:`accuracy_of` backed by a tokenflow ``Engine``."""
    from tokenflow.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop)

    def generate(prompt_ids: list[list[int]]) -> list[str]:
        return [group[0].text or "" for group in engine.generate(prompt_ids, params)]

    return generate
