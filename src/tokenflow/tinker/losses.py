"""The Tinker SDK's built-in losses, by its names and inputs, over tokenflow's own loss code.

Every loss is a sum over the datum's positions (no normalisation: the caller scales advantages
or weights as it wants), as the SDK documents. Inputs per position:

* ``cross_entropy``: ``target_tokens``, ``weights`` → −Σ w·log p(target).
* ``importance_sampling``: ``target_tokens``, ``logprobs`` (the sampler's), ``advantages``
  → −Σ ρ·A with ρ = p/q (`tokenflow.algorithms.losses.ppo_clip` with an unbounded range).
* ``ppo``: as above, −Σ min(ρA, clip(ρ, lo, hi)·A); ``loss_fn_config`` ``clip_low_threshold``
  / ``clip_high_threshold`` are ratio bounds (default 0.8 / 1.2), `ppo_clip`'s ε = 1 − lo, hi − 1.
* ``cispo``: −Σ sg(clip(ρ, lo, hi))·A·log p (default 0 / 4), `tokenflow.algorithms.losses.cispo`.
* ``dro``: −Σ (A·log p − β/2·(log p − log q)²), ``beta`` default 1.

``gspo``, ``stable_reinforce`` and server-side ``custom`` losses are refused with a user error
that says so (the SDK's ``forward_backward_custom`` still works: it runs the loss on the client
and sends ``cross_entropy`` with weights).
"""

from __future__ import annotations

import math

import torch

from tokenflow.tinker.errors import user_error

_RL_INPUTS = ("target_tokens", "logprobs", "advantages")
INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _RL_INPUTS,
    "ppo": _RL_INPUTS,
    "cispo": _RL_INPUTS,
    "dro": _RL_INPUTS,
}
CONFIG = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 1.0},
}
UNSUPPORTED = {
    "gspo": "its sequence-level ratio needs the SDK's provenance spans",
    "stable_reinforce": "it needs the sampler's recorded stability information",
    "custom": "server-side custom losses are not stored here; forward_backward_custom runs them on the client",
}


def check(loss_fn: str, config: dict) -> dict[str, float]:
    """``config`` with the defaults filled in; a user error for an unknown loss or key."""
    if loss_fn in UNSUPPORTED:
        raise user_error(f"loss_fn {loss_fn!r} is not supported by tokenflow tinker: {UNSUPPORTED[loss_fn]}. "
                         f"Supported: {', '.join(INPUTS)}")
    if loss_fn not in INPUTS:
        raise user_error(f"unknown loss_fn {loss_fn!r}; supported: {', '.join(INPUTS)}")
    unknown = sorted(set(config) - set(CONFIG[loss_fn]))
    if unknown:
        allowed = ", ".join(CONFIG[loss_fn]) or "none"
        raise user_error(f"loss_fn_config keys {unknown} are not used by {loss_fn!r} (it takes: {allowed})")
    out = dict(CONFIG[loss_fn])
    for k, v in config.items():
        if isinstance(v, str) or not math.isfinite(float(v)):
            raise user_error(f"loss_fn_config[{k!r}] must be a finite number, got {v!r}")
        out[k] = float(v)
    if loss_fn in ("ppo", "cispo") and not 0 <= out["clip_low_threshold"] <= 1 <= out["clip_high_threshold"]:
        raise user_error(f"loss_fn_config: {loss_fn} needs 0 ≤ clip_low_threshold ≤ 1 ≤ clip_high_threshold, "
                         f"got {out['clip_low_threshold']} and {out['clip_high_threshold']}")
    return out


def required_inputs(loss_fn: str) -> tuple[str, ...]:
    return INPUTS[loss_fn]


def per_token(loss_fn: str, config: dict[str, float], logprobs: torch.Tensor,
              inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss at each position (to be summed), and per-position diagnostics."""
    from tokenflow.algorithms.losses import cispo, ppo_clip

    if loss_fn == "cross_entropy":
        return -inputs["weights"] * logprobs, {}
    old, adv = inputs["logprobs"], inputs["advantages"]
    if loss_fn == "importance_sampling":
        loss, _ = ppo_clip(logprobs, old, adv, clip_low=1.0, clip_high=math.inf)
        return loss, {}
    if loss_fn == "ppo":
        loss, clipped = ppo_clip(logprobs, old, adv, clip_low=1.0 - config["clip_low_threshold"],
                                 clip_high=config["clip_high_threshold"] - 1.0)
        return loss, {"clipped": clipped}
    if loss_fn == "cispo":
        loss, clipped = cispo(logprobs, old, adv, clip_low=1.0 - config["clip_low_threshold"],
                              clip_high=config["clip_high_threshold"] - 1.0)
        return loss, {"clipped": clipped}
    # dro
    return -(adv * logprobs - 0.5 * config["beta"] * (logprobs - old) ** 2), {}
