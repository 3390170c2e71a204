"""Per-token policy and value losses (lower is better). Aggregation happens elsewhere.

Every policy loss takes ``old_logprobs``: the log-probs its ratio is taken against. That is the
behaviour log-prob log μ for the direct objective and log π_prox for the decoupled one; for a
loss that clips the importance weight itself (CISPO) the objective passes old − log ŵ, so that
the ratio is the whole corrected weight (see :mod:`tokenflow.algorithms.objective`). The
per-token ratio is ρ_t = exp(log π_θ − old), with the log-ratio clamped to ±20 so a very stale
token cannot overflow.

Each function returns ``(loss, clipped)``: the per-token loss and a bool tensor marking tokens
where the clip was active (the token gets no gradient from the ratio for PPO/GSPO, or a clipped
weight for CISPO).
"""

from __future__ import annotations

import torch

from tokenflow.algorithms.aggregation import segment_mean

_MAX_LOG_RATIO = 20.0


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _clip_active(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """Where the PPO min() picks the clipped branch strictly: no gradient reaches the ratio."""
    r = ratio.detach()
    return ((adv > 0) & (r > 1 + clip_high)) | ((adv < 0) & (r < 1 - clip_low))


def ppo_clip(logprobs, old_logprobs, adv, clip_low: float, clip_high: float, **_):
    """−min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)·A) per token.

    Clip-higher (DAPO) is ε_high > ε_low: a positive-advantage token may raise its probability
    further before its gradient stops, widening exploration.
    """
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
    return loss, _clip_active(ratio, adv, clip_low, clip_high)


def gspo(logprobs, old_logprobs, adv, clip_low: float, clip_high: float, *, mask, seq_index, num_seqs, **_):
    """GSPO in its token form: s_i = exp(mean_t log(π_θ/π_old)) over sequence i's loss tokens.

    Each token carries s_{i,t} = sg(s_i)·π_θ(t)/sg(π_θ(t)), whose value is s_i, and loses
    −min(s_{i,t}A_t, clip(s_{i,t})A_t). With one advantage per sequence this has exactly GSPO's
    value and gradient per token; aggregate with "seq_mean_token_mean" to match the paper's
    per-sequence mean. The clip range is on the sequence ratio (the paper uses ~3e-4/4e-4).
    """
    seq_log = segment_mean(log_ratio(logprobs, old_logprobs).detach(), mask, seq_index, num_seqs)
    s = torch.exp(seq_log)[seq_index] * torch.exp(logprobs - logprobs.detach())
    clipped_s = s.clamp(1 - clip_low, 1 + clip_high)
    loss = -torch.minimum(s * adv, clipped_s * adv)
    return loss, _clip_active(s, adv, clip_low, clip_high)


def cispo(logprobs, old_logprobs, adv, clip_low: float, clip_high: float, **_):
    """−sg(clip(ρ, 1 − ε_low, 1 + ε_high))·A·log π_θ (MiniMax-M1).

    The clipped ratio is a detached weight, so every token keeps a gradient (A·∇log π_θ scaled by
    the weight) even where PPO would have zeroed it. ``clipped`` marks ρ outside the range.
    """
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = -weight * adv * logprobs
    return loss, (ratio < 1 - clip_low) | (ratio > 1 + clip_high)


# Registered by name (as "ppo", "gspo", "cispo") in tokenflow.registry.POLICY_LOSSES.
from tokenflow.registry import POLICY_LOSSES  # noqa: E402,F401  (re-exported)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               clip: float | None = None) -> torch.Tensor:
    """0.5·(V − R)² per token; with ``clip``, PPO's max of the plain and clipped squared errors,
    the clipped prediction being V_old + clip(V − V_old, −clip, clip)."""
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * err
