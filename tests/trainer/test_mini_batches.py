"""PPO mini-batch updates: one rollout batch as mini_batches × epochs optimizer steps.

π_prox is the policy before the batch's first step, so the decoupled clip binds from the second
step on; the version and the LR schedule count batches; π_prox from the first step's forward is
exactly the no-grad pass's; a stochastic forward (dropout, router jitter) gets the pass, in eval
mode.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.config.loading import ConfigError, load_config
from tokenflow.config.root import TrainConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import VOCAB, make_rollouts, on_policy, tiny_model

LR = 2e-2


def batch(seed: int = 5):
    """Four groups of four, on-policy for tiny_model(seed=2): halves are whole groups."""
    return on_policy(tiny_model(seed=2), make_rollouts(seed=seed, groups=4, per_group=4))


def trainer(algo: AlgorithmConfig, model=None, **kw) -> Trainer:
    cfg = TrainerConfig(**{**dict(device="cpu", lr=LR, grad_clip=None, micro_batch_tokens=48), **kw})
    return Trainer(model if model is not None else tiny_model(seed=2), cfg, algo)


def weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.model.state_dict().items()}


def test_two_mini_batches_are_two_ppo_steps_against_the_batchs_starting_policy():
    """On an on-policy batch μ is the starting policy, so decoupled PPO with two mini-batches
    must be two direct PPO steps on the two halves (ratio π_θ/μ = π_θ/π_prox, w = 1): the second
    one clipped against the weights before the first. Same weights after, same clip fraction."""
    rollouts = batch()
    algo = AlgorithmConfig(objective="decoupled", clip_low=0.1, clip_high=0.1)
    # Adam's step is lr·g/(|g| + ε): with the default ε = 1e-8 an entry whose gradient is within
    # float32 rounding of zero steps by ±lr either way, and the two paths round differently (one
    # forward over the whole batch against one per half): 2e-5 apart on an AVX-512/AMX machine.
    # ε = 1e-6 bounds a rounding error δg's effect on a weight by lr·δg/ε (measured 1.1e-6).
    mini = trainer(algo, mini_batches=2, adam_eps=1e-6)
    m = mini.train_step(rollouts)
    reference = trainer(AlgorithmConfig(objective="direct", clip_low=0.1, clip_high=0.1), adam_eps=1e-6)
    steps = [reference.train_step(rollouts[:8]), reference.train_step(rollouts[8:])]
    assert m["optim/steps"] == 2 and mini.version == 1 and reference.version == 2
    for k, v in weights(reference).items():
        torch.testing.assert_close(mini.model.state_dict()[k], v, rtol=1e-4, atol=1e-6, msg=k)
    # The clip binds at the second step (and only there: the first is at π_prox itself).
    assert steps[0]["policy/clip_frac"] == 0.0 and steps[1]["policy/clip_frac"] > 0.05
    n = [s["perf/loss_tokens"] for s in steps]
    assert m["policy/clip_frac"] == pytest.approx(steps[1]["policy/clip_frac"] * n[1] / sum(n), rel=1e-4)
    assert m["policy/approx_kl"] > 0
    assert m["offpolicy/is_ratio_max"] == pytest.approx(1.0, abs=1e-4)  # w = π_prox/μ = 1 on-policy
    assert m["offpolicy/mismatch_tokens"] == sum(n)  # every token once, at the starting weights
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5


def test_one_step_per_batch_is_unchanged_and_clips_nothing():
    rollouts = batch()
    m = trainer(AlgorithmConfig(clip_low=0.1, clip_high=0.1)).train_step(rollouts)
    assert m["optim/steps"] == 1 and m["policy/clip_frac"] == 0.0 and m["policy/approx_kl"] == 0.0


@pytest.mark.parametrize("mini_batches, epochs, passes", [(2, 2, 1), (1, 3, 0), (3, 1, 1)])
def test_prox_from_the_first_forward_equals_the_prox_pass(mini_batches, epochs, passes):
    """π_prox for the first mini-batch comes from its forward and is kept for later epochs; the
    rest from one no-grad pass. The weights equal those of a trainer that runs the pass for all
    of it (off-policy batch, TIS on)."""
    rollouts = make_rollouts(seed=7, groups=4, per_group=4)
    on_policy(tiny_model(seed=9), rollouts)  # behaviour from other weights: w ≠ 1
    algo = AlgorithmConfig(objective="decoupled", tis_cap=1.5, clip_low=0.1, clip_high=0.1)
    results = []
    for force_pass in (False, True):
        t = trainer(algo, mini_batches=mini_batches, epochs=epochs)
        if force_pass:
            t.__class__ = type("PassTrainer", (Trainer,), {"prox_from_forward": property(lambda self: False)})
        count, score = [], t.passes.score
        t.passes.score = lambda *a, **k: count.append(1) or score(*a, **k)
        results.append((t.train_step(rollouts), weights(t), len(count)))
    (fast, w_fast, n_fast), (slow, w_slow, n_slow) = results
    assert (n_fast, n_slow) == (passes, 1)
    assert fast["optim/steps"] == mini_batches * epochs
    assert fast["policy/clip_frac"] > 0 and fast["offpolicy/is_ratio_max"] > 1.5
    assert fast["offpolicy/is_weight_max"] == pytest.approx(1.5)  # the weight the loss used: capped
    for key in ("policy/clip_frac", "policy/approx_kl", "offpolicy/is_ratio_max", "offpolicy/tis_clipped_frac"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-7), key
    for k, v in w_slow.items():
        torch.testing.assert_close(w_fast[k], v, rtol=1e-4, atol=1e-6, msg=k)


def test_the_version_and_the_schedule_count_batches():
    rollouts = batch()
    algo = AlgorithmConfig()
    lrs = {}
    for mb in (1, 4):
        t = trainer(algo, mini_batches=mb, warmup_steps=3)
        lrs[mb] = [t.train_step(rollouts)["optim/lr"] for _ in range(2)]
        assert t.version == 2
    assert lrs[1] == lrs[4] == pytest.approx([LR / 3, 2 * LR / 3])


def test_mini_batches_above_the_batch_are_refused():
    with pytest.raises(ConfigError, match=r"trainer\.mini_batches \(9\).*rollout\.prompts_per_step"):
        load_config(TrainConfig, None, ["--rollout.prompts_per_step", "2", "--rollout.group_size", "4",
                               "--trainer.mini_batches", "9"])


# ---- a stochastic forward gets a no-grad pass in eval mode -------------------------------------

def llama(**noise):
    torch.manual_seed(4)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, **noise)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def mixtral(**noise):
    torch.manual_seed(4)
    cfg = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
                        num_local_experts=4, num_experts_per_tok=2, **noise)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


@pytest.mark.parametrize("build, noise", [(llama, dict(attention_dropout=0.5)),
                                          (mixtral, dict(router_jitter_noise=0.3))])
def test_a_stochastic_forward_gets_a_no_grad_pass_in_eval_mode(build, noise):
    model = build(**noise)
    rollouts = make_rollouts(seed=3)
    model.eval()
    on_policy(model, rollouts)  # the deterministic (eval-mode) policy as behaviour, as an engine runs it
    model.train()
    # The forward really is random in train mode: two passes differ.
    ids = torch.tensor(np.concatenate([rollouts[0].prompt_ids, rollouts[0].completion_ids]))[None]
    with torch.no_grad():
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
    t = trainer(AlgorithmConfig(objective="decoupled"), model=model, lr=0.0)
    assert t.stochastic and not t.prox_from_forward
    assert any(next(iter(noise)) in part for part in t.stochastic)
    modes, score = [], t.passes.score

    def watched(*a, **k):
        out = score(*a, **k)
        modes.append(t.model.training)
        return out

    t.passes.score = watched
    assert t.model.training
    m = t.train_step(rollouts)
    assert len(modes) == 1  # the π_prox pass ran
    assert t.model.training  # and the model is back in train mode for the gradient
    # In eval mode the pass is the engine's deterministic policy: w = π_prox/μ is 1.
    assert m["offpolicy/is_ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-4
    a, b = t.logprobs(rollouts), t.logprobs(rollouts)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_deterministic_forward_reads_prox_off_the_forward():
    for model in (llama(), mixtral()):
        t = trainer(AlgorithmConfig(objective="decoupled"), model=model)
        assert t.stochastic == [] and t.prox_from_forward
