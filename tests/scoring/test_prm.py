"""Process reward model scoring with tiny PRMs built here (random weights, the shipped tokenizer):
each step is scored at its last token, the score lands on every token of the step, and the
advantages are per token. Expected scores come from running the Hugging Face model on each
sequence alone, unpadded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.scoring.scoring_testlib import wait_scored
from tokenflow.algorithms.advantages import compute_advantages
from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.rollout import Rollout
from tokenflow.scoring.pool import ScorerPool
from tokenflow.scoring.prm import ProcessRewardScorer, step_ends
from tokenflow.scoring.stage import ScoringStage
from tokenflow.scoring.token_scorer_protocol import SampleView
from tokenflow.scoring.token_scorer_specs import TokenScorerSpec

pytestmark = pytest.mark.timeout(180)
COMPLETIONS = ["7+5=12,4+8+1=13>132", "3+4=7>7", "9+9=18,1+0=1,0+2=2>218"]


def tiny_prm(path, default_model, kind: str):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    tok = AutoTokenizer.from_pretrained(default_model)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, num_labels=1)
    torch.manual_seed(3)
    model = LlamaForTokenClassification(cfg) if kind == "token_classification" else LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval(), tok


def rollouts(tok) -> list[Rollout]:
    out = []
    for i, text in enumerate(COMPLETIONS):
        ids = tok.encode(text, add_special_tokens=False)
        out.append(Rollout(prompt_ids=[tok.bos_token_id] + tok.encode("12+3=", add_special_tokens=False),
                           completion_ids=ids, logprobs=np.full(len(ids), -0.3), versions=[0] * len(ids),
                           text=text, sample_index=i, group_id=0))
    return out


def expected_step_scores(model, tok, r: Rollout, kind: str) -> tuple[list[int], list[float]]:
    ends = step_ends(r.completion_ids, tok.encode(",", add_special_tokens=False)[0])
    ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    at = logits[[len(r.prompt_ids) + e for e in ends]]
    if kind == "causal":
        good, bad = (tok.encode(t, add_special_tokens=False)[0] for t in "+-")
        scores = torch.softmax(at[:, [good, bad]], -1)[:, 0]
    else:
        scores = torch.sigmoid(at[:, 0])
    return ends, scores.tolist()


@pytest.mark.parametrize("kind", ["token_classification", "causal"])
@pytest.mark.slow
def test_each_step_score_lands_on_its_tokens(tmp_path, default_model, kind):
    model, tok = tiny_prm(tmp_path / "prm", default_model, kind)
    scorer = ProcessRewardScorer(str(tmp_path / "prm"), kind=kind, separator=",")
    group = rollouts(tok)
    res = scorer.score("12+3=", [SampleView.of(r) for r in group], {})
    for r, got in zip(group, res.rewards):
        ends, scores = expected_step_scores(model, tok, r, kind)
        assert len(ends) == r.completion_ids.tolist().count(tok.convert_tokens_to_ids(",")) + 1
        begin = 0
        for end, s in zip(ends, scores):
            np.testing.assert_allclose(got[begin:end + 1], s, rtol=1e-5)
            begin = end + 1
        assert begin == r.num_tokens
    assert res.metrics["steps_per_sample"] == pytest.approx((2 + 1 + 3) / 3)


@pytest.mark.slow
def test_prm_in_its_worker_gives_per_token_advantages(tmp_path, default_model):
    model, tok = tiny_prm(tmp_path / "prm", default_model, "token_classification")
    reward = tmp_path / "zero.py"
    reward.write_text("def zero(prompt, completion, example):\n    return 0.0\n")
    spec = TokenScorerSpec("prm", "prm", 2.0, {"model": str(tmp_path / "prm"), "separator": ","})
    stage = ScoringStage(ScorerPool(f"{reward}:zero", workers=1, timeout_s=30.0), [spec], timeout_s=30.0)
    try:
        stage.submit(rollouts(tok), "12+3=", {}, group_id=0)
        (group, _), = wait_scored(stage, timeout_s=120)
    finally:
        stage.close()
    per_token = []
    for r in group:
        ends, scores = expected_step_scores(model, tok, r, "token_classification")
        want = np.zeros(r.num_tokens)
        begin = 0
        for end, s in zip(ends, scores):
            want[begin:end + 1] = 2.0 * s
            begin = end + 1
        np.testing.assert_allclose(r.token_rewards, want, rtol=1e-5)
        assert 0 < r.info["scorer"]["prm/time_s"]
        per_token.append(want)
    # γ = 0: each token's advantage is its own step's score, whitened over the batch's tokens.
    cfg = AlgorithmConfig(advantage="reinforce_pp", gamma=0.0)
    adv = compute_advantages(group, cfg).advantages
    flat = np.concatenate(per_token)
    for a, w in zip(adv, per_token):
        np.testing.assert_allclose(a, (w - flat.mean()) / (flat.std() + cfg.eps), rtol=1e-4, atol=1e-5)
    # Tokens of one step share an advantage; different steps differ.
    first = group[0]
    ends = step_ends(first.completion_ids, tok.convert_tokens_to_ids(","))
    assert np.ptp(adv[0][: ends[0] + 1]) < 1e-6
    assert abs(adv[0][0] - adv[0][ends[0] + 1]) > 1e-4


def test_a_multi_token_separator_is_refused(tmp_path, default_model):
    tiny_prm(tmp_path / "prm", default_model, "token_classification")
    with pytest.raises(ValueError, match="separator '12' is 2 tokens"):
        ProcessRewardScorer(str(tmp_path / "prm"), separator="12")
