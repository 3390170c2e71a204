"""Real steps on a tiny local model: learning, accumulation, failures, value head, KL."""

import copy

import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig, GlobalCounts, compute_advantages
from tokenflow.rollout import Rollout
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model


@pytest.mark.parametrize("algo", [dict(), dict(policy_loss="cispo", advantage="dr_grpo", clip_high=0.28),
                                  dict(policy_loss="gspo", advantage="rloo", aggregation="seq_mean_token_mean",
                                       clip_low=0.2, clip_high=0.2)])
def test_steps_change_every_parameter_and_lower_the_loss(algo):
    model = tiny_model(seed=2)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollouts = on_policy(model, make_rollouts(seed=5))
    cfg = AlgorithmConfig(**algo)
    trainer = Trainer(model, TrainerConfig(device="cpu", lr=3e-3, micro_batch_tokens=40), cfg)
    adv = compute_advantages(rollouts, cfg).advantages

    def advantage_weighted_loglik():
        return sum(float((a * lp).sum()) for a, lp in zip(adv, trainer.logprobs(rollouts)))

    start = advantage_weighted_loglik()
    losses = [trainer.train_step(rollouts)["loss/policy"] for _ in range(6)]
    # The policy moved towards positive-advantage tokens on the fixed batch.
    assert advantage_weighted_loglik() > start + 1.0
    if cfg.policy_loss != "cispo":  # CISPO's value moves with its detached weight; not a progress measure
        assert losses[-1] < losses[0] - 0.02, losses
    for n, p in model.named_parameters():
        assert not torch.equal(p, initial[n]), f"{n} did not change"
    assert trainer.version == 6


def test_accumulation_is_exact_over_micro_batch_sizes():
    rollouts = on_policy(tiny_model(seed=3), make_rollouts(seed=6))
    algo = AlgorithmConfig(aggregation="seq_mean_token_mean", kl_coef=0.05, entropy_coef=0.01)
    results = []
    for budget in (16, 48, 10_000):
        tr = Trainer(tiny_model(seed=3), TrainerConfig(device="cpu", lr=1e-3, grad_clip=None,
                                                      micro_batch_tokens=budget), algo)
        m = tr.train_step(rollouts)
        results.append((m, dict(tr.named_weights())))
    counts = [r[0]["perf/micro_batches"] for r in results]
    assert counts[0] > counts[1] > counts[2] == 1
    for m, w in results[:2]:
        for key in ("loss/total", "loss/policy", "loss/kl", "loss/entropy_bonus", "optim/grad_norm"):
            assert m[key] == pytest.approx(results[-1][0][key], rel=1e-4, abs=1e-7), key
        for k, v in w.items():
            torch.testing.assert_close(v, results[-1][1][k], rtol=1e-4, atol=1e-6)


def test_injected_global_counts_set_the_normaliser():
    rollouts = on_policy(tiny_model(seed=3), make_rollouts(seed=6))
    cfg = TrainerConfig(device="cpu", lr=0.0, grad_clip=None)
    local = Trainer(tiny_model(seed=3), cfg, AlgorithmConfig()).train_step(rollouts)
    n = int(local["perf/loss_tokens"])
    doubled = Trainer(tiny_model(seed=3), cfg, AlgorithmConfig()).train_step(
        rollouts, global_counts=GlobalCounts(num_tokens=2 * n, num_sequences=2 * len(rollouts)))
    assert doubled["loss/policy"] == pytest.approx(local["loss/policy"] / 2, rel=1e-5)
    assert doubled["optim/grad_norm"] == pytest.approx(local["optim/grad_norm"] / 2, rel=1e-5)


def test_failed_rollouts_do_not_contribute():
    rollouts = on_policy(tiny_model(seed=4), make_rollouts(seed=7))
    bad = copy.deepcopy(rollouts[:3])
    for r in bad:
        r.failed, r.reward = True, None
        r.logprobs[:] = np.nan  # garbage that would poison the loss if it were used
    cfg = TrainerConfig(device="cpu", lr=1e-3)
    clean = Trainer(tiny_model(seed=4), cfg, AlgorithmConfig()).train_step(rollouts)
    mixed = Trainer(tiny_model(seed=4), cfg, AlgorithmConfig()).train_step(bad + rollouts)
    assert mixed["perf/failed_rollouts"] == 3
    for key in ("loss/total", "optim/grad_norm", "perf/loss_tokens"):
        assert mixed[key] == pytest.approx(clean[key], rel=1e-6), key


def test_all_failed_makes_no_update():
    model = tiny_model(seed=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = make_rollouts(seed=1, groups=1, per_group=2)
    for x in r:
        x.failed = True
    tr = Trainer(model, TrainerConfig(device="cpu", lr=1e-2), AlgorithmConfig())
    m = tr.train_step(r)
    assert m["loss/total"] == 0 and m["optim/grad_norm"] == 0 and tr.version == 1
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_gae_value_head_learns_the_returns():
    model = tiny_model(seed=5)
    rollouts = on_policy(model, make_rollouts(seed=8))
    tr = Trainer(model, TrainerConfig(device="cpu", lr=1e-3, value_head=True, value_lr=3e-2),
                 AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0, whiten_advantages=True, value_coef=1.0))
    head = {n: p.detach().clone() for n, p in tr.value_head.named_parameters()}
    errors = [tr.train_step(rollouts)["value/abs_error"] for _ in range(8)]
    assert errors[-1] < 0.5 * errors[0], errors
    assert all(not torch.equal(p, head[n]) for n, p in tr.value_head.named_parameters())
    assert not any("value" in k for k, _ in tr.named_weights())


