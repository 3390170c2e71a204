"""Token-level off-policy corrections. Combinable; each one is off unless configured.

All of them act on the **behaviour weight** w_t = π(a_t)/μ(a_t), detached, where μ is the
engine's recorded behaviour log-prob (never recomputed) and π is

* π_prox (the weights before the batch's first optimizer step) for the decoupled objective, and
* π_θ itself for the direct objective (the weights of the current optimizer step).

What each correction does to a token's loss ℓ_t:

* **TIS** (cap C): the token's effective importance weight becomes min(w, C). Decoupled: ℓ is
  multiplied by min(w, C) instead of w. Direct (w already sits inside ρ = π_θ/μ): ℓ is
  multiplied by the detached factor min(1, C/w). A policy loss whose ratio is per sequence
  (GSPO, registry property ``sequence_ratio``) gets the sequence's weight instead: the
  geometric mean w_i = exp(mean_t log w_t) over its loss tokens, capped the same way.
* **IS masking** [a, b]: tokens with w outside [a, b] contribute 0 (to every loss term: the
  objective applies ``keep`` to the policy, KL, entropy and value terms alike).
* **OPSM** (δ): every token of a sequence whose mean advantage is negative and whose mean
  per-token log μ − log π_θ exceeds δ contributes 0.
* **Version rejection** (max age): tokens with trainer_version − token_version > max age are
  removed from the loss *and* its normaliser; it is decided from the versions alone, before any
  forward pass (:func:`version_keep`).

Masked (IS, OPSM) tokens stay in the aggregation normaliser; see :mod:`aggregation`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenflow.algorithms.aggregation import segment_mean
from tokenflow.config.algorithm import AlgorithmConfig

_MAX_LOG_W = 20.0


def version_keep(versions: np.ndarray, trainer_version: int, max_token_age: int | None) -> np.ndarray:
    """Bool per token: True unless the token is more than ``max_token_age`` versions old."""
    if max_token_age is None:
        return np.ones(len(versions), dtype=bool)
    return (trainer_version - np.asarray(versions)) <= max_token_age


@dataclass
class Corrections:
    weight: torch.Tensor
    """Detached per-token multiplier of the policy loss: the corrected behaviour weight min(w, C)
    (decoupled), or TIS's factor min(1, C/w) (direct; 1 without TIS)."""
    keep: torch.Tensor
    """Bool per token: False where IS masking or OPSM dropped the token."""
    log_w: torch.Tensor
    """log w per token (detached), for metrics."""
    used_w: torch.Tensor
    """The behaviour weight the loss uses, detached: min(w, C) (per sequence for a sequence-ratio
    loss), for metrics."""
    tis_clipped: torch.Tensor
    is_masked: torch.Tensor
    opsm_dropped: torch.Tensor


def apply_corrections(cfg: AlgorithmConfig, *, logprobs: torch.Tensor, behaviour: torch.Tensor,
                      prox: torch.Tensor | None, adv: torch.Tensor, mask: torch.Tensor,
                      seq_index: torch.Tensor, num_seqs: int, sequence_weight: bool = False) -> Corrections:
    """Behaviour weights and drop decisions for one micro-batch's tokens (all tensors [n]).

    ``logprobs`` is log π_θ (its gradient is ignored here), ``behaviour`` log μ, ``prox`` log
    π_prox (decoupled only; None means π_θ's value), ``mask`` the loss tokens, ``adv`` the
    advantages. ``sequence_weight``: the loss multiplier (and TIS) use each sequence's geometric
    mean weight instead of the token's own (IS masking still looks at each token's w).
    """
    current = logprobs.detach()
    decoupled = cfg.objective == "decoupled"
    # π_prox defaults to π_θ's value (a caller that forwards with the weights π_prox names).
    numerator = prox if decoupled and prox is not None else current
    log_w = (numerator - behaviour).clamp(-_MAX_LOG_W, _MAX_LOG_W)
    w = torch.exp(log_w)
    w_loss = torch.exp(segment_mean(log_w, mask, seq_index, num_seqs))[seq_index] if sequence_weight else w
    weight = w_loss.clone() if decoupled else torch.ones_like(w)
    none = torch.zeros_like(mask, dtype=torch.bool)
    tis_clipped, is_masked, opsm_dropped = none, none, none
    if cfg.tis_cap:  # 0 (or None) is off
        tis_clipped = mask & (w_loss > cfg.tis_cap)
        weight = weight * torch.clamp(cfg.tis_cap / w_loss, max=1.0)
    keep = torch.ones_like(mask, dtype=torch.bool)
    if cfg.is_mask_low is not None:
        keep &= w >= cfg.is_mask_low
    if cfg.is_mask_high is not None:
        keep &= w <= cfg.is_mask_high
    is_masked = mask & ~keep
    if cfg.opsm_delta is not None:
        seq_adv = segment_mean(adv, mask, seq_index, num_seqs)
        seq_div = segment_mean(behaviour - current, mask, seq_index, num_seqs)
        drop_seq = (seq_adv < 0) & (seq_div > cfg.opsm_delta)
        opsm_dropped = mask & drop_seq[seq_index] & keep
        keep &= ~drop_seq[seq_index]
    used = torch.clamp(w_loss, max=cfg.tis_cap) if cfg.tis_cap else w_loss
    return Corrections(weight.detach(), keep, log_w, used.detach(), tis_clipped, is_masked, opsm_dropped)
