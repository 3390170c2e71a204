"""Per-token KL estimators between the policy π (= π_θ) and a frozen reference π_ref.

Both are single-sample estimates of KL(π ‖ π_ref) from tokens sampled by the policy:

* k1 = log π − log π_ref (unbiased, can be negative, high variance; as a *loss* its gradient
  is ∇log π, whose expectation is 0, so it only regularises through off-policy drift);
* k3 = π_ref/π − log(π_ref/π) − 1 (unbiased, always ≥ 0; the usual GRPO choice).

The log-ratio is clamped to ±20 before exponentiating so a token the reference finds
near-impossible cannot overflow the loss.
"""

from __future__ import annotations

import torch

_MAX_LOG_RATIO = 20.0


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    log_r = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(log_r) - log_r - 1.0


KL_ESTIMATORS = {"k1": kl_k1, "k3": kl_k3}


def token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate of KL(π_θ ‖ π_ref) with the named estimator ("k1" or "k3")."""
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)
