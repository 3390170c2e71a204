"""Advantage estimators over ragged sequences, one small registered function each.

Inputs are per sequence: one outcome reward, a group id (the samples of one prompt), a loss mask
(1 on model-generated tokens) and, for GAE, one value per token. Outputs are per-token
advantages, zero wherever the loss mask is 0.

Conventions shared by every estimator:

* Groups may be ragged (failed samples dropped). A group of one has no baseline, so GRPO,
  Dr. GRPO and RLOO give it advantage 0.
* GRPO's std is the sample std (ddof=1), as TRL, verl and OpenRLHF use.
* Time runs over the model-generated tokens only: environment/tool tokens (mask 0) are part of
  the transition between two actions, not steps of their own. The outcome reward sits on the last
  model-generated token, and the value "after the last token" is 0.
* Batch normalisation (REINFORCE++, ``whiten_advantages``) is token-weighted: mean and population
  std over every loss token of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.registry import ADVANTAGES, token_level_estimators
from tokenflow.rollout import Rollout


@dataclass
class AdvantageInputs:
    """One step's sequences. Lists are parallel; per-token arrays have one entry per completion
    token."""

    rewards: np.ndarray
    """[N] outcome reward per sequence."""
    group_ids: np.ndarray
    """[N] sequences with equal ids are samples of one prompt."""
    masks: list[np.ndarray]
    """Per sequence, 1 where the token is model-generated and counts in the loss."""
    values: list[np.ndarray] | None = None
    """Per sequence, V(s_t) at each completion token (GAE only)."""
    token_rewards: list[np.ndarray] | None = None
    """Optional per-token rewards added to the outcome reward (e.g. a KL penalty), on loss tokens."""


@dataclass
class AdvantageResult:
    advantages: list[np.ndarray]
    """Per sequence, per-token advantage (float32), 0 where the mask is 0."""
    returns: list[np.ndarray] | None = None
    """Per sequence, value targets A_t + V_t (GAE only)."""


Estimator = Callable[[AdvantageInputs, AlgorithmConfig], AdvantageResult]
# The estimators below are registered by name in tokenflow.registry (with what each needs);
# plugins add theirs with @ADVANTAGES.register("name", needs_values=..., token_rewards=...).


def _broadcast(per_seq: np.ndarray, masks: list[np.ndarray]) -> list[np.ndarray]:
    """Give every loss token of sequence i the scalar per_seq[i]."""
    return [(float(a) * (m > 0)).astype(np.float32) for a, m in zip(per_seq, masks)]


def _groups(group_ids: np.ndarray) -> list[np.ndarray]:
    """Indices of each group's members, in order of first appearance."""
    _, first, inverse = np.unique(group_ids, return_index=True, return_inverse=True)
    order = np.argsort(first)
    return [np.flatnonzero(inverse == g) for g in order]


def _group_centred(rewards: np.ndarray, group_ids: np.ndarray, scale_std: bool, eps: float) -> np.ndarray:
    out = np.zeros(len(rewards), dtype=np.float64)
    for idx in _groups(group_ids):
        if len(idx) < 2:
            continue  # no baseline for a lone sample: its advantage stays 0
        r = rewards[idx].astype(np.float64)
        a = r - r.mean()
        if scale_std:
            a = a / (r.std(ddof=1) + eps)
        out[idx] = a
    return out


