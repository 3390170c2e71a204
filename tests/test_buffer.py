"""RolloutBuffer: admission bound, consumption order, ages, checkpoint state."""

from __future__ import annotations

import numpy as np
import pytest

from tokenflow.buffer import DynamicSampling, RolloutBuffer
from tokenflow.rollout import Rollout


def group(gid: int, versions: list[int], n: int = 2) -> list[Rollout]:
    return [Rollout(prompt_ids=[1], completion_ids=[5] * len(versions), logprobs=[0.0] * len(versions),
                    versions=versions, group_id=gid, prompt_id=gid, sample_index=i, reward=1.0)
            for i in range(n)]


def admit_all(buf: RolloutBuffer, start: int = 0) -> list[int]:
    gids = []
    gid = start
    while buf.can_admit():
        buf.admit(gid, gid)
        gids.append(gid)
        gid += 1
    return gids


@pytest.mark.parametrize("k", [0, 1, 3])
def test_admission_holds_at_most_k_plus_one_steps(k):
    buf = RolloutBuffer(prompts_per_step=3, group_size=2, max_staleness=k)
    gids = admit_all(buf)
    assert len(gids) * 2 == (k + 1) * 3 * 2
    with pytest.raises(RuntimeError):
        buf.admit(99, 99)
    # Consuming a step frees nothing until the new weights reach the engine.
    for gid in gids[:3]:
        buf.put(group(gid, [0, 0]))
    assert buf.take_batch(trainer_version=0) is not None
    assert not buf.can_admit()
    buf.set_engine_version(1)
    assert len(admit_all(buf, start=100)) == 3


def test_synchronous_budget_waits_for_every_group_of_the_step():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=0)
    assert admit_all(buf) == [0, 1]
    buf.put(group(1, [0]))
    assert buf.take_batch(0) is None  # group 0 still generating
    buf.put(group(0, [0]))
    batch = buf.take_batch(0)
    assert [g[0].group_id for g in batch] == [0, 1]  # oldest admission first


def test_batch_takes_oldest_ready_groups_and_records_token_ages():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=2, max_token_age=1, batch_order="ready")
    admit_all(buf)
    buf.put(group(3, [0, 0, 1]))
    buf.put(group(1, [0, 1]))
    buf.put(group(2, [1, 1]))
    batch = buf.take_batch(trainer_version=2)
    assert [g[0].group_id for g in batch] == [1, 2]
    assert buf.num_ready == 1
    # ages at version 2: group 1 tokens 2,1 (x2 samples); group 2 tokens 1,1 (x2)
    assert dict(buf.stats.age_histogram) == {2: 2, 1: 6}
    assert buf.stats.tokens_rejected == 2  # the age-2 tokens exceed max_token_age = 1
    m = buf.metrics()
    assert m["buffer/token_age_max"] == 2.0
    assert m["buffer/token_age_mean"] == pytest.approx((2 * 2 + 1 * 6) / 8)


def test_admission_order_waits_for_the_oldest_groups_so_no_token_is_older_than_k():
    k = 2
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=k, batch_order="admission")
    assert admit_all(buf) == [0, 1, 2, 3, 4, 5]
    for gid in (1, 2, 3, 4, 5):  # group 0 is the straggler
        buf.put(group(gid, [0]))
    assert buf.take_batch(0, now=10.0) is None  # younger groups do not overtake it
    buf.put(group(0, [0, 0]))
    assert [g[0].group_id for g in buf.take_batch(0, now=12.5)] == [0, 1]
    assert buf.stats.batch_wait_s == pytest.approx(2.5)
    assert [g[0].group_id for g in buf.take_batch(1)] == [2, 3]
    # Each step's batch is the step's own admission slot: group g goes to step g // 2 at the
    # latest version its admission allowed, so its tokens are at most K versions old.
    buf.set_engine_version(1)
    assert admit_all(buf, start=6) == [6, 7]
    buf.put(group(7, [1]))
    assert [g[0].group_id for g in buf.take_batch(2)] == [4, 5]
    assert buf.take_batch(3) is None
    buf.put(group(6, [1]))
    assert [g[0].group_id for g in buf.take_batch(3)] == [6, 7]
    assert max(buf.stats.age_histogram) <= k


