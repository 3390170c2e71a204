"""Teacher scoring (on-policy distillation) with a tiny teacher built here on the shipped tokenizer:

* the per-token reward is log p_T(a_t) − log μ(a_t), with log p_T checked against a plain
  Hugging Face forward pass of the teacher on each sequence alone;
* a teacher with another tokenizer is refused at start with a message naming the difference;
* async distillation at staleness 0 equals the synchronous loop step for step (≤ 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.runtime.runtime_testlib import small_config, step_rows
from tokenflow.runtime.launch import train
from tokenflow.runtime.orchestrator.sync_loop import run_sync_loop
from tokenflow.scoring.teacher import TeacherScorer, TokenizerMismatch, check_same_tokenizer
from tokenflow.scoring.token_scorer_protocol import SampleView

pytestmark = pytest.mark.timeout(600)


def tiny_teacher(path, default_model, seed: int = 5):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model)
    base = AutoModelForCausalLM.from_pretrained(default_model)
    cfg = base.config
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 32, 96, 2
    cfg.num_attention_heads = cfg.num_key_value_heads = 4
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval(), tok


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, default_model):
    path = tmp_path_factory.mktemp("teacher")
    model, tok = tiny_teacher(path, default_model)
    return str(path), model, tok


def test_reward_is_teacher_logprob_minus_behaviour_logprob(teacher, default_model):
    from tokenflow.config.engine import EngineConfig
    from tokenflow.engine import Engine, SamplingParams

    path, model, tok = teacher
    engine = Engine(default_model, EngineConfig(device="cpu", threads=1))
    prompt = [tok.bos_token_id] + tok.encode("347+85=", add_special_tokens=False)
    temperature = 0.7
    group, = engine.generate([prompt], SamplingParams(n=4, temperature=temperature, max_tokens=40, seed=3))
    res = TeacherScorer(path).score("347+85=", [SampleView.of(r) for r in group], {})
    kl = []
    for r, got in zip(group, res.rewards):
        ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.prompt_ids) - 1:-1].float() / temperature
        lp_t = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.completion_ids, dtype=torch.long)[:, None])[:, 0]
        want = lp_t.numpy() - r.full_logprobs
        # The engine's forward and transformers' agree to float32 round-off (~1e-5 in log-probs).
        np.testing.assert_allclose(got, want, atol=1e-4)
        kl.append(-want)
    assert res.metrics["reverse_kl"] == pytest.approx(np.concatenate(kl).mean(), abs=1e-4)
    assert res.metrics["reverse_kl"] > 0.1  # a random teacher is far from the trained student
    assert res.metrics["time_s"] > 0


@pytest.mark.slow
def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, teacher, default_model):
    from tokenizers import Tokenizer

    path, _, _ = teacher
    other = tmp_path / "other"
    tiny_teacher(other, default_model)
    tj = Tokenizer.from_file(str(other / "tokenizer.json"))
    tj.add_tokens(["<tool>"])
    tj.save(str(other / "tokenizer.json"))
    with pytest.raises(TokenizerMismatch, match=r"different tokenizer .* only the teacher's: \['<tool>'\]"):
        check_same_tokenizer(default_model, str(other))
    check_same_tokenizer(default_model, path)  # the same tokenizer passes
    cfg = small_config("--scorer.teacher.model", str(other), "--algorithm.advantage", "reinforce_pp")
    with pytest.raises(TokenizerMismatch, match="same tokenizer family"):
        train(cfg, tmp_path / "run")


@pytest.mark.slow
def test_async_distillation_matches_the_synchronous_loop(tmp_path, teacher, default_model):
    path, _, _ = teacher
    cfg = small_config("--rollout.max_staleness", "0", "--run.steps", "3", "--run.checkpoint_every", "0",
                       "--scorer.teacher.model", path, "--scorer.teacher.distill_coef", "0.5",
                       "--algorithm.advantage", "reinforce_pp", "--algorithm.gamma", "0")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 3
    rows = step_rows(tmp_path / "run")
    reference = run_sync_loop(cfg, default_model)
    assert len(rows) == len(reference) == 3
    for got, want in zip(rows, reference):
        for key in ("loss/total", "loss/policy", "reward/mean", "scorer/teacher/reverse_kl", "reward/token_sum_mean"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), key
        assert got["scorer/teacher/reverse_kl"] > 0.1
        assert got["scorer/teacher/time_s"] > 0
