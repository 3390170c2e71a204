"""Keep Routing: the trainer replays the experts the engine recorded, and the router still learns."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from tests.engine.engine_testlib import randomize
from tests.engine.moe_testlib import experts_used, moe_hf_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.engine import Engine, EngineConfig, SamplingParams
from tokenflow.rollout import Rollout
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.batch import collate, to_train_sequence
from tokenflow.trainer.keep_routing import RoutingReplay, find_routers

log = logging.getLogger(__name__)


def wide_router_model(seed: int = 0):
    """16 experts, top-4: many near-ties for bfloat16 to break differently from float32."""
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=16, num_experts=16,
                         num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=128,
                         tie_word_embeddings=False)
    return randomize(AutoModelForCausalLM.from_config(cfg).eval(), seed)


def engine_rollouts(hf, dtype: str, n_prompts: int = 4, n: int = 4, max_tokens: int = 24) -> list[Rollout]:
    engine = Engine.from_config(hf.config, hf.state_dict(), EngineConfig(device="cpu", dtype=dtype))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (8,), generator=gen).tolist() for _ in range(n_prompts)]
    groups = engine.generate(prompts, SamplingParams(temperature=1.0, n=n, max_tokens=max_tokens,
                                                     ignore_eos=True, seed=2))
    rollouts = [r for g in groups for r in g]
    for i, r in enumerate(rollouts):
        r.group_id, r.reward = i // n, float(i % 2)
    return rollouts


def test_replay_makes_trainer_experts_the_engines_and_shrinks_the_mismatch():
    hf = wide_router_model()
    rollouts = engine_rollouts(hf, "bfloat16")  # engine bfloat16, trainer float32: ties break apart
    metrics, first_own = {}, {}
    for keep in (False, True):
        trainer = Trainer(copy.deepcopy(hf), TrainerConfig(device="cpu", lr=0.0, keep_routing=keep, routing_probe=True),
                          AlgorithmConfig())
        used = [experts_used(trainer, r) for r in rollouts]
        same = [np.array_equal(np.sort(u, -1), np.sort(r.routed_experts.astype(np.int64), -1))
                for u, r in zip(used, rollouts)]
        assert all(same) if keep else not all(same)
        # The first sparse layer's own top-k sets (ahead of the replay's hook), in every forward of
        # the step (the probe's too).
        seen = first_own[keep] = []
        hook = find_routers(trainer.model)[0].register_forward_hook(
            lambda _m, _args, out, seen=seen: seen.append(out[2].sort(-1).values.clone()), prepend=True)
        metrics[keep] = trainer.train_step(rollouts)
        hook.remove()
    off, on = metrics[False], metrics[True]
    print(f"router disagreement {off['routing/disagreement']:.4f} "
          f"({off['routing/disagreement'] * 100:.2f}% of token-layer top-k sets); "
          f"|log-prob mismatch| without replay {off['offpolicy/mismatch_abs_logprob']:.5f}, "
          f"with replay {on['offpolicy/mismatch_abs_logprob']:.5f}")
    # The trainer's own routers disagree either way. Replay changes what is used, and so what the
    # later layers' routers see, but not the first one's input: its own choices are the same.
    assert off["routing/disagreement"] > 0 and on["routing/disagreement"] > 0
    assert len(first_own[False]) == len(first_own[True]) > 0
    assert all(torch.equal(a, b) for a, b in zip(first_own[False], first_own[True]))
    assert on["offpolicy/mismatch_abs_logprob"] < off["offpolicy/mismatch_abs_logprob"]
    # The probe scores the other routing in the same step: each run's probe is the other's mismatch
    # (same float32 forward, so equal up to summation order).
    assert on["offpolicy/mismatch_abs_logprob_unreplayed"] == pytest.approx(off["offpolicy/mismatch_abs_logprob"], abs=1e-6)
    assert off["offpolicy/mismatch_abs_logprob_replayed"] == pytest.approx(on["offpolicy/mismatch_abs_logprob"], abs=1e-6)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])  # unnormalised and renormalised top-k
def test_replaying_the_trainers_own_routing_changes_nothing(family):
    hf = moe_hf_model(family, seed=3)
    rollouts = engine_rollouts(hf, "float32", n_prompts=2, n=2, max_tokens=10)
    logps = {}
    for keep in (False, True):
        trainer = Trainer(copy.deepcopy(hf), TrainerConfig(device="cpu", keep_routing=keep), AlgorithmConfig())
        logps[keep] = np.concatenate(trainer.logprobs(rollouts))
    # float32 throughout, same routing: only the weights' arithmetic path differs.
    assert np.abs(logps[True] - logps[False]).max() <= 1e-5


def random_routing(r_len: int, layers: int, experts: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((r_len, layers, experts)), -1)[..., :k].astype(np.uint8)


def test_router_gradient_under_replay_matches_finite_differences():
    # float64 for a clean finite difference (the grouped-matmul experts take no float64)
    model = moe_hf_model("qwen2_moe", seed=2, experts_implementation="eager").double()
    routers = find_routers(model)
    replay = RoutingReplay(model, replay=True)
    rng = np.random.default_rng(0)
    prompt, completion = rng.integers(3, 128, 6), rng.integers(3, 128, 9)
    cfg = model.config
    r = Rollout(prompt_ids=prompt, completion_ids=completion, logprobs=np.zeros(9), versions=np.zeros(9),
                routed_experts=random_routing(14, len(routers), cfg.num_experts, cfg.num_experts_per_tok, 1))
    mb = collate([to_train_sequence(0, r, 0, keep_sampling_mask=False, max_token_age=None)])

    def loss() -> torch.Tensor:
        """Σ log π(target) in float64 (the trainer's log-prob path rounds to float32)."""
        with replay.replaying(mb.routing, mb.routing_has):
            logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids).logits
        return torch.log_softmax(logits.reshape(-1, logits.shape[-1])[mb.target_pos], -1).gather(
            -1, mb.targets[:, None]).sum()

    weight = routers[1].weight  # the second sparse layer's router
    total = loss()
    total.backward()
    grad = weight.grad.clone()
    assert grad.abs().max() > 1e-2
    # transformers' RMSNorm runs in float32 even in a float64 model, so the loss carries
    # round-off ~|L|·2⁻²⁴; a central difference over ±eps then errs by ~|L|·2⁻²⁴/eps (plus
    # O(eps²) truncation), checked on the entries with the largest gradient.
    eps = 1e-3
    tol = abs(total.item()) * 2.0**-24 / eps
    for flat in grad.abs().flatten().argsort(descending=True)[:3].tolist():
        idx = divmod(flat, grad.shape[1])
        with torch.no_grad():
            weight[idx] += eps
            up = loss().item()
            weight[idx] -= 2 * eps
            down = loss().item()
            weight[idx] += eps
        fd = (up - down) / (2 * eps)
        assert abs(fd - grad[idx].item()) <= tol + 1e-2 * abs(fd), (idx, fd, grad[idx].item(), tol)