def grpo(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """A_i = (r_i − mean_g r) / (std_g r + eps), std only when cfg.scale_std."""
    a = _group_centred(inp.rewards, inp.group_ids, cfg.scale_std, cfg.eps)
    return AdvantageResult(_broadcast(a, inp.masks))


def dr_grpo(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """A_i = r_i − mean_g r (Dr. GRPO: no std division)."""
    a = _group_centred(inp.rewards, inp.group_ids, False, cfg.eps)
    return AdvantageResult(_broadcast(a, inp.masks))


def rloo(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """A_i = r_i − mean_{j≠i} r_j over the group; 0 for a group of one."""
    a = np.zeros(len(inp.rewards), dtype=np.float64)
    for idx in _groups(inp.group_ids):
        n = len(idx)
        if n < 2:
            continue
        r = inp.rewards[idx].astype(np.float64)
        a[idx] = r - (r.sum() - r) / (n - 1)
    return AdvantageResult(_broadcast(a, inp.masks))


def _token_rewards(inp: AdvantageInputs, i: int, outcome: float) -> np.ndarray:
    """Reward per loss token of sequence i (compressed to loss tokens): outcome on the last."""
    m = inp.masks[i] > 0
    r = np.zeros(int(m.sum()), dtype=np.float64)
    if inp.token_rewards is not None:
        r += inp.token_rewards[i][m]
    if len(r):
        r[-1] += outcome
    return r


def _discounted_returns(r: np.ndarray, gamma: float) -> np.ndarray:
    g, out = 0.0, np.empty_like(r)
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * g
        out[t] = g
    return out


def _expand(compressed: list[np.ndarray], masks: list[np.ndarray]) -> list[np.ndarray]:
    """Scatter per-loss-token values back to full completion length (0 on masked tokens)."""
    out = []
    for c, m in zip(compressed, masks):
        full = np.zeros(len(m), dtype=np.float32)
        full[m > 0] = c
        out.append(full)
    return out


def whiten(per_token: list[np.ndarray], masks: list[np.ndarray], eps: float) -> list[np.ndarray]:
    """(x − mean) / (std + eps) over every loss token of the batch (population std)."""
    flat = np.concatenate([x[m > 0] for x, m in zip(per_token, masks)] or [np.zeros(0)])
    if flat.size == 0:
        return per_token
    mean, std = flat.astype(np.float64).mean(), flat.astype(np.float64).std()
    return [((x - mean) / (std + eps) * (m > 0)).astype(np.float32) for x, m in zip(per_token, masks)]


def _group_mean(r: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    out = np.zeros_like(r)
    for idx in _groups(group_ids):
        out[idx] = r[idx].mean()
    return out


def _reinforce_pp(inp: AdvantageInputs, cfg: AlgorithmConfig, baseline: bool) -> AdvantageResult:
    outcome = inp.rewards.astype(np.float64)
    if baseline:
        outcome = outcome - _group_mean(outcome, inp.group_ids)
    returns = [_discounted_returns(_token_rewards(inp, i, outcome[i]), cfg.gamma)
               for i in range(len(outcome))]
    return AdvantageResult(whiten(_expand(returns, inp.masks), inp.masks, cfg.eps))


def reinforce_pp(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """Per-token discounted return (outcome on the last loss token), whitened over the batch."""
    return _reinforce_pp(inp, cfg, baseline=False)


def reinforce_pp_baseline(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """REINFORCE++ with the group mean reward subtracted before the returns and whitening."""
    return _reinforce_pp(inp, cfg, baseline=True)


def gae_sequence(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """GAE over one sequence's loss tokens: δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}."""
    adv, last, n = np.empty(len(rewards), dtype=np.float64), 0.0, len(rewards)
    for t in range(n - 1, -1, -1):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


def gae(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """Token-level GAE(γ, λ); returns R_t = A_t + V_t are the value head's targets."""
    if inp.values is None:
        raise ValueError('advantage = "gae" needs per-token values (a value head)')
    advs, rets = [], []
    for i, m in enumerate(inp.masks):
        v = inp.values[i][m > 0].astype(np.float64)
        a = gae_sequence(_token_rewards(inp, i, float(inp.rewards[i])), v, cfg.gamma, cfg.lam)
        advs.append(a)
        rets.append(a + v)
    return AdvantageResult(_expand(advs, inp.masks), _expand(rets, inp.masks))


def estimate(inp: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageResult:
    """Run the configured estimator, then optional whitening."""
    result = ADVANTAGES.get(cfg.advantage)(inp, cfg)
    if cfg.whiten_advantages and not ADVANTAGES.props(cfg.advantage)["normalised"]:
        result.advantages = whiten(result.advantages, inp.masks, cfg.eps)
    return result


def _with_scored_token_rewards(rollouts: list[Rollout], live: list[int], token_rewards, cfg: AlgorithmConfig):
    """``token_rewards`` plus each live rollout's scorer-given ``Rollout.token_rewards``."""
    scored = [i for i in live if rollouts[i].token_rewards is not None]
    if not scored:
        return token_rewards
    if not ADVANTAGES.props(cfg.advantage)["token_rewards"]:
        raise ValueError(f'rollouts carry per-token rewards (a token scorer), but algorithm.advantage = '
                         f'"{cfg.advantage}" uses only the outcome; use one of {", ".join(token_level_estimators())}')
    out = [np.zeros(r.num_tokens, dtype=np.float64) if token_rewards is None
           else np.asarray(token_rewards[i], dtype=np.float64) for i, r in enumerate(rollouts)]
    for i in scored:
        out[i] = out[i] + rollouts[i].token_rewards.astype(np.float64)
    return out


def compute_advantages(rollouts: list[Rollout], cfg: AlgorithmConfig,
                       values: list[np.ndarray] | None = None,
                       token_rewards: list[np.ndarray] | None = None) -> AdvantageResult:
    """Advantages for a list of rollouts, aligned with it.

    Failed rollouts (``failed=True``) take no part: they get all-zero advantages and their group
    is ragged for the others. ``values`` (GAE) holds V(s_t) per completion token per rollout;
    ``token_rewards`` per-token rewards added to the outcome (the KL penalty of
    ``kl_in_reward``), per completion token per rollout; a rollout's own ``token_rewards`` (from
    token scorers) are added to them.
    """
    live = [i for i, r in enumerate(rollouts) if not r.failed]
    token_rewards = _with_scored_token_rewards(rollouts, live, token_rewards, cfg)
    for i in live:
        if rollouts[i].reward is None:
            raise ValueError(f"rollout {i} (request {rollouts[i].request_id!r}) has no reward and "
                             "is not marked failed; score it or set failed=True")
    inp = AdvantageInputs(
        rewards=np.array([rollouts[i].reward for i in live], dtype=np.float64),
        group_ids=np.array([rollouts[i].group_id for i in live], dtype=np.int64),
        masks=[rollouts[i].loss_mask for i in live],
        values=None if values is None else [np.asarray(values[i]) for i in live],
        token_rewards=None if token_rewards is None else [np.asarray(token_rewards[i], dtype=np.float64) for i in live],
    )
    res = estimate(inp, cfg) if live else AdvantageResult([], [] if cfg.uses_values else None)
    zeros = [np.zeros(r.num_tokens, dtype=np.float32) for r in rollouts]
    adv, ret = list(zeros), (list(zeros) if res.returns is not None else None)
    for k, i in enumerate(live):
        adv[i] = res.advantages[k]
        if ret is not None:
            ret[i] = res.returns[k]
    return AdvantageResult(adv, ret)
