"""GSPO and CISPO under both objectives, against paper-form references written here.

Each reference is independent code: GSPO as the paper writes it (one ratio and one loss per
sequence, averaged over sequences), CISPO as MiniMax-M1 writes it (a detached, clipped
importance weight times A times log π_θ, summed over tokens and divided by their number). The
batches are random and off-policy, with π_θ ≠ π_prox (a batch's later optimizer step), so the
clips bind; each test asserts that they do and that the gradient is not PPO's.

Which weight each one clips (docs/algorithms.md, "Policy losses"):

* GSPO, decoupled: s_i = exp(mean_t log π_θ/π_prox) is clipped; the behaviour weight stays
  outside the clip and is per sequence, w_i = exp(mean_t log π_prox/μ), capped by TIS.
* GSPO, direct: s_i = exp(mean_t log π_θ/μ) is clipped; TIS multiplies by min(1, C/s_i).
* CISPO clips the importance weight it trains with, π_θ/μ: decoupled (π_θ/π_prox)·min(π_prox/μ, C),
  direct min(π_θ/μ, C).
"""

import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig, GlobalCounts, TokenInputs, micro_batch_loss, token_weights

LOW, HIGH = 0.1, 0.15


def random_batch(seed: int, seqs: int = 12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (seqs,), generator=g)
    seq_index = torch.repeat_interleave(torch.arange(seqs), lengths)
    n = int(lengths.sum())
    mask = torch.rand(n, generator=g) > 0.15
    for i in range(seqs):  # every sequence keeps a token
        mask[(seq_index == i).nonzero()[0]] = True
    # Per-sequence drift plus per-token noise: sequence ratios far enough from 1 to be clipped.
    prox = -torch.rand(n, generator=g) * 3 - 0.05
    logp = prox + (torch.randn(seqs, generator=g) * 0.25)[seq_index] + torch.randn(n, generator=g) * 0.2
    behaviour = prox + (torch.randn(seqs, generator=g) * 0.3)[seq_index] + torch.randn(n, generator=g) * 0.4
    adv = torch.randn(seqs, generator=g)[seq_index]  # one advantage per sequence (GRPO)
    return dict(logp=logp, prox=prox, behaviour=behaviour, adv=adv, mask=mask, seq_index=seq_index,
                seqs=seqs, lengths=lengths)


def implementation(cfg: AlgorithmConfig, b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, gradient with respect to log π_θ) from tokenflow's objective."""
    logp = b["logp"].clone().requires_grad_(True)
    seq_tokens = torch.zeros(b["seqs"], dtype=torch.long).index_add(0, b["seq_index"], b["mask"].long())
    counts = GlobalCounts(int(b["mask"].sum()), b["seqs"])
    weights = token_weights(cfg.aggregation, b["mask"], b["seq_index"], seq_tokens, counts)
    terms = micro_batch_loss(cfg, TokenInputs(
        logprobs=logp, behaviour=b["behaviour"], advantages=b["adv"], mask=b["mask"], weights=weights,
        seq_index=b["seq_index"], num_seqs=b["seqs"], prox=b["prox"] if cfg.objective == "decoupled" else None))
    terms.policy.backward()
    return terms.policy.detach(), logp.grad


def gspo_reference(b: dict, objective: str, cap: float | None):
    """GSPO (Zheng et al. 2025, eq. 5-7) per sequence; (loss, gradient, sequences clipped)."""
    logp = b["logp"].clone().requires_grad_(True)
    total, clipped = 0.0, 0
    for i in range(b["seqs"]):
        t = (b["seq_index"] == i) & b["mask"]
        lp, mu, px, a = logp[t], b["behaviour"][t], b["prox"][t], b["adv"][t][0]
        anchor = px if objective == "decoupled" else mu
        s = torch.exp((lp - anchor).mean())  # the sequence's importance ratio, length-normalised
        if objective == "decoupled":
            outside = torch.exp((px - mu).mean())  # π_prox/μ per sequence, outside the clip
            if cap is not None:
                outside = torch.clamp(outside, max=cap)
        else:
            outside = torch.tensor(1.0) if cap is None else torch.clamp(cap / s.detach(), max=1.0)
        clipped += int((a > 0 and s > 1 + HIGH) or (a < 0 and s < 1 - LOW))
        total = total - outside * torch.minimum(s * a, torch.clamp(s, 1 - LOW, 1 + HIGH) * a)
    loss = total / b["seqs"]
    loss.backward()
    return loss.detach(), logp.grad, clipped


