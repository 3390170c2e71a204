"""Per-token log-probs and entropies of sampled tokens, as the engine's sampler defines them.

The engine samples token a_t from softmax(logits / T) restricted to a kept support S_t. The
trainer reproduces exactly that distribution:

1. divide the logits by the rollout's temperature T (greedy decoding, T = 0, is taken as T = 1,
   as vLLM reports greedy log-probs) — forgetting this is a classic trainer/engine mismatch;
2. Keep Sampling Mask: where a token recorded its support, set logits outside S_t to −∞ so π_θ
   and μ share one action space; rows without a recorded support keep the whole vocabulary;
3. log-softmax in float32.

Entropy is that of the same (tempered, masked) distribution, in nats.

``chunked_token_logprobs`` gives the same numbers from the final hidden states, applying the
output head to ``chunk`` target rows at a time and recomputing each chunk's logits in the
backward pass: a micro-batch never holds more than ``chunk × vocab`` logits (and their
log-softmax), where a 150k vocabulary times 8k tokens would otherwise take gigabytes.
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

    def slice(self, start: int, stop: int) -> "SupportMask | None":
        """The part for target rows [start, stop), re-indexed from 0 (None if none is masked)."""
        sel = (self.rows >= start) & (self.rows < stop)
        if not bool(sel.any()):
            return None
        return SupportMask(self.rows[sel] - start, self.keep[sel])

    @classmethod
    def build(cls, rows: torch.Tensor, pair_rows: torch.Tensor, pair_ids: torch.Tensor, vocab: int) -> "SupportMask":
        """``rows`` lists the masked target rows; (``pair_rows[j]``, ``pair_ids[j]``) are the
        support members, ``pair_rows`` indexing into the micro-batch's targets."""
        local = torch.empty(int(rows.max()) + 1, dtype=torch.long, device=rows.device)
        local[rows] = torch.arange(len(rows), device=rows.device)
        keep = torch.zeros(len(rows), vocab, dtype=torch.bool, device=rows.device)
        keep[local[pair_rows], pair_ids] = True
        return cls(rows, keep)

    @classmethod
    def for_batch(cls, mb, vocab: int) -> "SupportMask | None":
        """The mask of a :class:`~tokenflow.trainer.batch.MicroBatch` (None when no target
        recorded a support)."""
        if mb.support_rows is None:
            return None
        return cls.build(mb.support_rows, *mb.support_pairs, vocab)


def sampling_logits(logits: torch.Tensor, temperature: torch.Tensor,
                    support: SupportMask | None = None) -> torch.Tensor:
    """logits [n, V] → float32 logits of the sampling distribution (tempered, support-masked)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32).unsqueeze(-1)
    # Half-precision logits divided by float32 temperatures come out float32 (type promotion):
    # one pass over [n, V] where .float() and then / made two, with the same values.
    out = logits / t if logits.dtype in (torch.bfloat16, torch.float16) else logits.float() / t
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
    if with_entropy and entropy_grad and torch.is_grad_enabled():
        # −Σ p log p with 0·log 0 = 0: masked entries are −∞ and must make neither NaNs nor NaN
        # gradients (0 · −∞ in the product's backward).
        safe = torch.where(torch.isfinite(logp_all), logp_all, torch.zeros_like(logp_all))
        entropy = -(safe.exp() * safe).sum(-1)
    elif with_entropy:
        with torch.no_grad():
            # No gradient: an entry at −∞ gives 0 · −∞ = NaN, which nansum counts as the 0 it is;
            # three passes over [n, V] where the guard above makes several more.
            entropy = -(logp_all.exp() * logp_all).nansum(-1)
    return logp, entropy


def chunked_token_logprobs(hidden: torch.Tensor, project, targets: torch.Tensor, temperature: torch.Tensor,
                           support: SupportMask | None = None, *, chunk: int, with_entropy: bool = True,
                           entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs(project(hidden), ...)`` computed ``chunk`` rows at a time.

    ``project`` maps hidden states [m, H] to logits [m, V] (the output head). With a gradient
    to propagate each chunk runs under a non-reentrant activation checkpoint, so only its
    hidden rows are kept for the backward pass, which recomputes its logits. One chunk (the
    micro-batch fits) is exactly ``token_logprobs``."""
    from torch.utils.checkpoint import checkpoint

    n = hidden.shape[0]
    if n <= chunk:
        return token_logprobs(project(hidden), targets, temperature, support, with_entropy, entropy_grad)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    logps, entropies = [], []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        part = support.slice(start, stop) if support is not None else None

        def piece(h, start=start, stop=stop, part=part):
            return token_logprobs(project(h), targets[start:stop], temperature[start:stop], part,
                                  with_entropy, entropy_grad)

        lp, ent = checkpoint(piece, hidden[start:stop], use_reentrant=False) if recompute else piece(hidden[start:stop])
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)