def test_ready_order_lets_younger_groups_overtake_a_straggler():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=1, batch_order="ready")
    admit_all(buf)
    buf.put(group(1, [0]))
    buf.put(group(2, [0]))
    assert [g[0].group_id for g in buf.take_batch(0)] == [1, 2]


def test_unknown_batch_order_is_refused():
    with pytest.raises(ValueError, match="batch_order"):
        RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0, batch_order="fifo")


def test_put_refuses_unknown_groups():
    buf = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0)
    with pytest.raises(KeyError):
        buf.put(group(5, [0]))


def test_state_round_trip_keeps_in_flight_and_ready():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=1)
    admit_all(buf)
    buf.put(group(2, [0]))
    state = buf.state_dict()
    other = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=1)
    other.load_state_dict(state)
    assert list(other.in_flight.items()) == list(buf.in_flight.items())
    assert set(other.ready) == {2}
    assert np.array_equal(other.ready[2][0].versions, buf.ready[2][0].versions)
    assert other.capacity() == buf.capacity()


def scored(gid: int, rewards: list[float | None]) -> list[Rollout]:
    """A group of len(rewards) samples; None marks a failed sample."""
    return [Rollout(prompt_ids=[1], completion_ids=[5], logprobs=[0.0], versions=[0], group_id=gid,
                    prompt_id=gid, sample_index=i, reward=r, failed=r is None) for i, r in enumerate(rewards)]


def test_dynamic_sampling_drops_equal_reward_groups_and_admission_refills_them():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(10))
    assert admit_all(buf) == [0, 1]
    assert buf.put(scored(0, [1.0, 1.0])) is False  # equal rewards: dropped
    assert buf.put(scored(1, [0.0, 1.0])) is True
    assert 0 not in buf.in_flight and buf.num_ready == 1
    assert admit_all(buf, start=2) == [2]  # the dropped group's slot, and only it
    assert buf.take_batch(0) is None
    assert buf.put(scored(2, [0.0, None])) is False  # one scored sample: no baseline, advantage 0
    assert admit_all(buf, start=3) == [3]
    assert buf.put(scored(3, [None, None])) is True  # every sample failed: kept (the run must see it)
    batch = buf.take_batch(0)
    assert [g[0].group_id for g in batch] == [1, 3]
    assert buf.last_batch_dropped == 2
    assert buf.metrics()["buffer/groups_dropped"] == 2.0
    # The step is whole again; the next slots open only with the next weights.
    assert not buf.can_admit()
    buf.set_engine_version(1)
    assert admit_all(buf, start=4) == [4, 5]


def test_dynamic_sampling_cap_keeps_flat_groups_and_warns_once(caplog):
    buf = RolloutBuffer(prompts_per_step=1, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(3))
    gid = 0
    for _ in range(3):
        admit_all(buf, start=gid)
        assert buf.put(scored(gid, [0.0, 0.0])) is False
        gid += 1
    admit_all(buf, start=gid)
    assert buf.put(scored(gid, [0.0, 0.0])) is True  # past the cap: kept
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "dynamic_sampling_max_batches" in caplog.records[0].getMessage()
    assert buf.take_batch(0)[0][0].group_id == gid and buf.last_batch_dropped == 3
    assert buf.metrics()["buffer/flat_groups_kept"] == 1.0
    # The count starts again with the next batch.
    buf.set_engine_version(1)
    admit_all(buf, start=10)
    assert buf.put(scored(10, [1.0, 1.0])) is False
    assert len(caplog.records) == 1


def test_dynamic_sampling_counters_survive_a_checkpoint():
    buf = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(5))
    admit_all(buf)
    buf.put(scored(0, [1.0, 1.0]))
    other = RolloutBuffer(prompts_per_step=2, group_size=2, max_staleness=0, dynamic_sampling=DynamicSampling(5))
    other.load_state_dict(buf.state_dict())
    assert other.stats.groups_dropped == 1 and other.capacity() == buf.capacity() == 2
