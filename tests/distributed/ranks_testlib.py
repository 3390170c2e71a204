"""Rank bodies for the distributed tests (spawned processes import them by name)."""

from __future__ import annotations

import numpy as np
import torch

from tests.engine.moe_testlib import moe_hf_model
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import TrainerConfig

# (algorithm, trainer) settings compared between 2 FSDP ranks and one plain trainer.
CASES = {
    "grpo_tied": ({}, {"lr": 1e-3, "grad_clip": 0.5, "micro_batch_tokens": 40}, True),
    "gae_decoupled_kl": ({"advantage": "gae", "objective": "decoupled", "kl_coef": 0.05, "entropy_coef": 0.01,
                              "aggregation": "seq_mean_token_mean"},
                         {"lr": 1e-3, "value_head": True, "micro_batch_tokens": 64}, False),
    # A mixture-of-experts policy replaying recorded routing (random expert sets, far from its own).
    # Its gradients are large (norm ~100), and Adam turns float32 summation-order noise in a
    # small gradient entry into up to lr × that relative error: a smaller lr keeps the weight
    # comparison at the same 1e-5.
    "moe_keep_routing": ({}, {"lr": 1e-4, "keep_routing": True, "micro_batch_tokens": 64,
                                 "pack_row_tokens": 24}, "moe"),
    # Groups 0 and 2 got equal rewards: their sequences are skipped (zero advantage) before the
    # ranks split the rest.
    "grpo_flat_groups": ({}, {"lr": 1e-3, "micro_batch_tokens": 40}, "flat"),
    # Each group's samples share their prompt: the ranks split groups, and each rank's rows hold
    # its share of a group's samples after one copy of the prompt.
    "grpo_shared_prompts": ({}, {"lr": 1e-3, "micro_batch_tokens": 40}, "shared"),
    # PPO mini-batches: 2 × 2 optimizer steps per batch, π_prox from the first forward and a pass.
    "ppo_mini_batches": ({"clip_low": 0.1, "clip_high": 0.1}, {"lr": 1e-2, "micro_batch_tokens": 40,
                                                              "mini_batches": 2, "epochs": 2}, False),
}
STEPS = 2


def build(case: str):
    algo, trainer, tie = CASES[case]
    if tie == "moe":
        model = moe_hf_model("qwen3_moe", seed=4)
        rollouts = with_routing(on_policy(moe_hf_model("qwen3_moe", seed=4), make_rollouts(seed=9, groups=4)),
                                model.config)
    else:
        model = tiny_model(seed=4, tie=tie is True)
        rollouts = on_policy(tiny_model(seed=4, tie=tie is True),
                             make_rollouts(seed=9, groups=4, same_prompt=tie == "shared"))
        for r in rollouts:
            if tie == "flat" and r.group_id in (0, 2):
                r.reward = 1.0
    return model, TrainerConfig(device="cpu", **trainer), AlgorithmConfig(**algo), rollouts


def with_routing(rollouts, config):
    """Give each rollout a recorded routing: k distinct random experts per token and sparse layer."""
    rng = np.random.default_rng(5)
    layers = sum(1 for i in range(config.num_hidden_layers) if i not in config.mlp_only_layers)
    for r in rollouts:
        n = len(r.prompt_ids) + r.num_tokens - 1
        order = np.argsort(rng.random((n, layers, config.num_experts)), -1)
        r.routed_experts = order[..., :config.num_experts_per_tok].astype(np.uint8)
    return rollouts


def fsdp_rank(rank: int, world: int, port: int, out) -> None:
    from tokenflow.trainer.distributed import RankGroup, Rendezvous
    from tokenflow.trainer.fsdp import FSDPTrainer

    torch.set_num_threads(1)
    group = RankGroup(Rendezvous("127.0.0.1", port, world, timeout_s=60), rank)
    results = {}
    for case in CASES:
        model, tcfg, algo, rollouts = build(case)
        trainer = FSDPTrainer(model, tcfg, algo, group=group)
        metrics = [trainer.train_step(rollouts) for _ in range(STEPS)]
        # NumPy, not tensors: torch shares tensors through this process, which is about to exit.
        weights = {k: v.numpy() for k, v in trainer.named_weights()}
        results[case] = (metrics, weights)
    if rank == 0:
        out.put(results)
    group.close()


def silent_rank(rank: int, world: int, port: int, joined) -> None:
    """Joins the group, then never reaches a barrier."""
    import time

    from tokenflow.trainer.distributed import RankGroup, Rendezvous

    RankGroup(Rendezvous("127.0.0.1", port, world, timeout_s=30), rank)
    joined.set()
    time.sleep(30)
