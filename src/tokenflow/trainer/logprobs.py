"""Per-token log-probs and entropies of sampled tokens, as the engine's sampler defines them.

The engine samples token a_t from softmax(logits / T) restricted to a kept support S_t. The
trainer reproduces exactly that distribution:

1. divide the logits by the rollout's temperature T (greedy decoding, T = 0, is taken as T = 1,
   as vLLM reports greedy log-probs) — forgetting this is a classic trainer/engine mismatch;
2. Keep Sampling Mask: where a token recorded its support, set logits outside S_t to −∞ so π_θ
   and μ share one action space; rows without a recorded support keep the whole vocabulary;
3. log-softmax in float32.

Entropy is that of the same (tempered, masked) distribution, in nats.
"""

from __future__ import annotations

import torch


def support_keep_mask(num_rows: int, vocab: int, rows: torch.Tensor, ids: torch.Tensor,
                      masked_rows: torch.Tensor, device=None) -> torch.Tensor:
    """Bool [num_rows, vocab]: True where a logit stays. ``masked_rows`` lists the rows that have a
    recorded support; the pairs (``rows[k]``, ``ids[k]``) are that support's members."""
    keep = torch.ones(num_rows, vocab, dtype=torch.bool, device=device)
    keep[masked_rows] = False
    keep[rows, ids] = True
    return keep


def sampling_logits(logits: torch.Tensor, temperature: torch.Tensor,
                    keep: torch.Tensor | None = None) -> torch.Tensor:
    """logits [n, V] → float32 logits of the sampling distribution (tempered, support-masked)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    out = logits.float() / t.to(torch.float32).unsqueeze(-1)
    if keep is not None:
        out = out.masked_fill(~keep, float("-inf"))
    return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor,
                   keep: torch.Tensor | None = None, with_entropy: bool = True,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) [n] under the sampling distribution, and its entropy [n] (or None).

    The entropy is detached unless ``entropy_grad`` (an entropy bonus needs its gradient).
    """
    z = sampling_logits(logits, temperature, keep)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            # −Σ p log p with 0·log 0 = 0: masked entries are −∞ and must not make NaNs.
            finite = torch.isfinite(logp_all)
            safe = torch.where(finite, logp_all, torch.zeros_like(logp_all))
            entropy = -(safe.exp() * safe).sum(-1)
            entropy = torch.where(finite.any(-1), entropy, torch.zeros_like(entropy))
    return logp, entropy
