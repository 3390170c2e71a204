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

from dataclasses import dataclass

import torch


@dataclass
class SupportMask:
    """Which logits survive on the rows that recorded a sampling support."""

    rows: torch.Tensor
    """[k] target rows with a recorded support."""
    keep: torch.Tensor
    """[k, V] bool: True for the support's members. Only these k rows are masked, so memory
    grows with the number of truncated tokens, not the whole micro-batch."""

    @classmethod
    def build(cls, rows: torch.Tensor, pair_rows: torch.Tensor, pair_ids: torch.Tensor, vocab: int) -> "SupportMask":
        """``rows`` lists the masked target rows; (``pair_rows[j]``, ``pair_ids[j]``) are the
        support members, ``pair_rows`` indexing into the micro-batch's targets."""
        local = torch.empty(int(rows.max()) + 1, dtype=torch.long, device=rows.device)
        local[rows] = torch.arange(len(rows), device=rows.device)
        keep = torch.zeros(len(rows), vocab, dtype=torch.bool, device=rows.device)
        keep[local[pair_rows], pair_ids] = True
        return cls(rows, keep)


def sampling_logits(logits: torch.Tensor, temperature: torch.Tensor,
                    support: SupportMask | None = None) -> torch.Tensor:
    """logits [n, V] → float32 logits of the sampling distribution (tempered, support-masked)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    out = logits.float() / t.to(torch.float32).unsqueeze(-1)
    if support is not None:
        masked = out[support.rows].masked_fill(~support.keep, float("-inf"))
        out = out.index_put((support.rows,), masked)
    return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor,
                   support: SupportMask | None = None, with_entropy: bool = True,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) [n] under the sampling distribution, and its entropy [n] (or None).

    The entropy is detached unless ``entropy_grad`` (an entropy bonus needs its gradient).
    """
    z = sampling_logits(logits, temperature, support)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            # −Σ p log p with 0·log 0 = 0: masked entries are −∞ and must not make NaNs.
            safe = torch.where(torch.isfinite(logp_all), logp_all, torch.zeros_like(logp_all))
            entropy = -(safe.exp() * safe).sum(-1)
    return logp, entropy
