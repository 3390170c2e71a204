"""Rollout.routed_experts crosses what rollouts cross: a process boundary and a checkpoint."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

from tokenflow.buffer import RolloutBuffer
from tokenflow.rollout import Rollout
from tokenflow.runtime.run.run_dir import RunDir


def moe_group(gid: int, n: int = 2) -> list[Rollout]:
    rng = np.random.default_rng(gid)
    out = []
    for i in range(n):
        routing = rng.integers(0, 200, (3 + 4 - 1, 5, 2)).astype(np.uint8)
        out.append(Rollout(prompt_ids=[1, 2, 3], completion_ids=[5, 6, 7, 8], logprobs=[0.0] * 4,
                           versions=[0] * 4, group_id=gid, prompt_id=gid, sample_index=i, reward=1.0,
                           routed_experts=routing))
    return out


def _echo(inbox, outbox) -> None:
    outbox.put(inbox.get())


def test_routing_crosses_processes_and_checkpoints(tmp_path):
    sent = moe_group(7)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_echo, args=(inbox, outbox), daemon=True)
    proc.start()
    inbox.put(sent)
    back = outbox.get(timeout=60)
    proc.join(timeout=30)
    for a, b in zip(sent, back):
        assert b.routed_experts.dtype == np.uint8 and np.array_equal(a.routed_experts, b.routed_experts)

    buf = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0)
    buf.admit(7, 7)
    buf.put(sent)
    run = RunDir(tmp_path).create()
    path = run.commit_checkpoint(run.staging_dir(1), 1, {"step": 1, "cursor": 0, "next_group_id": 0},
                                buf.state_dict(), keep=1)
    _, state = RunDir.load_checkpoint(path)
    restored = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0)
    restored.load_state_dict(state)
    for a, b in zip(sent, restored.ready[7]):
        assert np.array_equal(a.routed_experts, b.routed_experts)
