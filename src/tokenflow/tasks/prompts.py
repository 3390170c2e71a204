"""How a task's prompt texts become token ids: the one encoding every prompt goes through.

Training, held-out evaluation, the synchronous reference loop, preflight and ``tokenflow eval``
all take their encoder from `prompt_encoder`, so a prompt is the same ids wherever it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable


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
