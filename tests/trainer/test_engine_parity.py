"""The built-in engine and the trainer agree on-policy: same weights, same version, so every
behaviour log-prob the engine records is reproduced by the trainer (temperature, top-k/top-p
truncation with and without the Keep Sampling Mask, greedy decoding)."""

import numpy as np
import pytest

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("parity_model")
    tiny_model(seed=11).save_pretrained(path)
    return path


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.7),
    dict(temperature=1.0, top_k=10, top_p=0.9),
    dict(temperature=0.0, max_tokens=6, n=2),
])
def test_engine_and_trainer_agree_on_policy(model_dir, sampling):
    engine = Engine(str(model_dir), EngineConfig(device="cpu", dtype="float32"))
    params = SamplingParams(**{"max_tokens": 12, "n": 3, "seed": 5, **sampling})
    groups = engine.generate([[1, 2, 3, 4], [5, 6, 7]], params)
    rollouts = [r for g in groups for r in g]
    rng = np.random.default_rng(0)
    for gid, group in enumerate(groups):
        for r in group:
            r.group_id, r.reward = gid, float(rng.random())
    truncated = sampling.get("top_k", 0) > 0
    assert any(s is not None for r in rollouts for s in (r.support or [])) == truncated
    for keep_sampling_mask in (True, False):
        trainer = Trainer(str(model_dir), TrainerConfig(device="cpu", lr=0.0),
                          AlgorithmConfig(keep_sampling_mask=keep_sampling_mask))
        m = trainer.train_step(rollouts)
        assert m["offpolicy/mismatch_tokens"] == sum(r.num_tokens for r in rollouts)
        assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
        assert abs(m["offpolicy/mismatch_ratio"] - 1) < 1e-5
        assert abs(m["offpolicy/is_ratio_max"] - 1) < 1e-5 and abs(m["offpolicy/is_ratio_min"] - 1) < 1e-5


def test_engine_and_trainer_agree_with_sliding_window_attention(tmp_path):
    """A Qwen2 whose second layer attends to the last 6 positions only, with rollouts far longer
    than that, packed several to a row by the trainer: both sides apply the same window."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(4)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      use_sliding_window=True, sliding_window=6, max_window_layers=1, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    engine = Engine(str(tmp_path), EngineConfig(device="cpu", dtype="float32"))
    groups = engine.generate([[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]], SamplingParams(max_tokens=20, n=3, seed=2,
                                                                                 ignore_eos=True))
    rollouts = [r for g in groups for r in g]
    for gid, group in enumerate(groups):
        for k, r in enumerate(group):
            r.group_id, r.reward = gid, float(k)
    assert min(len(r.prompt_ids) + r.num_tokens for r in rollouts) > 2 * 6
    trainer = Trainer(str(tmp_path), TrainerConfig(device="cpu", lr=0.0, pack_row_tokens=64), AlgorithmConfig())
    m = trainer.train_step(rollouts)
    assert m["perf/micro_batches"] == 1  # all six rollouts packed together
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
