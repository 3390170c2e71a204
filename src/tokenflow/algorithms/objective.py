"""One micro-batch's loss: policy loss × corrections + KL + entropy bonus + value loss.

Pure tensor code with no model in sight, so every piece is testable on hand-made numbers. The
trainer calls :func:`micro_batch_loss` once per packed micro-batch and backpropagates the result;
the per-token aggregation weights already carry the whole step's normaliser, so the micro-batch
losses sum to the step's loss.

The ratio each objective clips (``old`` below):

* direct:    ρ = π_θ / μ,      token loss = policy_loss(ρ) · correction factor
* decoupled: ρ = π_θ / π_prox, token loss = policy_loss(ρ) · w, w = π_prox/μ corrected (TIS)

Loss terms, each already aggregated and scaled, so that total = policy + kl + entropy + value:
``policy``, ``kl`` = kl_coef·KL, ``entropy_bonus`` = −entropy_coef·H, ``value`` =
value_coef·0.5(V − R)².

A token that a correction drops (IS masking, OPSM; version rejection already left ``mask``)
contributes nothing to *any* term: all four aggregate with the same weights ``weights · keep``.
A dropped token is one the trainer does not trust, so pulling it towards the reference, raising
its entropy or fitting a value to it would train on the same data the policy term refuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tokenflow.algorithms.aggregation import aggregate
from tokenflow.algorithms.config import AlgorithmConfig
from tokenflow.algorithms.corrections import apply_corrections
from tokenflow.algorithms.kl import token_kl
from tokenflow.algorithms.losses import POLICY_LOSSES, log_ratio, value_loss
from tokenflow.algorithms.stats import Accumulator


@dataclass
class TokenInputs:
    """Flat per-token tensors [n] of one micro-batch (completion tokens of its sequences)."""

    logprobs: torch.Tensor
    """log π_θ(a_t), with gradient."""
    behaviour: torch.Tensor
    """log μ(a_t): truncated where the Keep Sampling Mask applied, full-vocabulary otherwise."""
    advantages: torch.Tensor
    mask: torch.Tensor
    """Bool: loss tokens (loss mask 1 and kept by version rejection)."""
    weights: torch.Tensor
    """Aggregation weight per token (0 off the mask); see :mod:`aggregation`."""
    seq_index: torch.Tensor
    """Sequence of each token, 0..num_seqs-1 within the micro-batch."""
    num_seqs: int
    prox: torch.Tensor | None = None
    """log π_prox(a_t), detached (decoupled objective, or no behaviour log-probs). With the
    decoupled objective and behaviour log-probs, None means ``logprobs`` detached: the step's
    forward ran with the start-of-step weights."""
    entropy: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


@dataclass
class LossTerms:
    total: torch.Tensor
    policy: torch.Tensor
    kl: torch.Tensor
    entropy_bonus: torch.Tensor
    value: torch.Tensor


def micro_batch_loss(cfg: AlgorithmConfig, t: TokenInputs, stats: Accumulator | None = None) -> LossTerms:
    """Assemble the configured loss for one micro-batch; add its statistics to ``stats``."""
    if cfg.behaviour_logprobs and cfg.objective == "decoupled" and t.prox is None:
        # One optimizer step per batch: π_prox, the weights at the start of the step, are the
        # weights this forward ran with (Trainer.prox_from_forward).
        t = dataclasses.replace(t, prox=t.logprobs.detach())
    if cfg.behaviour_logprobs:
        old = t.prox if cfg.objective == "decoupled" else t.behaviour
    else:
        old = t.prox  # no engine log-probs: π_prox stands in for μ
    if old is None:
        raise ValueError(f"objective {cfg.objective!r} needs π_prox log-probs (a prox pass)")
    behaviour = t.behaviour if cfg.behaviour_logprobs else t.prox
    corr = apply_corrections(cfg, logprobs=t.logprobs, behaviour=behaviour, prox=t.prox,
                             adv=t.advantages, mask=t.mask, seq_index=t.seq_index, num_seqs=t.num_seqs)
    pg, clipped = POLICY_LOSSES.get(cfg.policy_loss)(
        t.logprobs, old, t.advantages, cfg.clip_low, cfg.clip_high,
        mask=t.mask, seq_index=t.seq_index, num_seqs=t.num_seqs)
    # One weight for every term: dropped tokens leave the KL, entropy and value terms too.
    w = t.weights * corr.keep
    policy = aggregate(pg * corr.weight, w)
    zero = policy.new_zeros(())
    kl_term, ent_term, val_term = zero, zero, zero
    kl = None
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:  # in the reward, it is already in the advantages
        if t.ref_logprobs is None:
            raise ValueError("algorithm.kl_coef > 0 needs reference log-probs")
        kl = token_kl(t.logprobs, t.ref_logprobs, cfg.kl_estimator)
        kl_term = cfg.kl_coef * aggregate(kl, w)
    if cfg.entropy_coef > 0 and t.entropy is not None:
        ent_term = -cfg.entropy_coef * aggregate(t.entropy, w)
    if t.values is not None and t.returns is not None:
        vl = value_loss(t.values, t.old_values, t.returns, cfg.value_clip)
        val_term = cfg.value_coef * aggregate(vl, w)
    total = policy + kl_term + ent_term + val_term
    if stats is not None:
        _record(stats, t, old, corr, clipped, kl, LossTerms(total, policy, kl_term, ent_term, val_term))
    return LossTerms(total, policy, kl_term, ent_term, val_term)


def _record(stats: Accumulator, t: TokenInputs, old, corr, clipped, kl, terms: LossTerms) -> None:
    m = t.mask
    if not bool(m.any()):
        return
    lr = log_ratio(t.logprobs.detach(), old)[m]
    w = torch.exp(corr.log_w[m])
    for name in ("total", "policy", "kl", "entropy_bonus", "value"):
        stats.add(f"loss/{name}", getattr(terms, name))
    stats.add("n/tokens", m.sum())
    # k3 estimate of KL(old ‖ π_θ): (ρ − 1) − log ρ, ≥ 0, second order in the log-ratio.
    stats.add("sum/approx_kl", (torch.expm1(lr) - lr).sum())
    stats.add("sum/clipped", clipped[m].sum())
    stats.add("sum/w", w.sum())
    stats.lo("min/w", w.min())
    stats.hi("max/w", w.max())
    stats.add("sum/tis_clipped", corr.tis_clipped[m].sum())
    stats.add("sum/is_masked", corr.is_masked[m].sum())
    stats.add("sum/opsm_dropped", corr.opsm_dropped[m].sum())
    if t.entropy is not None:
        stats.add("sum/entropy", t.entropy.detach()[m].sum())
    if kl is not None:
        stats.add("sum/ref_kl", kl.detach()[m].sum())
    if t.values is not None and t.returns is not None:
        stats.add("sum/value_err", (t.values.detach() - t.returns)[m].abs().sum())