def cispo_reference(b: dict, objective: str, cap: float | None):
    """CISPO (MiniMax-M1, eq. 4): −Σ sg(clip(r)) A log π_θ / Σ|o|; (loss, gradient, tokens clipped)."""
    logp = b["logp"].clone().requires_grad_(True)
    m = b["mask"]
    lp, mu, px, a = logp[m], b["behaviour"][m], b["prox"][m], b["adv"][m]
    with torch.no_grad():
        if objective == "decoupled":
            behaviour_weight = torch.exp(px - mu)
            if cap is not None:
                behaviour_weight = torch.clamp(behaviour_weight, max=cap)
            r = torch.exp(lp - px) * behaviour_weight
        else:
            r = torch.exp(lp - mu)
            if cap is not None:
                r = torch.clamp(r, max=cap)
        r_hat = torch.clamp(r, 1 - LOW, 1 + HIGH)
        clipped = int(((r < 1 - LOW) | (r > 1 + HIGH)).sum())
    loss = -(r_hat * a * lp).sum() / m.sum()
    loss.backward()
    return loss.detach(), logp.grad, clipped


def assert_grads_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))


def differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) > 1e-2 * float(b.abs().max())


@pytest.mark.parametrize("cap", [None, 1.2])
@pytest.mark.parametrize("objective", ["decoupled", "direct"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_is_the_papers_sequence_objective(objective, cap, seed):
    b = random_batch(seed)
    cfg = dict(objective=objective, clip_low=LOW, clip_high=HIGH, tis_cap=cap, aggregation="seq_mean_token_mean")
    loss, grad = implementation(AlgorithmConfig(policy_loss="gspo", **cfg), b)
    want_loss, want_grad, clipped = gspo_reference(b, objective, cap)
    assert clipped >= 2, "the sequence clip must bind on this batch"
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5, abs=1e-7)
    assert_grads_close(grad, want_grad)
    _, ppo_grad = implementation(AlgorithmConfig(policy_loss="ppo", **cfg), b)
    assert differs(grad, ppo_grad)


@pytest.mark.parametrize("cap", [None, 1.2])
@pytest.mark.parametrize("objective", ["decoupled", "direct"])
@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_clips_the_importance_weight_it_trains_with(objective, cap, seed):
    b = random_batch(seed)
    cfg = dict(objective=objective, clip_low=LOW, clip_high=HIGH, tis_cap=cap, aggregation="token_mean")
    loss, grad = implementation(AlgorithmConfig(policy_loss="cispo", **cfg), b)
    want_loss, want_grad, clipped = cispo_reference(b, objective, cap)
    assert clipped >= 0.1 * int(b["mask"].sum()), "the weight clip must bind on this batch"
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5, abs=1e-7)
    assert_grads_close(grad, want_grad)
    _, ppo_grad = implementation(AlgorithmConfig(policy_loss="ppo", **cfg), b)
    assert differs(grad, ppo_grad)


def test_at_a_batchs_first_step_decoupled_cispo_still_clips_the_behaviour_weight():
    """With π_θ = π_prox (one optimizer step per batch) PPO's decoupled clip cannot bind, but
    CISPO's weight is π_prox/μ there, and it is clipped: the gradient is not PPO's."""
    b = random_batch(3)
    b["logp"] = b["prox"].clone()
    cfg = dict(objective="decoupled", clip_low=LOW, clip_high=HIGH)
    _, cispo = implementation(AlgorithmConfig(policy_loss="cispo", **cfg), b)
    want_loss, want_grad, clipped = cispo_reference(b, "decoupled", None)
    _, ppo = implementation(AlgorithmConfig(policy_loss="ppo", **cfg), b)
    assert clipped > 0
    assert_grads_close(cispo, want_grad)
    assert differs(cispo, ppo)