def test_kl_to_frozen_reference_grows_from_zero():
    model = tiny_model(seed=6)
    rollouts = on_policy(model, make_rollouts(seed=9))
    tr = Trainer(model, TrainerConfig(device="cpu", lr=1e-2), AlgorithmConfig(kl_coef=0.5, kl_estimator="k3"))
    first = tr.train_step(rollouts)
    assert first["policy/ref_kl"] == pytest.approx(0.0, abs=1e-7)
    later = [tr.train_step(rollouts) for _ in range(3)][-1]
    assert later["policy/ref_kl"] > 1e-4
    # token_mean aggregation: loss/kl = kl_coef · (Σ_t KL_t / N) and policy/ref_kl = Σ_t KL_t / N
    # over the same float32 KL_t; the two sums differ only by float32 rounding, at most n·2⁻²⁴
    # relative for n loss tokens.
    n = later["perf/loss_tokens"]
    assert later["loss/kl"] == pytest.approx(0.5 * later["policy/ref_kl"], rel=n * 2.0 ** -24)
    assert all(not p.requires_grad for p in tr.reference.parameters())


# Unit roundoff of bfloat16 (8 significand bits) and of float32 (24).
BF16_U, FP32_U = 2.0 ** -8, 2.0 ** -24


def _step_observed(dtype: str, checkpointing: bool):
    """One step of the same model and batch; what the first decoder layer's q_proj saw: its
    output dtypes and how many times it ran (forward hook)."""
    model = tiny_model(seed=7, tie=True)
    rollouts = on_policy(model, make_rollouts(seed=10, groups=2))
    cfg = TrainerConfig(device="cpu", lr=1e-3, dtype=dtype, fp32_lm_head=True,
                        gradient_checkpointing=checkpointing)
    tr = Trainer(model, cfg, AlgorithmConfig(tis_cap=2.0))
    seen: list[torch.dtype] = []

    def hook(_module, _args, out):
        seen.append(out.dtype)

    handle = tr.model.model.layers[0].self_attn.q_proj.register_forward_hook(hook)
    try:
        m = tr.train_step(rollouts)
    finally:
        handle.remove()
    return tr, rollouts, m, seen


def test_bfloat16_fp32_head_and_checkpointing_run():
    """bfloat16 autocast really computes the trunk in bfloat16 (float32 master weights, float32
    logits from the fp32 head), and it shows in the engine/trainer mismatch: far above float32's
    round-off, within bfloat16's. Checkpointing really recomputes: the layer runs once more per
    micro-batch, in the backward."""
    tr, rollouts, m, seen = _step_observed("bfloat16", checkpointing=True)
    assert np.isfinite(m["loss/total"]) and m["optim/grad_norm"] > 0
    assert set(seen) == {torch.bfloat16}, seen
    # bf16 trunk vs the float32 engine, same weights: the mean |Δ log-prob| is set by bf16's
    # rounding (1.4e-4 here), 2000x what a float32 trunk gives (7e-8, about FP32_U).
    assert BF16_U / 1000 < m["offpolicy/mismatch_abs_logprob"] < BF16_U, m["offpolicy/mismatch_abs_logprob"]
    assert m["offpolicy/mismatch_abs_logprob"] > 50 * FP32_U
    from tokenflow.trainer.batch import micro_batches
    mb = micro_batches(tr._sequences(rollouts), 10_000)[0]
    logits, _ = tr.runner(mb)
    assert logits.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    _, _, plain, seen_plain = _step_observed("bfloat16", checkpointing=False)
    assert len(seen) - len(seen_plain) == m["perf/micro_batches"] >= 1, (len(seen), len(seen_plain))
    assert plain["offpolicy/mismatch_abs_logprob"] == pytest.approx(m["offpolicy/mismatch_abs_logprob"], rel=1e-3)


def test_float32_mismatch_is_float32_round_off():
    """The other side of the band above: a float32 trunk agrees with the engine to about FP32_U."""
    _, _, m, seen = _step_observed("float32", checkpointing=False)
    assert set(seen) == {torch.float32}
    assert m["offpolicy/mismatch_abs_logprob"] < 50 * FP32_U


def test_warmup_and_lr_metric():
    model = tiny_model(seed=8)
    rollouts = on_policy(model, make_rollouts(seed=11, groups=1))
    # The same version-0 batch five times grows 0..4 versions old: the staleness factor is off here
    # (tests/trainer/test_staleness_lr.py has it), so optim/lr is the schedule's alone.
    tr = Trainer(model, TrainerConfig(device="cpu", lr=1e-3, warmup_steps=4, staleness_lr=False), AlgorithmConfig())
    lrs = [tr.train_step(rollouts)["optim/lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_multi_turn_tool_tokens_get_no_gradient():
    """Environment tokens (loss mask 0) are scored but neither weighted nor counted."""
    model = tiny_model(seed=9)
    r = Rollout(prompt_ids=[1, 2], completion_ids=[3, 4, 5, 6, 7], logprobs=np.zeros(5), versions=np.zeros(5),
                loss_mask=[1, 1, 0, 0, 1], reward=1.0, group_id=0)
    r2 = copy.deepcopy(r)
    r2.reward = 0.0
    on_policy(model, [r, r2])
    clean = Trainer(copy.deepcopy(model), TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig()).train_step([r, r2])
    for x in (r, r2):
        x.logprobs[2:4] = np.nan  # an engine that records nothing for tool tokens
    m = Trainer(model, TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig()).train_step([r, r2])
    assert m["perf/loss_tokens"] == 6
    assert m["optim/grad_norm"] == pytest.approx(clean["optim/grad_norm"], rel=1e-6) and m["optim/grad_norm"] > 0
    assert m["loss/total"] == pytest.approx(clean["loss/total"], rel=1e-6)
