"""The metrics one rollout batch (one ``train_step``, one policy version) reports, under stable
namespaced keys. A batch is ``optim/steps`` = mini_batches × epochs optimizer steps (1 by
default); a token mean is over every (loss token, optimizer step) pair of the batch.

``loss/*``     the loss terms (total = policy + kl + entropy_bonus + value), each step's
               aggregated with the configured normaliser over its (mini-)batch, averaged over
               the batch's steps;
``policy/*``   approx-KL (k3 of the clipped ratio, i.e. against μ for the direct objective and
               π_prox for the decoupled one), clip fraction (tokens where the clip was active:
               PPO/GSPO's clipped branch taken, CISPO's weight outside its range), entropy
               (nats), KL to the reference. Decoupled with one step per batch: ρ ≡ 1, so
               approx_kl and clip_frac are 0 (CISPO's clip_frac then counts behaviour weights
               outside its range);
``optim/*``    pre-clip gradient norm (mean and max over the steps), learning rate, steps
               skipped for a non-finite gradient, optimizer steps;
``offpolicy/*`` behaviour weight w = π/μ (mean/min/max; π = π_prox for decoupled, π_θ for
               direct), the largest weight the loss used (``is_weight_max``: min(w, tis_cap),
               per sequence for GSPO), fractions of loss tokens clipped by TIS, masked by IS masking, dropped
               by OPSM, rejected for age (of all model-generated tokens), token age in policy
               versions, and the on-policy engine-vs-trainer mismatch over tokens whose version
               equals the trainer's, scored with the batch's starting weights (each token once);
``routing/disagreement`` (mixture-of-experts rollouts with a routing record) the share of
               (token, sparse layer) pairs whose top-k expert set differs between the engine's
               record and the trainer's own router (before any Keep Routing replay);
``perf/*``, ``time/*`` sizes and wall time.

Means over tokens are over loss tokens; every value is finite (0, or 1 for ratios, when there is
nothing to average).
"""

from __future__ import annotations

import numpy as np

from tokenflow.algorithms.stats import Accumulator
from tokenflow.trainer.batch import TrainSequence


def age_stats(seqs: list[TrainSequence], trainer_version: int) -> dict[str, float]:
    ages = [trainer_version - s.versions[s.loss_mask] for s in seqs]
    flat = np.concatenate(ages) if ages else np.zeros(0)
    n_model = sum(int(s.loss_mask.sum()) for s in seqs)
    n_rejected = sum(int((s.loss_mask & ~s.keep).sum()) for s in seqs)
    return {
        "offpolicy/token_age_mean": float(flat.mean()) if flat.size else 0.0,
        "offpolicy/token_age_max": float(flat.max()) if flat.size else 0.0,
        "offpolicy/rejected_frac": n_rejected / n_model if n_model else 0.0,
    }


def step_metrics(acc: Accumulator, optim: dict[str, float]) -> dict[str, float]:
    """``acc``: every step's sums; ``optim``: :meth:`tokenflow.trainer.updates.StepLog.metrics`."""
    r = acc.ratio
    steps = max(optim["optim/steps"], 1.0)
    m = {
        **{f"loss/{k}": acc.get(f"loss/{k}") / steps for k in ("total", "policy", "kl", "entropy_bonus", "value")},
        "policy/approx_kl": r("sum/approx_kl", "n/tokens"),
        "policy/clip_frac": r("sum/clipped", "n/tokens"),
        "policy/entropy": r("sum/entropy", "n/tokens"),
        **optim,
        "offpolicy/is_ratio_mean": r("sum/w", "n/tokens", 1.0),
        "offpolicy/is_ratio_min": acc.min("min/w", 1.0),
        "offpolicy/is_ratio_max": acc.max("max/w", 1.0),
        "offpolicy/is_weight_max": acc.max("max/used_w", 1.0),
        "offpolicy/tis_clipped_frac": r("sum/tis_clipped", "n/tokens"),
        "offpolicy/is_masked_frac": r("sum/is_masked", "n/tokens"),
        "offpolicy/opsm_dropped_frac": r("sum/opsm_dropped", "n/tokens"),
        "offpolicy/mismatch_abs_logprob": r("sum/mismatch_abs", "n/onpolicy"),
        "offpolicy/mismatch_ratio": r("sum/mismatch_ratio", "n/onpolicy", 1.0),
        "offpolicy/mismatch_tokens": acc.get("n/onpolicy"),
    }
    if "sum/ref_kl" in acc:
        m["policy/ref_kl"] = r("sum/ref_kl", "n/tokens")
    if "n/route_compared" in acc:
        m["routing/disagreement"] = r("sum/route_differ", "n/route_compared")
    for other in ("unreplayed", "replayed"):  # trainer.routing_probe
        if f"sum/mismatch_abs_{other}" in acc:
            m[f"offpolicy/mismatch_abs_logprob_{other}"] = r(f"sum/mismatch_abs_{other}", "n/onpolicy")
    if "sum/value_err" in acc:
        m["value/abs_error"] = r("sum/value_err", "n/tokens")
    return m
