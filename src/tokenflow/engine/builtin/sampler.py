"""Sampling with per-token behaviour log-probs and sampling supports, reproducible per request.

Definitions (the trainer compares against these; see `tokenflow.rollout`):

* ``z = logits / T`` in float32 (``T = 1`` for greedy rows, T = 0).
* The kept support ``S`` is the top-k tokens of ``z`` (k = 0: all), then the smallest prefix of
  those, by decreasing probability under their renormalised softmax, whose mass reaches top_p.
  Greedy rows keep the whole vocabulary.
* ``logprob = log softmax(z)[a] - support_logmass`` with
  ``support_logmass = log Σ_{s∈S} softmax(z)[s]`` (0 when nothing was cut): the log-prob of the
  sampled token ``a`` under the distribution it was drawn from (softmax(z) restricted to S,
  renormalised). For greedy rows it is ``log_softmax(logits)[a]``.

On request (``SamplingParams.logprobs = N``) a row also returns its N most likely tokens with
their log-probs on the same scale: ``log softmax(z)[v] - support_logmass`` (``-inf`` outside S),
computed with the same operations as the sampled token's, so where the sampled token is among
them the two values are identical. Rows that ask nothing cost nothing extra.

Randomness is counter-based: row r draws one uniform ``u = hash(seed, sample_index, step)``
(integer mixing in torch, no generator state) and takes the token where the cumulative kept
probability (in token-id order) first exceeds u - inverse-CDF sampling. A request's tokens thus
depend only on its seed, its sample index and the step, never on the rest of the batch, and an
aborted request resumed later continues exactly as it would have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenflow.engine.builtin.sequence import Sequence

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding values in [0, 2**32).

    Products may wrap past 2**63; the low 32 bits kept by the mask are still exact."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def counter_uniform(seed: torch.Tensor, sample_index: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One float32 uniform in [0, 1) per row, a pure function of (seed, sample_index, step)."""
    h = _mix32((seed & _MASK32) ^ 0x9E3779B9)
    h = _mix32(h ^ ((seed >> 32) & _MASK32))
    h = _mix32(h ^ (sample_index & _MASK32))
    h = _mix32(h ^ (step & _MASK32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built from the sequences of one step."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    sample_index: torch.Tensor
    step: torch.Tensor
    any_greedy: bool
    all_greedy: bool
    unit_temperature: bool
    """Every row samples at temperature 1 or is greedy: ``z`` is the logits themselves."""
    truncated_rows: list[int]
    top_n: list[int]
    """Per row, how many most likely tokens to return (``SamplingParams.logprobs``; 0 = none)."""

    @classmethod
    def from_seqs(cls, seqs: list[Sequence], device: torch.device) -> SamplingBatch:
        params = [s.params for s in seqs]
        temps = [p.temperature for p in params]
        greedy = [t == 0 for t in temps]

        def t(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=t(temps, torch.float32),
            # A top_k past the vocabulary keeps everything; clamped so that any int fits.
            top_k=t([min(p.top_k, _MASK32) for p in params], torch.int64),
            top_p=t([p.top_p for p in params], torch.float32),
            seed=t([s.seed for s in seqs], torch.int64),
            sample_index=t([s.sample_index for s in seqs], torch.int64),
            step=t([s.num_completion_tokens for s in seqs], torch.int64),
            any_greedy=any(greedy),
            all_greedy=all(greedy),
            unit_temperature=all(temp in (0, 1) for temp in temps),
            truncated_rows=[i for i, p in enumerate(params) if p.truncates],
            top_n=[p.logprobs for p in params],
        )


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[float]
    logmass: list[float]
    support: list[np.ndarray | None] | None
    """Per row the sorted kept token ids, or None where nothing was cut (None: no row cut)."""
    top: list[tuple[np.ndarray, np.ndarray] | None] | None = None
    """Per row (token ids, log-probs) of its ``top_n`` most likely tokens, most likely first;
    None for rows that asked for none (None: no row asked)."""


def _keep_mask(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean [R, V] mask of the tokens kept by top-k then top-p (see the module docstring)."""
    sorted_p, order = probs.sort(dim=1, descending=True)
    ranks = torch.arange(probs.shape[1], device=probs.device)
    keep = (top_k[:, None] <= 0) | (ranks[None, :] < top_k[:, None])
    kept_p = sorted_p * keep
    kept_p = kept_p / kept_p.sum(1, keepdim=True)
    mass_before = kept_p.cumsum(1) - kept_p
    keep &= mass_before < top_p[:, None]
    return torch.zeros_like(keep).scatter_(1, order, keep)


class Sampler:
    """Turns a step's logits into tokens, behaviour log-probs, kept-mass and supports."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        rows, vocab = logits.shape
        # Logits may come in the model's dtype (as a decode step's do): one pass makes z in
        # float32 either way. Dividing by 1 is exact, so rows at T = 1 (or greedy) skip it: z is
        # then bitwise what the division would give, without a pass over [rows, vocab].
        if batch.unit_temperature:
            z = logits.float()
        else:
            temp = batch.temperature
            if batch.any_greedy:
                temp = torch.where(temp == 0, torch.ones_like(temp), temp)
            z = logits / temp[:, None]  # promotes to float32 (exactly) before dividing
        zmax = z.amax(dim=1, keepdim=True)
        e = torch.sub(z, zmax).exp_()  # unnormalised softmax(z), in the one new [rows, vocab] block
        total = e.sum(dim=1)
        kept = total
        support = None
        keep = None
        if batch.truncated_rows:
            idx = torch.tensor(batch.truncated_rows, device=logits.device)
            e_cut = e[idx]
            keep = _keep_mask(e_cut / total[idx, None], batch.top_k[idx], batch.top_p[idx])
            e_cut = e_cut * keep
            e = e.index_copy(0, idx, e_cut)
            kept = total.index_copy(0, idx, e_cut.sum(dim=1))
            support = self._supports(keep, batch.truncated_rows, rows, vocab)
        if batch.all_greedy:
            tokens = z.argmax(dim=1)
        else:
            cdf = e.cumsum(dim=1)
            u = counter_uniform(batch.seed, batch.sample_index, batch.step)
            last = cdf[:, -1]
            # u < 1, but u * last may round up to last; stay strictly below it so the token found
            # always has a positive probability.
            target = torch.minimum(u * last, torch.nextafter(last, torch.zeros_like(last)))
            target = target.unsqueeze(1)
            tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=vocab - 1)
            if batch.any_greedy:
                tokens = torch.where(batch.temperature == 0, z.argmax(dim=1), tokens)
        log_total = total.log()
        full = z.gather(1, tokens[:, None]).squeeze(1) - zmax.squeeze(1) - log_total
        logmass = kept.log() - log_total
        if support is None:
            logmass = torch.zeros_like(logmass)  # exactly 0, not log(total) - log(total) noise
        top = None
        if any(batch.top_n):
            top = self._top(z, zmax, log_total, logmass, keep, batch)
        return SamplerOutput(
            tokens=tokens.tolist(),
            logprobs=(full - logmass).tolist(),
            logmass=logmass.tolist(),
            support=support,
            top=top,
        )

    @staticmethod
    def _top(z, zmax, log_total, logmass, keep, batch: SamplingBatch) -> list:
        """The most likely tokens of the rows that ask for them (see the module docstring)."""
        rows = [i for i, n in enumerate(batch.top_n) if n > 0]
        idx = torch.tensor(rows, device=z.device)
        # The sampled token's log-prob is (z[a] - zmax - log_total) - logmass: the same steps here.
        scores = (z[idx] - zmax[idx]) - log_total[idx, None]
        scores = scores - logmass[idx, None]
        if keep is not None:
            cut = torch.zeros_like(z, dtype=torch.bool)
            cut[torch.tensor(batch.truncated_rows, device=z.device)] = ~keep
            scores = scores.masked_fill(cut[idx], float("-inf"))
        k = min(max(batch.top_n), z.shape[1])
        values, ids = scores.topk(k, dim=1)
        values, ids = values.cpu().numpy(), ids.cpu().numpy().astype(np.int32)
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(batch.top_n)
        for j, r in enumerate(rows):
            n = min(batch.top_n[r], k)
            out[r] = (ids[j, :n].copy(), values[j, :n].copy())
        return out

    @staticmethod
    def _supports(keep: torch.Tensor, row_ids: list[int], rows: int, vocab: int) -> list | None:
        counts = keep.sum(dim=1).tolist()
        ids = keep.nonzero()[:, 1].cpu().numpy().astype(np.int32)  # row-major: sorted per row
        parts = np.split(ids, np.cumsum(counts)[:-1])
        out: list[np.ndarray | None] = [None] * rows
        for r, part, c in zip(row_ids, parts, counts):
            out[r] = part if c < vocab else None  # keeping everything is no truncation
        return out if any(s is not None for s in out) else None
