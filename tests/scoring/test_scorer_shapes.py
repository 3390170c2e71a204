"""The three scorer shapes, through real worker processes, landing in the advantages exactly as
docs/algorithms.md ("Scorer shapes in the advantages") says:

* per group: the group scorer's values are the outcome rewards r_i (GRPO: (r_i − mean)/(std+ε));
* per token: r_t = Σ coef·s_t on loss tokens, the outcome added at the last loss token, then
  REINFORCE++ returns G_t = Σ_{l≥t} γ^{l−t} r_l whitened over the batch, or GAE's
  δ_t = r_t + γV_{t+1} − V_t.

Expected numbers are computed here by plain loops from those formulas, not by the library.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tests.scoring.scoring_testlib import wait_scored
from tokenflow.algorithms.advantages import compute_advantages
from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.rollout import Rollout
from tokenflow.scoring.pool import ScorerPool
from tokenflow.scoring.stage import ScoringStage
from tokenflow.scoring.token_scorer_specs import TokenScorerSpec

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def scorers(tmp_path):
    f = tmp_path / "shape_scorers.py"
    f.write_text(textwrap.dedent("""
        import time
        from tokenflow.scoring import group_scorer, token_scorer

        def exact(prompt, completion, example):
            return float(completion == example["want"])

        @group_scorer
        def by_rank(prompt, completions, example):
            # rank of each completion's length within the group, 0 .. n-1, as a judge might
            order = sorted(range(len(completions)), key=lambda i: (len(completions[i]), i))
            ranks = [0] * len(completions)
            for rank, i in enumerate(order):
                ranks[i] = rank
            if "boom" in completions:
                raise RuntimeError("judge failed")
            return [{"reward": float(r), "rank": float(r)} for r in ranks]

        @group_scorer
        def too_few(prompt, completions, example):
            return [1.0]

        @token_scorer
        def digit_values(prompt, completions, example, completion_ids):
            if "hang" in completions:
                time.sleep(60)
            return [[0.1 * (t % 4) for t in ids] for ids in completion_ids]
    """))
    return f


def rollout(text: str, ids: list[int], i: int, mask=None) -> Rollout:
    n = len(ids)
    return Rollout(prompt_ids=[1, 5], completion_ids=ids, logprobs=np.full(n, -0.5), versions=[0] * n,
                   text=text, sample_index=i, group_id=0, loss_mask=mask)


def test_group_scorer_values_are_the_outcome_rewards(scorers):
    pool = ScorerPool(f"{scorers}:by_rank", workers=1, timeout_s=5.0)
    try:
        texts = ["aaa", "a", "aaaa", "aa"]
        group = [rollout(t, [3] * len(t), i) for i, t in enumerate(texts)]
        pool.submit(group, "p", {}, group_id=0)
        (scored, _), = wait_scored(pool)
        pool.submit([rollout(t, [3], i) for i, t in enumerate(["x", "boom"])], "p", {}, group_id=1)
        (failed, _), = wait_scored(pool)
    finally:
        pool.close()
    r = np.array([2.0, 0.0, 3.0, 1.0])
    assert [x.reward for x in scored] == r.tolist()
    assert [x.rewards["rank"] for x in scored] == r.tolist()
    cfg = AlgorithmConfig(advantage="grpo")
    adv = compute_advantages(scored, cfg).advantages
    want = (r - r.mean()) / (r.std(ddof=1) + cfg.eps)
    for a, w, x in zip(adv, want, scored):
        np.testing.assert_allclose(a, np.full(x.num_tokens, w), rtol=1e-6)
    # A judge that raises fails every sample of its group, with the reason.
    assert all(x.failed and "RuntimeError: judge failed" in x.info["score_error"] for x in failed)


def test_group_scorer_returning_the_wrong_count_fails_the_group(scorers):
    pool = ScorerPool(f"{scorers}:too_few", workers=1, timeout_s=5.0)
    try:
        pool.submit([rollout(t, [3], i) for i, t in enumerate(["x", "y"])], "p", {}, group_id=0)
        (scored, _), = wait_scored(pool)
    finally:
        pool.close()
    assert all(x.failed and "one reward per sample (2), got 1 values" in x.info["score_error"] for x in scored)


def reinforce_pp_by_hand(token_r: list[np.ndarray], outcome: list[float], masks: list[np.ndarray],
                         gamma: float, eps: float) -> list[np.ndarray]:
    returns = []
    for r, o, m in zip(token_r, outcome, masks):
        idx = [t for t in range(len(m)) if m[t]]
        g = np.zeros(len(m))
        for k, t in enumerate(idx):
            total = 0.0
            for j, l in enumerate(idx[k:]):
                total += gamma ** j * (r[l] + (o if l == idx[-1] else 0.0))
            g[t] = total
        returns.append(g)
    flat = np.concatenate([g[m > 0] for g, m in zip(returns, masks)])
    mean, std = flat.mean(), flat.std()
    return [(g - mean) / (std + eps) * (m > 0) for g, m in zip(returns, masks)]


def gae_by_hand(token_r, outcome, masks, values, gamma, lam) -> list[np.ndarray]:
    out = []
    for r, o, m, v in zip(token_r, outcome, masks, values):
        idx = [t for t in range(len(m)) if m[t]]
        rr = [r[t] + (o if t == idx[-1] else 0.0) for t in idx]
        vv = [v[t] for t in idx]
        a = np.zeros(len(m))
        for k, t in enumerate(idx):
            total = 0.0
            for j in range(k, len(idx)):
                nxt = vv[j + 1] if j + 1 < len(idx) else 0.0
                total += (gamma * lam) ** (j - k) * (rr[j] + gamma * nxt - vv[j])
            a[t] = total
        out.append(a)
    return out


@pytest.mark.slow
def test_token_scorer_rewards_enter_the_returns_as_r_t(scorers):
    coef = 0.5
    spec = TokenScorerSpec("token", "token", coef, {"spec": f"{scorers}:digit_values"})
    stage = ScoringStage(ScorerPool(f"{scorers}:exact", workers=1, timeout_s=5.0), [spec], timeout_s=5.0)
    try:
        ids = [[4, 5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]]
        masks = [None, None, np.array([1, 0, 1, 1])]  # an environment token in the last one
        group = [rollout(t, i, k, m) for k, (t, i, m) in enumerate(zip(["yes", "no", "yes"], ids, masks))]
        stage.submit(group, "p", {"want": "yes"}, group_id=0)
        evalg = [rollout("yes", [4, 5], 0)]
        stage.submit(evalg, "p", {"want": "yes"}, group_id=-1, kind="eval")
        done = wait_scored(stage)
        while len(done) < 2:
            done += wait_scored(stage)
        hung = [rollout(t, [4], k) for k, t in enumerate(["yes", "hang"])]
        stage.submit(hung, "p", {"want": "yes"}, group_id=1)
        timed_out = wait_scored(stage, timeout_s=60)
    finally:
        stage.close()
    scored = next(g for g, meta in done if meta["group_id"] == 0)
    assert next(g for g, meta in done if meta["group_id"] == -1)[0].token_rewards is None  # eval: outcome only
    s = [np.array([coef * 0.1 * (t % 4) for t in i]) for i in ids]
    s[2][1] = 0.0  # no reward on an environment token
    for x, want in zip(scored, s):
        np.testing.assert_allclose(x.token_rewards, want, rtol=1e-6)
    outcome = [1.0, 0.0, 1.0]
    m = [x.loss_mask for x in scored]
    for gamma in (1.0, 0.9, 0.0):
        cfg = AlgorithmConfig(advantage="reinforce_pp", gamma=gamma)
        got = compute_advantages(scored, cfg).advantages
        for a, w in zip(got, reinforce_pp_by_hand(s, outcome, m, gamma, cfg.eps)):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)
    values = [np.linspace(0.1, 0.5, len(i)) for i in ids]
    cfg = AlgorithmConfig(advantage="gae", gamma=0.9, lam=0.8)
    got = compute_advantages(scored, cfg, values=values).advantages
    for a, w in zip(got, gae_by_hand(s, outcome, m, values, 0.9, 0.8)):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="per-token rewards"):
        compute_advantages(scored, AlgorithmConfig(advantage="grpo"))
    # A token scorer past its time fails its group's samples with the reason.
    (hung_done, _), = timed_out
    assert all(x.failed and "token scorer: exceeded" in x.info["score_error"] for x in hung_done)
