"""The metrics one optimizer step reports, under stable namespaced keys.

``loss/*``     the step's loss terms (total = policy + kl + entropy_bonus + value), aggregated
               with the configured normaliser over the whole step's batch;
``policy/*``   approx-KL (k3 of the clipped ratio, i.e. against μ for the direct objective and
               π_prox for the decoupled one), clip fraction, entropy (nats), KL to the reference;
``optim/*``    pre-clip gradient norm, learning rate used by this step;
``offpolicy/*`` behaviour weight w = π/μ (mean/min/max), fractions of loss tokens clipped by
               TIS, masked by IS masking, dropped by OPSM, rejected for age (of all
               model-generated tokens), token age in optimizer steps, and the on-policy
               engine-vs-trainer mismatch over tokens whose version equals the trainer's;
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


def step_metrics(acc: Accumulator, *, grad_norm: float, lr: float, skipped: bool) -> dict[str, float]:
    r = acc.ratio
    m = {
        "loss/total": acc.get("loss/total"),
        "loss/policy": acc.get("loss/policy"),
        "loss/kl": acc.get("loss/kl"),
        "loss/entropy_bonus": acc.get("loss/entropy_bonus"),
        "loss/value": acc.get("loss/value"),
        "policy/approx_kl": r("sum/approx_kl", "n/tokens"),
        "policy/clip_frac": r("sum/clipped", "n/tokens"),
        "policy/entropy": r("sum/entropy", "n/tokens"),
        "optim/grad_norm": grad_norm,
        "optim/lr": lr,
        "optim/skipped": float(skipped),
        "offpolicy/is_ratio_mean": r("sum/w", "n/tokens", 1.0),
        "offpolicy/is_ratio_min": acc.min("min/w", 1.0),
        "offpolicy/is_ratio_max": acc.max("max/w", 1.0),
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
