"""The simulator runs the training loop's own rules, not copies of them: the buffer's admission
rule (``tokenflow.buffer.admission_capacity``) and the ``sync.every`` check and cadence
(``tokenflow.config.sync``)."""

from __future__ import annotations

import random

import pytest
import simpy

from tokenflow.buffer import RolloutBuffer
from tokenflow.config.sim import WorkloadConfig
from tokenflow.config.sync import sync_due
from tokenflow.sim import ConfigError, load_config
from tokenflow.sim.buffer import SimBuffer
from tokenflow.sim.workload import LengthSampler


def scripted_versions(seed: int, steps: int) -> list[int]:
    """Engine versions as the engines load them: mostly one at a time, sometimes a jump (an
    engine that missed a push, ``sync.every > 1``), sometimes a repeat (a late notice)."""
    rng, v, out = random.Random(seed), 0, []
    for _ in range(steps):
        v += rng.choice([0, 1, 1, 1, 2, 3])
        out.append(v)
    return out


def admitted_after_each(prompts_per_step: int, group_size: int, max_staleness: int,
                        versions: list[int]) -> tuple[list[int], list[int]]:
    """Groups admitted in all, after the start and after each engine version, by the real buffer
    (the orchestrator's loop: admit while ``can_admit``) and by the simulator's buffer."""
    real = RolloutBuffer(prompts_per_step, group_size, max_staleness)
    gid = 0

    def fill() -> int:
        nonlocal gid
        while real.can_admit(now=0.0):
            real.admit(gid, gid)
            gid += 1
        return real.stats.groups_admitted

    env = simpy.Environment()
    workload = WorkloadConfig(prompts_per_step=prompts_per_step, group_size=group_size,
                              completion_median=10, completion_p90=10, max_tokens=10, prompt_length=4)
    sim = SimBuffer(env, rollouts_per_step=prompts_per_step * group_size, max_staleness=max_staleness,
                    group_size=group_size, max_groups=10**9, sampler=LengthSampler(workload, 0),
                    dispatch=lambda group: None)
    real_counts, sim_counts = [fill()], []
    sim.admit()
    sim_counts.append(sim.admitted)
    for v in versions:
        real.set_engine_version(v)
        real_counts.append(fill())
        sim.set_engine_version(v)
        sim_counts.append(sim.admitted)
    return real_counts, sim_counts


@pytest.mark.parametrize("prompts_per_step, group_size, max_staleness",
                         [(1, 1, 0), (4, 8, 0), (4, 8, 1), (3, 5, 2), (16, 4, 7)])
def test_the_simulator_admits_exactly_as_the_buffer(prompts_per_step, group_size, max_staleness):
    versions = scripted_versions(seed=prompts_per_step * 100 + max_staleness, steps=40)
    real, sim = admitted_after_each(prompts_per_step, group_size, max_staleness, versions)
    assert real == sim
    # The budget binds: (v + K + 1) × prompts_per_step groups once the engines run version v.
    assert real[-1] == (versions[-1] + max_staleness + 1) * prompts_per_step
    assert len(set(real)) > 10  # the script moved the budget many times


def test_sync_cadence_is_the_runtimes():
    assert [s for s in range(1, 10) if sync_due(s, 3)] == [3, 6, 9]
    assert [s for s in range(1, 11) if sync_due(s, 3, last_step=10)] == [3, 6, 9, 10]
    assert all(sync_due(s, 1) for s in range(1, 5))


def test_the_simulator_refuses_sync_every_as_the_training_config_does():
    from tokenflow.config.root import TrainConfig

    with pytest.raises(ValueError, match="sync.every = 3 needs rollout.max_staleness ≥ 2") as train:
        TrainConfig.model_validate({"sync": {"every": 3}, "rollout": {"max_staleness": 1}})
    with pytest.raises(ConfigError) as sim:
        load_config(preset="h100-7b-vllm", overrides={"sync.every": 3, "rollout.max_staleness": 1})
    problem = "sync.every = 3 needs rollout.max_staleness ≥ 2"
    assert problem in str(train.value) and problem in str(sim.value)
    # The simulator's own names are aliases of the same keys.
    with pytest.raises(ConfigError, match=problem):
        load_config(preset="h100-7b-vllm", overrides={"pipeline.sync_every": 3, "pipeline.max_staleness": 1})
