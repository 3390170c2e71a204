"""Held-out evaluation: greedy accuracy of a model on a task's eval split.

Accuracy is the fraction of eval prompts whose greedy completion gets reward ≥ 0.5
(``tokenflow.rollout.CORRECT_REWARD``, the threshold dynamic sampling counts correct samples
with; for the 0/1 rewards of verifiable tasks, the fraction solved).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

from tokenflow.rollout import CORRECT_REWARD
from tokenflow.tasks.base import Task


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt token ids: BOS (when the tokenizer has one and does not add it itself) + text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def chat_prompt_ids(tokenizer, text: str, system_prompt: str | None = None) -> list[int]:
    """``text`` as one user message (after ``system_prompt``, if any) in the tokenizer's chat
    template, with the generation prompt: the ids the model's answer follows."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": text})
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    # transformers 5 returns a BatchEncoding unless return_dict=False (and some tokenizers still
    # do); older ones a list, or a batch of one.
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if len(out) and isinstance(out[0], (list, tuple)):
        out = out[0]
    return [int(t) for t in out]


def prompt_encoder(tokenizer, task_config=None) -> Callable[[str], list[int]]:
    """How a task's prompt texts become token ids, for training, held-out evaluation, the
    synchronous loop, preflight and ``tokenflow eval`` alike: through the chat template when
    ``task.chat_template`` is on (with ``task.system_prompt``), else `encode_prompt`."""
    if task_config is not None and getattr(task_config, "chat_template", False):
        system = getattr(task_config, "system_prompt", None)
        return lambda text: chat_prompt_ids(tokenizer, text, system)
    return lambda text: encode_prompt(tokenizer, text)


def accuracy_of(generate: Callable[[list[list[int]]], list[str]], tokenizer, task: Task,
                limit: int | None = None, encode: Callable[[str], list[int]] | None = None) -> float:
    """``encode``: a `prompt_encoder` (default: the tokenizer's plain `encode_prompt`)."""
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
