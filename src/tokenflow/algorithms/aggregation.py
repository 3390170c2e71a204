"""Loss aggregation: from per-token losses to one number, with the normaliser stated in units.

Every mode is a per-token weight, so a micro-batch's contribution is ``Σ_t weight_t · loss_t``
and the contributions of all micro-batches (and, later, all ranks) simply add up. The weights use
counts over the **whole optimizer step's batch** (:class:`GlobalCounts`), never over one
micro-batch, so gradient accumulation gives exactly the full-batch gradient.

Loss tokens are tokens with loss mask 1 that version rejection kept. Tokens dropped later by IS
masking or OPSM still count in the normaliser: those decisions are made during the forward pass,
after the normaliser must already be known.

| mode                  | weight of token t of sequence i | unit of the result            |
|-----------------------|----------------------------------|-------------------------------|
| token_mean            | 1 / N_tokens                     | per token (DAPO)              |
| seq_mean_token_mean   | 1 / (T_i · N_seqs)               | per sequence, of token means (GRPO) |
| seq_mean_token_sum    | 1 / N_seqs                       | per sequence, of token sums   |
| dr_grpo_constant      | 1 / (L_max · N_seqs)             | per sequence, sum over a fixed length L_max |

T_i is sequence i's number of loss tokens; N_tokens and N_seqs are summed over the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenflow.registry import AGGREGATIONS


@dataclass(frozen=True)
class GlobalCounts:
    """Normaliser inputs for one optimizer step, summed over every micro-batch (and rank)."""

    num_tokens: int
    """Loss tokens in the step."""
    num_sequences: int
    """Sequences with at least one loss token."""

    def __add__(self, other: "GlobalCounts") -> "GlobalCounts":
        return GlobalCounts(self.num_tokens + other.num_tokens, self.num_sequences + other.num_sequences)


def token_weights(mode: str, mask: torch.Tensor, seq_index: torch.Tensor, seq_tokens: torch.Tensor,
                  counts: GlobalCounts, max_completion_tokens: int | None = None) -> torch.Tensor:
    """Per-token aggregation weight (0 where ``mask`` is 0), from the mode registered as ``mode``
    (:data:`tokenflow.registry.AGGREGATIONS`; the built-in ones are below).

    ``mask`` [n] marks loss tokens, ``seq_index`` [n] gives each token's sequence (0..S-1 within
    this micro-batch) and ``seq_tokens`` [S] each sequence's loss-token count T_i.
    """
    return AGGREGATIONS.get(mode)(mask.to(torch.float32), seq_index, seq_tokens, counts, max_completion_tokens)


# Each mode: fn(mask as float [n], seq_index [n], seq_tokens [S], counts, max_completion_tokens).
def token_mean(m, seq_index, seq_tokens, counts: GlobalCounts, max_completion_tokens=None):
    return m / max(counts.num_tokens, 1)


def seq_mean_token_mean(m, seq_index, seq_tokens, counts: GlobalCounts, max_completion_tokens=None):
    per_tok = seq_tokens.to(torch.float32).clamp(min=1)[seq_index]
    return m / (per_tok * max(counts.num_sequences, 1))


def seq_mean_token_sum(m, seq_index, seq_tokens, counts: GlobalCounts, max_completion_tokens=None):
    return m / max(counts.num_sequences, 1)


def dr_grpo_constant(m, seq_index, seq_tokens, counts: GlobalCounts, max_completion_tokens=None):
    if max_completion_tokens is None:
        raise ValueError('aggregation "dr_grpo_constant" needs max_completion_tokens')
    return m / (float(max_completion_tokens) * max(counts.num_sequences, 1))


def aggregate(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_t weight_t · value_t; masked tokens are zeroed first so a NaN or inf there cannot leak."""
    return torch.where(weights != 0, values, torch.zeros_like(values)).mul(weights).sum()


def segment_sum(x: torch.Tensor, seq_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Per-sequence sums of a packed per-token tensor (differentiable)."""
    return torch.zeros(num_seqs, dtype=x.dtype, device=x.device).index_add(0, seq_index, x)


def segment_mean(x: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Per-sequence mean of ``x`` over masked tokens (0 for a sequence with none)."""
    keep = mask.bool()
    total = segment_sum(torch.where(keep, x, torch.zeros_like(x)), seq_index, num_seqs)
    count = segment_sum(keep.to(x.dtype), seq_index, num_seqs)
    return total / count.clamp(min=1)
