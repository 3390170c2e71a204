"""Weights for sync, resumable state, and Hugging Face export."""

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

CFG = TrainerConfig(device="cpu", lr=1e-3, warmup_steps=2, schedule="cosine", total_steps=10)


def test_named_weights_are_the_hf_state_dict_names_on_cpu():
    model = tiny_model(tie=True)
    tr = Trainer(model, TrainerConfig(device="cpu", value_head=True), AlgorithmConfig(advantage="gae"))
    weights = dict(tr.named_weights())
    assert list(weights) == list(model.state_dict())
    assert all(w.device.type == "cpu" and not w.requires_grad for w in weights.values())


def test_state_dict_resumes_exactly():
    rollouts = on_policy(tiny_model(seed=1), make_rollouts(seed=3))
    a = Trainer(tiny_model(seed=1), CFG, AlgorithmConfig())
    a.train_step(rollouts)
    state = torch.load(_roundtrip(a.state_dict()), weights_only=False)  # a deep copy
    m_a = a.train_step(rollouts)
    b = Trainer(tiny_model(seed=99), CFG, AlgorithmConfig())
    b.load_state_dict(state)
    assert b.version == 1
    m_b = b.train_step(rollouts)
    assert m_b["optim/lr"] == m_a["optim/lr"] and m_b["loss/total"] == m_a["loss/total"]
    for (n, wa), (_, wb) in zip(a.named_weights(), b.named_weights()):
        assert torch.equal(wa, wb), n


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


class _Tok:
    def save_pretrained(self, d):
        (d / "tokenizer_config.json").write_text("{}")


def test_save_pretrained_loads_back_and_trains_from_a_path(tmp_path):
    tr = Trainer(tiny_model(seed=2), CFG, AlgorithmConfig(), tokenizer=_Tok())
    tr.train_step(on_policy(tr.model, make_rollouts(seed=4)))
    out = tr.save_pretrained(tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for n, w in tr.named_weights():
        assert torch.equal(loaded.state_dict()[n], w), n
    # The export is also a valid starting point for a new trainer.
    again = Trainer(str(out), TrainerConfig(device="cpu"), AlgorithmConfig())
    rs = make_rollouts(seed=5, groups=1)
    np.testing.assert_allclose(np.concatenate(again.logprobs(rs)), np.concatenate(tr.logprobs(rs)), atol=1e-6)


def test_placed_weights_train_save_and_resume_like_unplaced_ones(tmp_path):
    from tokenflow.sync.layout import in_place_bytes, plan_layout

    rollouts = on_policy(tiny_model(seed=5), make_rollouts(seed=6))
    plain = Trainer(tiny_model(seed=5), CFG, AlgorithmConfig(), tokenizer=_Tok())
    placed = Trainer(tiny_model(seed=5), CFG, AlgorithmConfig(), tokenizer=_Tok())
    layout = plan_layout(placed.named_weights(), bucket_bytes=8192)
    assert placed.place_weights(layout) == len(layout.slots)
    for _ in range(2):
        m_plain, m_placed = plain.train_step(rollouts), placed.train_step(rollouts)
        assert m_placed["loss/total"] == m_plain["loss/total"]
    for (n, a), (_, b) in zip(plain.named_weights(), placed.named_weights()):
        assert torch.equal(a, b), n
    # The optimizer updated the weights where they were placed: each bucket is still one buffer.
    named = dict(placed.named_weights())
    for bucket in range(len(layout.bucket_sizes)):
        assert in_place_bytes(layout, bucket, [named[s.name] for s in layout.slots if s.bucket == bucket]) is not None
    # Checkpoints and exports of placed weights resume exactly.
    state = torch.load(_roundtrip(placed.state_dict()), weights_only=False)
    again = Trainer(tiny_model(seed=9), CFG, AlgorithmConfig())
    again.load_state_dict(state)
    assert again.train_step(rollouts)["loss/total"] == placed.train_step(rollouts)["loss/total"]
    loaded = AutoModelForCausalLM.from_pretrained(placed.save_pretrained(tmp_path / "export"))
    for n, w in placed.named_weights():
        assert torch.equal(loaded.state_dict()[n], w), n


def test_tied_weights_stay_tied_when_placed():
    from tokenflow.sync.layout import plan_layout

    tr = Trainer(tiny_model(seed=5, tie=True), CFG, AlgorithmConfig())
    layout = plan_layout(tr.named_weights(), bucket_bytes=8192)
    assert tr.place_weights(layout) == len(layout.slots) - 1  # one tensor under two names
    tr.train_step(on_policy(tr.model, make_rollouts(seed=6)))
    assert tr.model.get_output_embeddings().weight is tr.model.get_input_embeddings().weight
