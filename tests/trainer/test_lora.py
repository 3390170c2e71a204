"""LoRA: only the adapters train; engines get the merged weights under the base model's names,
reproduce the trainer's log-probs from them, and checkpoints resume exactly."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.test_checkpoint import _roundtrip
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

CFG = dict(device="cpu", lr=1e-2, lora_rank=4, lora_alpha=8.0)


def test_only_adapters_train_and_pushes_carry_the_merged_weights():
    base = dict(tiny_model(seed=1).state_dict())
    tr = Trainer(tiny_model(seed=1), TrainerConfig(**CFG), AlgorithmConfig())
    trained = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert sum(len(g["params"]) for g in tr.optimizer.param_groups) == len(trained)
    before = dict(tr.named_weights())
    assert list(before) == list(base)  # the base model's names, adapters left out
    assert all(torch.equal(before[n], base[n]) for n in base)  # B = 0: merged = base
    tr.train_step(on_policy(tiny_model(seed=1), make_rollouts(seed=2)))
    after = dict(tr.named_weights())
    moved = {n for n in base if not torch.equal(after[n], base[n])}
    assert moved and all(any(m in n for m in ("_proj",)) for n in moved)
    assert not any("embed" in n or "norm" in n or "lm_head" in n for n in moved)
    # A plain model holding the merged weights computes what the adapted policy computes.
    plain = tiny_model(seed=0)
    plain.load_state_dict(after)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        tr.model.eval()
        assert torch.allclose(plain(ids).logits, tr.model(input_ids=ids).logits, atol=1e-5)


def test_engine_on_merged_weights_matches_the_lora_trainer(tmp_path):
    tr = Trainer(tiny_model(seed=3), TrainerConfig(**CFG), AlgorithmConfig())
    tr.train_step(on_policy(tiny_model(seed=3), make_rollouts(seed=4)))  # adapters now non-zero
    tiny_model(seed=3).save_pretrained(tmp_path)
    engine = Engine(str(tmp_path), EngineConfig(device="cpu", dtype="float32"))
    engine.update_weights(tr.named_weights(), version=tr.version)
    groups = engine.generate([[1, 2, 3, 4], [5, 6, 7]], SamplingParams(max_tokens=10, n=3, seed=1))
    rollouts = [r for g in groups for r in g]
    for gid, g in enumerate(groups):
        for k, r in enumerate(g):
            # No sample at its group's mean: a zero-advantage sample would be skipped, unscored.
            r.group_id, r.reward = gid, float(k == 0)
    m = tr.train_step(rollouts)
    assert m["offpolicy/mismatch_tokens"] == sum(r.num_tokens for r in rollouts)
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5


def test_lora_checkpoints_hold_adapters_and_resume_exactly(tmp_path):
    rollouts = on_policy(tiny_model(seed=5), make_rollouts(seed=6))
    a = Trainer(tiny_model(seed=5), TrainerConfig(**CFG), AlgorithmConfig())
    a.train_step(rollouts)
    state = torch.load(_roundtrip(a.state_dict()), weights_only=False)
    assert state["model"] and all("lora_" in k for k in state["model"])
    exported = AutoModelForCausalLM.from_pretrained(a.save_pretrained(tmp_path / "export"))
    for n, w in a.named_weights():
        assert torch.equal(exported.state_dict()[n], w), n
    b = Trainer(tiny_model(seed=5), TrainerConfig(**CFG), AlgorithmConfig())  # from the base again
    b.load_state_dict(state)
    assert b.train_step(rollouts)["loss/total"] == a.train_step(rollouts)["loss/total"]
    for (n, wa), (_, wb) in zip(a.named_weights(), b.named_weights()):
        assert torch.equal(wa, wb), n


def test_lora_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="world_size"):
        TrainerConfig(lora_rank=4, world_size=2)
    with pytest.raises(ValueError, match="lora_target_modules"):
        Trainer(tiny_model(), TrainerConfig(**{**CFG, "lora_target_modules": ["no_such_proj"]}), AlgorithmConfig())


def test_the_kl_reference_is_the_base_model_with_adapters_off():
    rollouts = on_policy(tiny_model(seed=7), make_rollouts(seed=8))
    tr = Trainer(tiny_model(seed=7), TrainerConfig(**CFG), AlgorithmConfig(kl_coef=0.1))
    assert tr.reference is None  # no second copy of the weights
    first = tr.train_step(rollouts)
    assert first["loss/kl"] == 0.0  # adapters start at zero: the policy is the base model
    tr.train_step(rollouts)
    third = tr.train_step(rollouts)
    assert third["loss/kl"] > 0  # the adapters moved the policy away from the base
    # The reference still computes the base model's log-probs, while the policy does not.
    plain = Trainer(tiny_model(seed=7), TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig())
    seqs = tr._sequences(rollouts)
    base = plain.passes.score(plain._sequences(rollouts), len(rollouts), with_values=False)[0]
    ref = tr.passes.score(seqs, len(rollouts), with_values=False, runner=tr.ref_runner)[0]
    now = tr.passes.score(seqs, len(rollouts), with_values=False)[0]
    assert max(abs(a - b).max() for a, b in zip(ref, base)) < 1e-6
    assert max(abs(a - b).max() for a, b in zip(now, base)) > 1e-4
