"""References for the Tinker service tests: the same model and adapters as a training client,
rebuilt from its saved state in plain transformers + peft, its losses from tokenflow's loss code
on full-vocabulary log-softmaxes, and float32 bounds derived as in tests/real_model/real_testlib."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from tests.real_model.real_testlib import U32, roundings


def saved_state(service, tinker_path: str) -> dict:
    """The state file a ``save_state`` wrote (read straight from the service's root)."""
    from tokenflow.tinker import store

    loc = store.parse(tinker_path)
    return torch.load(Path(service.store.folder(loc)) / "state.pt", weights_only=True)


def reference_model(folder: str, rank: int, adapters: dict):
    """transformers' model with LoRA adapters of the service's layout, loaded with ``adapters``."""
    from transformers import AutoModelForCausalLM

    from tokenflow.tinker.training import Lora, TrainingModel
    from tokenflow.trainer.model.lora import load_adapter_state

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = TrainingModel._with_adapters(hf, Lora(rank=rank))
    load_adapter_state(model, adapters)
    return model


def token_logprobs(model, tokens: list[int], targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target_t | tokens[:t+1]) for every position, and the logits (full vocabulary)."""
    logits = model(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(targets)[:, None])[:, 0]
    return lp, logits


def reference_loss(loss_fn: str, lp: torch.Tensor, inputs: dict, config: dict) -> torch.Tensor:
    """The SDK's documented loss, summed, with tokenflow.algorithms.losses where it has one."""
    from tokenflow.algorithms.losses import cispo, ppo_clip

    if loss_fn == "cross_entropy":
        return -(inputs["weights"] * lp).sum()
    q, adv = inputs["logprobs"], inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -(torch.exp(lp - q) * adv).sum()
    if loss_fn == "ppo":
        lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
        return ppo_clip(lp, q, adv, clip_low=1 - lo, clip_high=hi - 1)[0].sum()
    if loss_fn == "cispo":
        lo, hi = config.get("clip_low_threshold", 0.0), config.get("clip_high_threshold", 4.0)
        return cispo(lp, q, adv, clip_low=1 - lo, clip_high=hi - 1)[0].sum()
    if loss_fn == "dro":
        beta = config.get("beta", 1.0)
        return -(adv * lp - 0.5 * beta * (lp - q) ** 2).sum()
    raise ValueError(loss_fn)


def logprob_bound(model, logits: torch.Tensor) -> float:
    """Largest gap two float32 implementations of the model may leave between one log-prob
    (first-order: 4·n·u·max|logit|, n the roundings on the path to a logit)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return 4 * roundings(base) * U32 * logits.abs().max().item()


def gradient_bound(model, grads: list[torch.Tensor]) -> float:
    """Largest gap in one gradient entry: the backward pass retraces the forward's roundings and
    as many again (the transposed products), so 2n roundings, each moving a value by at most
    u times the largest gradient entry: 4·(2n)·u·max|g| as for the log-probs."""
    base = model.get_base_model()
    return 4 * 2 * roundings(base) * U32 * max(g.abs().max().item() for g in grads)


def datums(vocab: int, lengths: list[int], seed: int, *, rl: bool):
    """Token rows, next-token targets and loss inputs (numpy), the first 3 positions a prompt."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        seq = rng.integers(2, vocab, size=n + 1)
        inputs = {"target_tokens": seq[1:].astype(np.int64)}
        if rl:
            adv = rng.normal(size=n).astype(np.float32)
            adv[:3] = 0.0
            inputs["advantages"] = adv
        else:
            w = np.ones(n, np.float32)
            w[:3] = 0.0
            inputs["weights"] = w
        out.append((seq[:-1].astype(np.int64), inputs))
    return out


def sdk_datum(tokens, inputs):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints([int(t) for t in tokens]),
                       loss_fn_inputs={k: v for k, v in inputs.items()})


def close(a: float, b: float, atol: float) -> bool:
    return math.isfinite(a) and abs(a - b) <= atol
