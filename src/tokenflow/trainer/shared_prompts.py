"""Shared prompts (``trainer.share_prompts``): a group's samples read their prompt once.

A GRPO group is n completions of one prompt. Trained one sequence per row, the prompt is
forwarded (and back-propagated) n times; its hidden states are the same every time, since a
causal model's prompt positions never see the completion. Here a row holds the prompt once and
then each sample's completion tokens, every completion with the position ids it has in its own
sequence (continuing from the prompt's length), under a mask that lets each completion token
attend to the prompt and to the earlier tokens of its own completion only:

    row       p0 p1 p2 | a0 a1 | b0 b1 b2
    position   0  1  2 |  3  4 |  3  4  5
    a1 reads  p0 p1 p2    a0 a1             (not b*)

Each token then sees exactly what it sees in its own sequence, so the logits are those of the
unshared rows up to float rounding, and the prompt's gradient is the sum of the samples' (the
backward through the shared keys and values adds them). The first target of every sample is
predicted at the prompt's last position, which the samples share.

The engine already prefills a group's prompt once (`engine.builtin`); this is the trainer's side
of the same saving. With prompts of 100-150 tokens and completions of about 50 (the laptop
example), a group of 8 forwards ~520 tokens instead of ~1,300.

Shared rows need an explicit attention mask (transformers takes a 4-D mask as given), so they
apply where the model's attention takes one as is: ``eager`` and ``sdpa``, no sliding window.
Sequences with a routing record (Keep Routing) are never shared: their prompt's experts are
replayed per sequence.
"""

from __future__ import annotations

import numpy as np
import torch


def prompt_key(seq) -> tuple | None:
    """What sequences must have in common to share a row: their prompt's ids (None: never shared)."""
    if seq.routing is not None or seq.prompt_len < 1:
        return None
    return seq.prompt_len, seq.input_ids[: seq.prompt_len].tobytes()


def prompt_groups(seqs) -> list[list[int]]:
    """Indices of ``seqs`` grouped by prompt (`prompt_key`), in order of first appearance; a
    sequence that is never shared is a group of its own."""
    by_key: dict[object, list[int]] = {}
    for i, s in enumerate(seqs):
        key = prompt_key(s)
        by_key.setdefault(key if key is not None else ("alone", i), []).append(i)
    return list(by_key.values())


def unit_width(unit) -> int:
    """Tokens a unit of sequences occupies in a row: its prompt once when shared."""
    if len(unit) == 1:
        return len(unit[0].input_ids)
    prompt = unit[0].prompt_len
    return prompt + sum(len(s.input_ids) - prompt for s in unit)


def block_mask(segment: np.ndarray, parent: np.ndarray) -> torch.Tensor:
    """[B, 1, W, W] bool, True where a query (row, i) may attend to key (row, j): j ≤ i, and j in
    i's own segment or in the segment i hangs off (its shared prompt; -1: none)."""
    seg = torch.from_numpy(segment)
    par = torch.from_numpy(parent)
    width = seg.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    below = par[:, :, None] == seg[:, None, :]
    return ((same | below) & causal)[:, None]


def model_mask(allowed: torch.Tensor, attn_implementation: str) -> torch.Tensor:
    """``allowed`` in the form the attention implementation adds or applies: sdpa takes the bool
    mask, eager an additive float32 one (0 or float32's lowest, as transformers builds its own
    under float32 embeddings)."""
    if attn_implementation == "sdpa":
        return allowed
    lowest = torch.finfo(torch.float32).min
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(~allowed, lowest)


def attn_implementation(model) -> str | None:
    """The transformers attention implementation ``model`` runs (None: not a transformers model)."""
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "text_config", None) or cfg
    return getattr(text, "_attn_implementation", None) or getattr(cfg, "_attn_implementation", None)


def sharing_blocker(model) -> str | None:
    """Why shared rows cannot run through ``model``'s attention, or None."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "the model has no transformers config"
    cfg = getattr(cfg, "text_config", None) or cfg
    impl = attn_implementation(model)
    if impl not in ("eager", "sdpa"):
        return f"attention implementation {impl!r} does not take an explicit mask (eager and sdpa do)"
    layer_types = getattr(cfg, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        return "the model has sliding-window or other non-full attention layers"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    return None
