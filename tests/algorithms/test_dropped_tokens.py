"""A token dropped by a correction (IS masking, OPSM, version rejection) gets no gradient from any
loss term: policy, KL, entropy bonus or value.

Each test takes the gradient of one term alone with respect to that term's own input and compares
it, token by token, with the hand-derived gradient: the aggregation weight times the term's
derivative on kept tokens, exactly 0 on dropped ones.
"""

import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig, GlobalCounts, TokenInputs, micro_batch_loss, token_weights
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import collate, to_train_sequence

# Two sequences of three tokens, behaviour weights w = π/μ: 0.5, 1, 4 | 1, 2, 0.25.
W = torch.tensor([0.5, 1.0, 4.0, 1.0, 2.0, 0.25], dtype=torch.float64)
LOGP = torch.log(torch.tensor([0.3, 0.2, 0.4, 0.3, 0.5, 0.1], dtype=torch.float64))
BEHAVIOUR = LOGP - torch.log(W)
REF = torch.log(torch.tensor([0.25, 0.3, 0.2, 0.35, 0.4, 0.2], dtype=torch.float64))
ENTROPY = torch.tensor([1.0, 1.5, 0.5, 2.0, 0.7, 1.2], dtype=torch.float64)
VALUES = torch.tensor([0.2, -0.1, 0.4, 0.9, 0.3, -0.5], dtype=torch.float64)
RETURNS = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
ADV = -torch.ones(6, dtype=torch.float64)  # negative, so OPSM may drop a sequence
SEQ = torch.tensor([0, 0, 0, 1, 1, 1])
TRAINER_VERSION = 5
VERSIONS = [[5, 5, 3], [4, 5, 5]]  # token 2 is 2 versions old: rejected with max_token_age = 1

# Wide clips, so PPO's clip never binds and the policy gradient is −ρ·A per token.
WIDE = dict(clip_low=0.99, clip_high=100.0, tis_cap=None)  # no clip, no TIS: the drops alone

# Which tokens each correction drops (derivations in the comments):
DROPS = {
    # w ∉ [0.4, 3] → tokens 2 (w = 4) and 5 (w = 0.25). (Bounds away from any w: the rollout
    # stores μ in float32, so w = 2 would come back as 2 ± 1e-7.)
    "is_mask": (dict(is_mask_low=0.4, is_mask_high=3.0), [True, True, False, True, True, False]),
    # mean(log μ − log π) per sequence = −mean log w: seq 0 −log(2)/3 < δ, seq 1 log(2)/3 = 0.231 > δ.
    "opsm": (dict(opsm_delta=0.2), [True, True, True, False, False, False]),
    # Decided from versions alone: token 2 is TRAINER_VERSION − 3 = 2 > 1 versions old.
    "version": (dict(max_token_age=1), [True, True, False, True, True, True]),
}


def inputs(kind: str, **extra) -> tuple[AlgorithmConfig, TokenInputs, torch.Tensor]:
    """The micro-batch a trainer would build, through the trainer's own batch code for the
    version mask; returns the config, the inputs and the expected keep mask."""
    options, keep = DROPS[kind]
    cfg = AlgorithmConfig(**WIDE, **options, **{k: v for k, v in extra.items() if k.endswith("coef")})
    rollouts = [Rollout(prompt_ids=[1], completion_ids=[2, 3, 4], logprobs=BEHAVIOUR[3 * i:3 * i + 3].numpy(),
                        versions=VERSIONS[i]) for i in range(2)]
    seqs = [to_train_sequence(i, r, TRAINER_VERSION, keep_sampling_mask=True, max_token_age=cfg.max_token_age)
            for i, r in enumerate(rollouts)]
    mb = collate(seqs)
    seq_tokens = torch.tensor([s.num_loss_tokens for s in seqs])
    counts = GlobalCounts(int(seq_tokens.sum()), 2)
    weights = token_weights(cfg.aggregation, mb.mask, mb.seq_index, seq_tokens, counts).double()
    t = TokenInputs(logprobs=extra.get("logprobs", LOGP), behaviour=mb.behaviour.double(), advantages=ADV,
                    mask=mb.mask, weights=weights, seq_index=mb.seq_index, num_seqs=2,
                    entropy=extra.get("entropy"), ref_logprobs=extra.get("ref"), values=extra.get("values"),
                    returns=extra.get("returns"))
    return cfg, t, torch.tensor(keep)


def check(grad: torch.Tensor, expected_kept: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor):
    assert grad[~keep].abs().max().item() == 0.0, f"dropped tokens got gradient {grad[~keep].tolist()}"
    torch.testing.assert_close(grad, torch.where(keep, weights * expected_kept, torch.zeros_like(grad)),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", DROPS)
def test_dropped_tokens_get_no_policy_gradient(kind):
    logp = LOGP.clone().requires_grad_()
    cfg, t, keep = inputs(kind, logprobs=logp)
    micro_batch_loss(cfg, t).policy.backward()
    # −ρA with ρ = π_θ/μ = w: d/dlog π_θ = −w·A (w from μ as the rollout stored it, float32).
    check(logp.grad, -torch.exp(LOGP - t.behaviour) * ADV, t.weights, keep)


@pytest.mark.parametrize("kind", DROPS)
def test_dropped_tokens_get_no_kl_gradient(kind):
    logp = LOGP.clone().requires_grad_()
    cfg, t, keep = inputs(kind, logprobs=logp, ref=REF, kl_coef=0.1)
    assert cfg.kl_estimator == "k3"
    micro_batch_loss(cfg, t).kl.backward()
    # k3 = e^{ref − log π} − (ref − log π) − 1: d/dlog π = 1 − e^{ref − log π}.
    check(logp.grad, 0.1 * (1 - torch.exp(REF - LOGP)), t.weights, keep)


@pytest.mark.parametrize("kind", DROPS)
def test_dropped_tokens_get_no_entropy_gradient(kind):
    ent = ENTROPY.clone().requires_grad_()
    cfg, t, keep = inputs(kind, entropy=ent, entropy_coef=0.01)
    micro_batch_loss(cfg, t).entropy_bonus.backward()
    check(ent.grad, torch.full((6,), -0.01, dtype=torch.float64), t.weights, keep)


@pytest.mark.parametrize("kind", DROPS)
def test_dropped_tokens_get_no_value_gradient(kind):
    v = VALUES.clone().requires_grad_()
    cfg, t, keep = inputs(kind, values=v, returns=RETURNS)
    micro_batch_loss(cfg, t).value.backward()
    # value_coef · 0.5(V − R)²: d/dV = value_coef·(V − R).
    check(v.grad, cfg.value_coef * (VALUES - RETURNS), t.weights, keep)


def test_dropped_tokens_stay_in_the_normaliser_but_rejected_ones_do_not():
    """IS masking / OPSM decide during the forward pass, so the token-mean normaliser still counts
    all 6 tokens; version rejection is known before, so it counts 5."""
    for kind, n in (("is_mask", 6), ("opsm", 6), ("version", 5)):
        _, t, _ = inputs(kind)
        assert t.weights[t.mask].tolist() == pytest.approx([1 / n] * n), kind
        assert np.count_nonzero(t.weights.numpy()) == n