def test_refusals_name_the_problem():
    from tests.trainer.trainer_testlib import tiny_model

    with pytest.raises(ValueError, match="no mixture-of-experts routers"):
        Trainer(tiny_model(), TrainerConfig(device="cpu", keep_routing=True), AlgorithmConfig())
    hf = moe_hf_model("qwen3_moe", seed=1)
    trainer = Trainer(hf, TrainerConfig(device="cpu", keep_routing=True), AlgorithmConfig())
    r = Rollout(prompt_ids=[5, 6, 7], completion_ids=[8, 9], logprobs=np.zeros(2), versions=np.zeros(2),
                routed_experts=np.zeros((4, 3, 2), dtype=np.uint8))  # 3 sparse layers: another model
    with pytest.raises(ValueError, match="another model"):
        trainer.logprobs([r])
    other = moe_hf_model("qwen3_moe", seed=1)
    router = find_routers(other)[0]
    router.__class__ = type("SigmoidGroupedRouter", (type(router),), {})  # a family scoring otherwise
    with pytest.raises(ValueError, match="cannot replay SigmoidGroupedRouter"):
        Trainer(other, TrainerConfig(device="cpu", keep_routing=True), AlgorithmConfig())
    with pytest.raises(ValueError, match="one row per input token"):
        Rollout(prompt_ids=[5, 6, 7], completion_ids=[8, 9], logprobs=np.zeros(2), versions=np.zeros(2),
                routed_experts=np.zeros((5, 2, 2), dtype=np.uint8))


def test_micro_batches_lay_routing_out_as_the_routers_see_tokens():
    from tests.trainer.trainer_testlib import make_rollouts
    from tokenflow.trainer.batch import micro_batches

    rollouts = make_rollouts(seed=3, groups=3)
    for i, r in enumerate(rollouts):
        if i % 4 != 3:  # some rollouts carry no record: their tokens route themselves
            r.routed_experts = random_routing(len(r.prompt_ids) + r.num_tokens - 1, 2, 8, 2, i)
    seqs = [to_train_sequence(i, r, 0, keep_sampling_mask=False, max_token_age=None) for i, r in enumerate(rollouts)]
    mbs = micro_batches(seqs, budget=64, row_tokens=24)
    assert max(mb.num_rows for mb in mbs) > 1
    for mb in mbs:
        width = mb.input_ids.shape[1]
        seen = np.zeros(mb.routing_has.shape, dtype=bool)
        # Each sequence's first target sits at (its start + prompt_len − 1) in the flat layout.
        flat_ids = mb.input_ids.reshape(-1).numpy()
        for s in mb.seqs:
            n = len(s.input_ids)
            start = int(mb.target_pos[mb.seq_index == mb.seqs.index(s)][0]) - (s.prompt_len - 1)
            assert np.array_equal(flat_ids[start:start + n], s.input_ids)
            if s.routing is not None:
                assert np.array_equal(mb.routing[start:start + n].numpy(), s.routing)
                seen[start:start + n] = True
        assert np.array_equal(mb.routing_has.numpy(), seen)
        assert width * mb.num_rows == len(seen)
