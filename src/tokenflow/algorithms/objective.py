"""One micro-batch's loss: policy loss × corrections + KL + entropy bonus + value loss.

Pure tensor code with no model in sight, so every piece is testable on hand-made numbers. The
trainer calls :func:`micro_batch_loss` once per packed micro-batch and backpropagates the result;
the per-token aggregation weights already carry the normaliser of the optimizer step's
(mini-)batch, so the micro-batch losses sum to that step's loss.

The ratio each objective clips (``old`` below), and where the behaviour weight w sits:

* direct:    ρ = π_θ / μ,      token loss = policy_loss(ρ) · TIS factor min(1, C/w)
* decoupled: ρ = π_θ / π_prox, token loss = policy_loss(ρ) · ŵ,  ŵ = min(w, C), w = π_prox/μ

π_prox is the policy before the batch's first optimizer step, so ρ ≡ 1 at the first step and
the clip binds only from a batch's second optimizer step on (``trainer.mini_batches`` /
``trainer.epochs``); at one step per batch the decoupled loss is −ŵ·A·log π_θ in gradient.

Per policy loss (registry properties, :data:`tokenflow.registry.POLICY_LOSSES`):

* ``ppo``: the token ratio, clipped; the weight multiplies the loss outside the clip.
* ``gspo`` (``sequence_ratio``): the ratio is the sequence's geometric mean
  s_i = exp(mean_t log ρ_t), clipped; the weight outside the clip is the sequence's geometric
  mean too (w_i = exp(mean_t log w_t), TIS-capped), so decoupled GSPO's s_i·w_i is direct GSPO's
  sequence ratio against μ.
* ``cispo`` (``clips_weight``): CISPO clips the importance weight it trains with, so the
  corrected weight goes *inside* the clip: the loss is −sg(clip(ρ·ŵ))·A·log π_θ (decoupled:
  ρ·ŵ = (π_θ/π_prox)·min(π_prox/μ, C), i.e. π_θ/μ without TIS; direct: min(π_θ/μ, C)), and
  nothing multiplies it afterwards.

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
from tokenflow.algorithms.corrections import apply_corrections
from tokenflow.algorithms.kl import token_kl
from tokenflow.algorithms.losses import POLICY_LOSSES, log_ratio, value_loss
from tokenflow.algorithms.stats import Accumulator
from tokenflow.config.algorithm import AlgorithmConfig


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
    """log π_prox(a_t), detached: the policy before the batch's first optimizer step (decoupled
    objective, or no behaviour log-probs). With the decoupled objective and behaviour log-probs,
    None means ``logprobs`` detached: the caller forwarded with the weights π_prox names."""
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
        # The caller forwarded with π_prox's weights (the batch's first optimizer step).
        t = dataclasses.replace(t, prox=t.logprobs.detach())
    if cfg.behaviour_logprobs:
        old = t.prox if cfg.objective == "decoupled" else t.behaviour
    else:
        old = t.prox  # no engine log-probs: π_prox stands in for μ
    if old is None:
        raise ValueError(f"objective {cfg.objective!r} needs π_prox log-probs (a prox pass)")
    behaviour = t.behaviour if cfg.behaviour_logprobs else t.prox
    props = POLICY_LOSSES.props(cfg.policy_loss)
    corr = apply_corrections(cfg, logprobs=t.logprobs, behaviour=behaviour, prox=t.prox,
                             adv=t.advantages, mask=t.mask, seq_index=t.seq_index, num_seqs=t.num_seqs,
                             sequence_weight=bool(props["sequence_ratio"]))
    ratio_old, after = old, corr.weight
    if props["clips_weight"]:
        # The corrected weight goes into the clipped ratio: exp(log π_θ − (old − log ŵ)) = ρ·ŵ.
        ratio_old, after = old - torch.log(corr.weight), torch.ones_like(corr.weight)
    pg, clipped = POLICY_LOSSES.get(cfg.policy_loss)(
        t.logprobs, ratio_old, t.advantages, cfg.clip_low, cfg.clip_high,
        mask=t.mask, seq_index=t.seq_index, num_seqs=t.num_seqs)
    # One weight for every term: dropped tokens leave the KL, entropy and value terms too.
    w = t.weights * corr.keep
    policy = aggregate(pg * after, w)
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
    stats.hi("max/used_w", corr.used_w[m].max())
    stats.add("sum/tis_clipped", corr.tis_clipped[m].sum())
    stats.add("sum/is_masked", corr.is_masked[m].sum())
    stats.add("sum/opsm_dropped", corr.opsm_dropped[m].sum())
    if t.entropy is not None:
        stats.add("sum/entropy", t.entropy.detach()[m].sum())
    if kl is not None:
        stats.add("sum/ref_kl", kl.detach()[m].sum())
    if t.values is not None and t.returns is not None:
        stats.add("sum/value_err", (t.values.detach() - t.returns)[m].abs().sum())
